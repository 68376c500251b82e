#!/usr/bin/env bash
# Installs the Debian packages sluice's build, tests and demo need, when missing.
# Debian 12: g++ 12, CMake 3.25, Asio 1.22 (standalone), Catch2 2.13, zlib.
#   scripts/deps.sh          what the build and the demo need
#   scripts/deps.sh --test   and what the tests need: python3 (its tarfile writes the tar
#                            test archives and runs the fault-injecting HTTP server),
#                            clang and libFuzzer (the fuzz targets), nginx (HTTP tests)
set -euo pipefail
packages=(g++ make cmake libasio-dev catch2 zlib1g-dev libcurl4-openssl-dev ccache)
[ "${1:-}" = "--test" ] && packages+=(python3 clang libclang-rt-dev nginx)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "sluice: installing missing Debian packages: ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "sluice: run as root or install sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
