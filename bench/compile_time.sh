#!/usr/bin/env bash
# Compile time of a small user translation unit (issue 14, point 9).
#
#   bench/compile_time.sh [RUNS]            # default 3 runs per level, the median reported
#
# Compiles (-c, no link) a TU that includes <sluice/sluice.hpp> and runs README's first
# pipeline (list | plan | read | lines | shuffle | batch, iterated), with g++ -std=c++20 at
# -O0 and -O2, and prints user+sys CPU seconds and the compiler's max RSS for each level:
# CPU seconds rather than wall, since the machine's cores are shared with other work.
# Environment: CXX (default g++), SLUICE_INCLUDE (default this checkout's include/),
# EXTRA_FLAGS (added to every compile, e.g. "-include-pch ..." or "-DNDEBUG").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
cxx=${CXX:-g++}
inc=${SLUICE_INCLUDE:-$here/include}
if [[ ! -x /usr/bin/time ]]; then
  echo "compile_time.sh: needs /usr/bin/time (Debian: apt-get install time)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/tu.cpp" <<'EOF'
#include <sluice/sluice.hpp>

#include <cstdio>

int main() {
    auto batches = sluice::list("data/shard-{000000..000063}.txt")
                 | sluice::plan({.epochs = 2, .seed = 17})
                 | sluice::read()
                 | sluice::lines()
                 | sluice::shuffle({.buffer = 10'000, .seed = 17})
                 | sluice::batch({.size = 256, .drop_last = true});
    sluice::pipeline p(batches);
    std::size_t n = 0;
    for (auto& b : p) n += b.size();
    std::fprintf(stderr, "%zu batches\n%s", n, p.figures().table().c_str());
}
EOF

# The flags the CMake targets give a user: asio's (ASIO_NO_DEPRECATED; clang with
# libstdc++ also needs ASIO_HAS_CO_AWAIT=1), the include directory; asio, curl, pugixml,
# zlib and dlpack are found in /usr/include.
flags=(-std=c++20 -DASIO_NO_DEPRECATED -I"$inc")
[[ $("$cxx" --version) == *clang* ]] && flags+=(-DASIO_HAS_CO_AWAIT=1)
# shellcheck disable=SC2206
extra=(${EXTRA_FLAGS:-})

echo "# $("$cxx" --version | head -1); $runs runs per level, median; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for opt in -O0 -O2; do
  rows=()
  for ((i = 0; i < runs; i++)); do
    /usr/bin/time -f "%U %S %M" -o "$work/time" \
      "$cxx" "${flags[@]}" "${extra[@]}" "$opt" -c "$work/tu.cpp" -o "$work/tu.o"
    read -r u s m < "$work/time"
    rows+=("$(awk -v u="$u" -v s="$s" -v m="$m" 'BEGIN { printf "%.2f %.2f %.2f %d", u + s, u, s, m }')")
  done
  median=$(printf '%s\n' "${rows[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
  read -r cpu u s m <<< "$median"
  all=$(printf '%s\n' "${rows[@]}" | cut -d' ' -f1 | paste -sd' ')
  printf '%s  cpu %6.2f s (user %.2f + sys %.2f)  max RSS %4d MB  [runs: %s]\n' \
    "$opt" "$cpu" "$u" "$s" $((m / 1024)) "$all"
done
