#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, with ASan + UBSan) and runs each on its seed corpus.
#   fuzz/run.sh [--seconds N] [--build DIR] [TARGET...]
# The test suite runs it for a few seconds per target; for a long run:
#   fuzz/run.sh --seconds 3600 tfrecord
# New inputs that libFuzzer finds go to DIR/corpus/TARGET (the seeds in fuzz/corpus are
# not modified); a crash leaves DIR/crash-* and stops that target with a non-zero exit.
# Exit 77 (a skip for CTest) when clang or libFuzzer is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
seconds=10
build="$root/build/fuzz"
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(tfrecord recordio tar webdataset gzip image)

cxx=${SLUICE_FUZZ_CXX:-$(command -v clang++ || true)}
if [ -z "$cxx" ]; then echo "fuzz: no clang++ (Debian: apt-get install clang libclang-rt-dev): skipped"; exit 77; fi
launcher=$(command -v ccache || true)
mkdir -p "$build"
probe="$build/probe.cpp"
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe"
if ! "$cxx" -fsanitize=fuzzer "$probe" -o "$build/probe" 2>/dev/null; then
  echo "fuzz: $cxx cannot link libFuzzer (Debian: apt-get install libclang-rt-dev): skipped"; exit 77
fi

# The image target needs the image layer's decoders (libjpeg-turbo, libspng).
if [[ " ${targets[*]} " == *" image "* ]] &&
   ! printf '#include <cstdio>\n#include <jpeglib.h>\n#include <spng.h>\nint main() {}\n' |
     "$cxx" -x c++ - -o "$build/probe-image" -ljpeg -lspng 2>/dev/null; then
  echo "fuzz: image: skipped (no libjpeg62-turbo-dev or libspng-dev)"
  targets=("${targets[@]/image}")
fi

flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize=function
       -fno-sanitize-recover=undefined -I"$root/include" -I"$here")
for t in "${targets[@]}"; do
  [ -n "$t" ] || continue
  bin="$build/$t"
  if [ ! -x "$bin" ] || [ "$here/$t.cpp" -nt "$bin" ] || [ -n "$(find "$root/include" "$here" -newer "$bin" -name '*.hpp' -print -quit)" ]; then
    echo "fuzz: building $t"
    libs=(-lz)
    [ "$t" = image ] && libs=(-ljpeg -lspng)
    $launcher "$cxx" "${flags[@]}" "$here/$t.cpp" -o "$bin" "${libs[@]}"
  fi
done
status=0
for t in "${targets[@]}"; do
  [ -n "$t" ] || continue
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  echo "fuzz: running $t for ${seconds}s"
  log="$build/$t.log"
  if (cd "$build" && ASAN_OPTIONS=detect_leaks=1 "./$t" -max_total_time="$seconds" -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 "$corpus" "$here/corpus/$t" >"$log" 2>&1); then
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$log" | tail -2 | sed "s/^/fuzz: $t: /"
  else
    echo "fuzz: $t FAILED (log: $log)"; tail -40 "$log"; status=1
  fi
done
exit $status
