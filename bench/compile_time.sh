#!/usr/bin/env bash
# Compile time of a small user translation unit (issue 14, point 9).
#
#   bench/compile_time.sh [RUNS]            # default 3 runs per level, the median reported
#
# Compiles (-c, no link) a TU that includes <sluice/sluice.hpp> and runs README's first
# pipeline (list | plan | read | lines | shuffle | batch, iterated), with g++ -std=c++20 at
# -O0 and -O2, and prints user+sys CPU seconds and the compiler's max RSS for each level:
# CPU seconds rather than wall, since the machine's cores are shared with other work.
# Three ways: the headers alone; with sluice::compiled (-DSLUICE_COMPILED, the user's TU
# only, and once the src/compiled.cpp the target builds beside it); and that with the
# umbrella header precompiled, as target_precompile_headers does.
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

# measure LABEL OPT SOURCE [FLAGS...]: compiles SOURCE RUNS times, prints the median.
measure() {
  local label=$1 opt=$2 src=$3
  shift 3
  local rows=() i u s m cpu all median
  for ((i = 0; i < runs; i++)); do
    /usr/bin/time -f "%U %S %M" -o "$work/time" \
      "$cxx" "${flags[@]}" "${extra[@]}" "$@" "$opt" -c "$src" -o "$work/out.o"
    read -r u s m < "$work/time"
    rows+=("$(awk -v u="$u" -v s="$s" -v m="$m" 'BEGIN { printf "%.2f %.2f %.2f %d", u + s, u, s, m }')")
  done
  median=$(printf '%s\n' "${rows[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
  read -r cpu u s m <<< "$median"
  all=$(printf '%s\n' "${rows[@]}" | cut -d' ' -f1 | paste -sd' ')
  printf '%-34s %s  cpu %6.2f s (user %.2f + sys %.2f)  max RSS %4d MB  [runs: %s]\n' \
    "$label" "$opt" "$cpu" "$u" "$s" $((m / 1024)) "$all"
}

# The same TU with the precompiled header a build system makes for it
# (target_precompile_headers): the TU includes "pch.hpp", which g++ finds as pch.hpp.gch.
printf '#include <sluice/sluice.hpp>\n' > "$work/pch.hpp"
{ printf '#include "pch.hpp"\n'; sed 1d "$work/tu.cpp"; } > "$work/tu_pch.cpp"
pch_supported=1
[[ $("$cxx" --version) == *clang* ]] && pch_supported=0  # clang wants -include-pch; not measured

compiled_src=$inc/../src/compiled.cpp  # absent in a checkout from before the compiled part
for opt in -O0 -O2; do
  measure "headers only" "$opt" "$work/tu.cpp"
  [[ -f $compiled_src ]] || continue
  measure "sluice::compiled (the user's TU)" "$opt" "$work/tu.cpp" -DSLUICE_COMPILED=1
  if ((pch_supported)); then
    "$cxx" "${flags[@]}" "${extra[@]}" -DSLUICE_COMPILED=1 "$opt" -x c++-header "$work/pch.hpp" -o "$work/pch.hpp.gch"
    measure "sluice::compiled + precompiled hdr" "$opt" "$work/tu_pch.cpp" -DSLUICE_COMPILED=1 -I"$work" -Winvalid-pch
    rm -f "$work/pch.hpp.gch"
  fi
  # What the build pays once per target for sluice::compiled.
  SLUICE_RUNS_SAVED=$runs
  runs=1
  measure "  once per target: src/compiled.cpp" "$opt" "$compiled_src" -DSLUICE_COMPILED=1
  runs=$SLUICE_RUNS_SAVED
done
