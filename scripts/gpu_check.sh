#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one but not sluice's build tools.
#
#   scripts/gpu_check.sh pack BUILD DEST   here: copy sluice-unit, sluice-probe, sluice-gen
#                                          and device_copy from BUILD (stripped), with the
#                                          shared libraries they load (all but glibc's and
#                                          the driver's), into DEST
#   scripts/gpu_check.sh run DEST OUT      there: the [cuda] unit tests (the [gpu] ones run
#                                          instead of skipping), compute-sanitizer over the
#                                          [gpu] tests where it is installed, sluice-probe
#                                          --device 0 / --pinned / --device host on the same
#                                          data (every record once, checksums compared), an
#                                          image pipeline into the GPU, and bench/run.sh
#                                          device's three configurations; logs into OUT
#
# The run exits non-zero if a test fails, a checksum differs or no GPU is found.
set -uo pipefail

case "${1:-}" in
  pack)
    build=$2 dest=$3
    mkdir -p "$dest/lib"
    for b in tests/sluice-unit examples/sluice-probe examples/sluice-gen bench/device_copy; do
      strip -o "$dest/$(basename "$b")" "$build/$b" || exit 1
    done
    # Everything ldd resolves except glibc's own libraries and the driver's libcuda.
    for f in "$dest"/sluice-unit "$dest"/sluice-probe "$dest"/sluice-gen "$dest"/device_copy; do
      ldd "$f" | awk '$3 ~ /^\// { print $3 }'
    done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libcuda)\.so' |
      while read -r l; do cp -L "$l" "$dest/lib/" || exit 1; done || exit 1
    du -sh "$dest"
    ;;
  run)
    bin=$(cd "$2" && pwd) out=$3
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fail=0
    step() { echo "== $*" | tee -a "$out/summary.txt"; }
    note_fail() { echo "FAILED: $*" | tee -a "$out/summary.txt"; fail=1; }
    nvidia-smi -L | tee -a "$out/summary.txt" || { note_fail "nvidia-smi: no GPU"; exit 1; }
    data=$(mktemp -d)
    trap 'rm -rf "$data"' EXIT

    step "unit tests [cuda]"
    "$bin/sluice-unit" "[cuda]" -d yes >"$out/unit.txt" 2>&1 || note_fail "sluice-unit [cuda]"
    grep -E "test cases|skipped|FAILED" "$out/unit.txt" | tee -a "$out/summary.txt"
    grep -q "\[test skipped\] no usable GPU" "$out/unit.txt" && note_fail "a [gpu] test skipped itself on a machine with a GPU"

    if command -v compute-sanitizer >/dev/null; then
      step "compute-sanitizer memcheck over the [gpu] tests"
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/sluice-unit" "[gpu]" >"$out/memcheck.txt" 2>&1 ||
        note_fail "compute-sanitizer memcheck (see memcheck.txt)"
      tail -3 "$out/memcheck.txt" | tee -a "$out/summary.txt"
    fi

    step "sluice-probe: one dataset through the host sink, pinned, the host engine and the GPU"
    "$bin/sluice-gen" "$data/tar" --files 16 --records 200 --record-size 65536 --format tar --seed 5 >"$data/tar.json" ||
      { note_fail "sluice-gen"; exit 1; }
    want=$(grep -o '"crc_sum":[0-9]*' "$data/tar.json")
    for sink in "" "--pinned" "--device host" "--device 0" "--device 0 --ring 1" "--device 0 --shuffle 1000 --collate-threads 2"; do
      # shellcheck disable=SC2086
      r=$("$bin/sluice-probe" --format tar --batch 64 --json --quiet $sink "$data/tar/*.tar" 2>"$out/probe.err")
      got=$(echo "$r" | grep -o '"crc_sum":[0-9]*')
      rate=$(echo "$r" | grep -o '"bytes_per_s":[0-9.e+]*')
      echo "probe [${sink:-host sink}]: $got (want $want) $rate" | tee -a "$out/summary.txt"
      [ -n "$got" ] && [ "$got" = "$want" ] || { note_fail "probe $sink"; cat "$out/probe.err" >>"$out/summary.txt"; }
    done
    "$bin/sluice-probe" --device 999 --json --quiet "$data/tar/*.tar" >/dev/null 2>"$out/probe.err" &&
      note_fail "probe --device 999 succeeded"
    echo "probe --device 999: $(head -c 300 "$out/probe.err")" | tee -a "$out/summary.txt"

    step "images into the GPU"
    if "$bin/sluice-gen" "$data/img" --files 4 --records 64 --format tar --images >"$data/img.json" 2>"$out/gen.err"; then
      for sink in "" "--device 0"; do
        # shellcheck disable=SC2086
        r=$("$bin/sluice-probe" --format webdataset --images train --batch 32 --json --quiet $sink "$data/img/*.tar" 2>"$out/probe.err")
        echo "images [${sink:-host sink}]: $(echo "$r" | grep -o '"records":[0-9]*') $(echo "$r" | grep -o '"records_per_s":[0-9.]*')" |
          tee -a "$out/summary.txt"
        echo "$r" | grep -q '"records":256' || { note_fail "images $sink"; cat "$out/probe.err" >>"$out/summary.txt"; }
      done
    else
      echo "images: sluice-gen built without the image layer ($(head -c 200 "$out/gen.err"))" | tee -a "$out/summary.txt"
    fi

    step "bench/run.sh device's configurations"
    for cfg in "--collate-threads 1" "--collate-threads 2" "--record-bytes 1024 --batch 32 --total-bytes 268435456"; do
      # shellcheck disable=SC2086
      "$bin/device_copy" $cfg >"$out/device_copy.txt.tmp" 2>&1 || note_fail "device_copy $cfg"
      { echo "[$cfg]"; cat "$out/device_copy.txt.tmp"; } | tee -a "$out/device_copy.txt" "$out/summary.txt" >/dev/null
      rm -f "$out/device_copy.txt.tmp"
    done
    grep -h "gb_per_s" "$out/device_copy.txt" | sed 's/.*"mode":"\([a-z_]*\)".*"gb_per_s":\([0-9.]*\).*/\1 \2/' | tr '\n' ' '
    echo
    [ $fail -eq 0 ] && echo "gpu_check: all passed" | tee -a "$out/summary.txt"
    exit $fail
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
