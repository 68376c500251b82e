#!/usr/bin/env bash
# Builds and runs the whole test suite: the plain build, then AddressSanitizer with
# UndefinedBehaviorSanitizer, then ThreadSanitizer (CMakePresets.json). Name presets to run
# only those: scripts/test.sh default
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(default asan tsan)
jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "=== sluice tests: $preset ===" >&2
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j"$jobs"
  ctest --preset "$preset" -j"$jobs" --timeout 900
done
