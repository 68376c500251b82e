#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one but not sluice's build tools.
#
#   scripts/gpu_check.sh pack BUILD DEST   here: copy sluice-unit, sluice-probe, sluice-gen
#                                          and device_copy from BUILD (stripped), with the
#                                          shared libraries they and BUILD's Python module
#                                          load (all but glibc's and the driver's), into
#                                          DEST; and what the module's build needs that the
#                                          GPU machine lacks: the third-party headers its
#                                          source includes (DEST/include), its definitions
#                                          and flags (DEST/python_flags.txt) and the
#                                          libraries it links (DEST/python_libs.txt)
#   scripts/gpu_check.sh run DEST OUT      there: the [cuda] unit tests (the [gpu] ones run
#                                          instead of skipping), compute-sanitizer over the
#                                          [gpu] tests where it is installed, sluice-probe
#                                          --device 0 / --pinned / --device host on the same
#                                          data (every record once, checksums compared), an
#                                          image pipeline into the GPU, bench/run.sh
#                                          device's three configurations, then `python`
#                                          below; logs into OUT
#   scripts/gpu_check.sh python DEST OUT   build python/src/sluice_py.cpp for this machine's
#                                          python3 (PYTHON=another), with its pybind11
#                                          (PYBIND11_INCLUDE=DIR where it has none to
#                                          import), its g++ (CXX=another) and its CUDA
#                                          headers, against DEST's headers and libraries;
#                                          run python/tests/test_sluice.py but its S3
#                                          emulator test, and check that to_device(device=0)
#                                          gives CUDA tensors equal to the host pipeline's
#                                          batches (reported skipped where nvidia-smi finds
#                                          no GPU); logs into OUT (python_build.txt,
#                                          python.txt, python_gpu.txt, summary.txt)
#
# The run exits non-zero if a test fails, a checksum differs or no GPU is found; python
# does if the module does not build, a test fails, or, where there is a GPU, a test skips
# itself or to_device(device=0) gives no CUDA batches. A missing piece is named.
set -uo pipefail

fail=0
step() { echo "== $*" | tee -a "$out/summary.txt"; }
note_fail() { echo "FAILED: $*" | tee -a "$out/summary.txt"; fail=1; }

case "${1:-}" in
  pack)
    build=$2 dest=$3
    repo=$(cd "$(dirname "$0")/.." && pwd)
    module=$(find "$build/python/sluice" -maxdepth 1 -name '_sluice*.so' 2>/dev/null | head -1)
    [ -n "$module" ] || {
      echo "gpu_check pack: no $build/python/sluice/_sluice*.so: BUILD made no Python module" \
        "(it needs python3-dev, pybind11-dev and the image layer)" >&2
      exit 1
    }
    mkdir -p "$dest/lib"
    for b in tests/sluice-unit examples/sluice-probe examples/sluice-gen bench/device_copy; do
      strip -o "$dest/$(basename "$b")" "$build/$b" || exit 1
    done
    # Everything ldd resolves except glibc's own libraries and the driver's libcuda.
    for f in "$dest"/sluice-unit "$dest"/sluice-probe "$dest"/sluice-gen "$dest"/device_copy "$module"; do
      ldd "$f" | awk '$3 ~ /^\// { print $3 }'
    done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libcuda)\.so' |
      while read -r l; do cp -L "$l" "$dest/lib/" || exit 1; done || exit 1

    # The module's compile command (compile_commands.json where the build wrote one, else
    # the Makefiles' flags.make): its definitions and flags, without this machine's paths,
    # into DEST/python_flags.txt, one a line, so the GPU machine builds the same
    # configuration (SLUICE_HAVE_CUDA, SLUICE_HAVE_IMAGE, NDEBUG...); its include folders
    # on stdout, to find the headers below.
    incs=$(python3 - "$build" "$dest/python_flags.txt" <<'PY'
import json, os, re, shlex, sys
build, flags_out = sys.argv[1:]
src = "python/src/sluice_py.cpp"
commands = os.path.join(build, "compile_commands.json")
flags_make = os.path.join(build, "python/CMakeFiles/_sluice.dir/flags.make")
args = None
if os.path.exists(commands):
    for e in json.load(open(commands)):
        if e["file"].endswith(src):
            args = e.get("arguments") or shlex.split(e["command"])
if args is None and os.path.exists(flags_make):
    v = dict(line.split(" = ", 1) for line in open(flags_make) if " = " in line)
    args = shlex.split(" ".join(v.get(k, "") for k in ("CXX_DEFINES", "CXX_INCLUDES", "CXX_FLAGS")))
if not args:
    sys.exit("gpu_check pack: no compile command for %s in %s or %s" % (src, commands, flags_make))
keep, incs, dropped = [], [], []
i = 0
while i < len(args) and not args[i].startswith("-"):  # the compiler (and a launcher)
    i += 1
while i < len(args):
    a = args[i]
    i += 1
    if a in ("-I", "-isystem", "-iquote", "-idirafter"):
        incs.append(args[i])
        i += 1
    elif a.startswith("-I"):
        incs.append(a[2:])
    elif a in ("-o", "-MF", "-MT", "-MQ"):
        i += 1
    elif a in ("-c", "-MD", "-MMD") or not a.startswith("-"):
        pass  # the source and what the build writes
    elif re.match(r"-(D|U|std=|f|O|g|W|m|pthread)", a) and "/" not in a:
        keep.append(a)
    else:
        dropped.append(a)
if dropped:
    print("gpu_check pack: not recorded (they name this machine's paths): %s" % " ".join(dropped), file=sys.stderr)
with open(flags_out, "w") as f:
    f.write("".join(k + "\n" for k in keep))
print("\n".join(incs))
PY
    ) || exit 1
    mapfile -t incs <<<"$incs"
    mapfile -t flags <"$dest/python_flags.txt"
    incargs=()
    for d in "${incs[@]}"; do [ -z "$d" ] || incargs+=(-I "$d"); done

    # The headers the module's source includes from this machine's packages, but for the C
    # and C++ libraries', Python's, pybind11's and CUDA's: the GPU machine has its own of
    # those, and none of these, or other versions (its jpeglib.h is libjpeg 8's, not the
    # carried libjpeg 62's). Each goes below DEST/include as the include folder that found it
    # here names it (/usr/include/opencv4/opencv2/core.hpp as opencv2/core.hpp,
    # /usr/include/x86_64-linux-gnu/jconfig.h as jconfig.h), so -I DEST/include finds them all
    # ahead of the system's.
    command -v dpkg >/dev/null || { echo "gpu_check pack: needs dpkg (Debian) to tell the C library's headers from the rest" >&2; exit 1; }
    deps=$("${CXX:-c++}" "${flags[@]}" "${incargs[@]}" -M -MT deps "$repo/python/src/sluice_py.cpp") ||
      { echo "gpu_check pack: ${CXX:-c++} -M python/src/sluice_py.cpp failed" >&2; exit 1; }
    mapfile -t hdrs < <(tr ' \\' '\n\n' <<<"$deps" | grep '^/usr/include/' | xargs realpath -s | sort -u)
    declare -A owner=()
    while IFS=$'\t' read -r pkg path; do owner[$path]=$pkg; done < <(dpkg -S "${hdrs[@]}" 2>/dev/null | grep -v '^diversion' | sed 's|: /|\t/|')
    system='^(libc6-dev|linux-libc-dev|libcrypt-dev|libstdc\+\+-[0-9]+-dev|libpython3[.0-9]*-dev|python3[.0-9]*-dev|pybind11-dev|nvidia-cuda-[a-z-]+|libcudart[0-9.]*)(:[a-z0-9]+)?(,|$)'
    mapfile -t roots < <(printf '%s\n' "${incs[@]}" "/usr/include/$(gcc -print-multiarch)" /usr/include | grep '^/usr/include' |
      awk '{ print length($0), $0 }' | sort -rn | cut -d' ' -f2-)
    rm -rf "$dest/include"
    declare -A from=()
    for h in "${hdrs[@]}"; do
      pkg=${owner[$h]:-}
      [[ $pkg =~ $system ]] && continue
      [ -n "$pkg" ] || { pkg="no package"; echo "gpu_check pack: $h belongs to no package; carried" >&2; }
      rel=
      for r in "${roots[@]}"; do case $h in "$r"/*) rel=${h#"$r"/}; break ;; esac; done
      [ ! -e "$dest/include/$rel" ] || { echo "gpu_check pack: $h and another header both map to include/$rel" >&2; exit 1; }
      mkdir -p "$(dirname "$dest/include/$rel")" && cp -L "$h" "$dest/include/$rel" || exit 1
      from[${pkg%%[:,]*}]=$(( ${from[${pkg%%[:,]*}]:-0} + 1 ))
    done
    # Named, not carried: headers from elsewhere than /usr/include, the checkout and GCC's
    # own (CUDA's, which the GPU machine has; anything else would be missing there).
    tr ' \\' '\n\n' <<<"$deps" | grep '^/' | grep -v -e '^/usr/include/' -e "^$repo/" -e '^/usr/lib/gcc/' |
      awk -F/ '{ n[$2 "/" $3 "/" $4]++ } END { for (d in n) printf "not carried: %d headers under /%s\n", n[d], d }'
    echo "include/: $(find "$dest/include" -type f | wc -l) headers ($(for p in "${!from[@]}"; do echo "$p ${from[$p]}"; done | sort | paste -sd, | sed 's/,/, /g'))"
    echo "python_flags.txt: $(paste -sd' ' "$dest/python_flags.txt")"

    # The libraries the module links, but for glibc's and GCC's (the GPU machine's g++ brings
    # its own): the build there links these, from DEST/lib, by name.
    readelf -d "$module" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' |
      grep -Ev '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' >"$dest/python_libs.txt" || exit 1
    while read -r l; do
      [ -f "$dest/lib/$l" ] || { echo "gpu_check pack: the module links $l, which ldd did not resolve into $dest/lib" >&2; exit 1; }
    done <"$dest/python_libs.txt"
    echo "python_libs.txt: $(paste -sd' ' "$dest/python_libs.txt")"
    du -sh "$dest"
    ;;
  run)
    bin=$(cd "$2" && pwd) out=$3
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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

    "$BASH" "$0" python "$bin" "$out" || fail=1
    [ $fail -eq 0 ] && echo "gpu_check: all passed" | tee -a "$out/summary.txt"
    exit $fail
    ;;
  python)
    dest=$(cd "$2" && pwd) || exit 1
    out=$3
    mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
    repo=$(cd "$(dirname "$0")/.." && pwd)
    # The system's g++ first: on the GPU machine seen (2026-11-27) the g++ on PATH,
    # /opt/gcc/bin/g++, linked libstdc++ into the module statically, and its iostreams then
    # met the process's shared libstdc++ (torch's) and crashed in pipeline.state().
    py=${PYTHON:-python3} cxx=${CXX:-$([ -x /usr/bin/g++ ] && echo /usr/bin/g++ || echo g++)}
    step "Python module on this machine's Python"
    # Not DEST/lib ahead of the system's libraries (run puts it there): its libstdc++ is
    # Debian 12's, older than the one this machine's g++ builds the module for, and torch,
    # in the same process, was built against this machine's. The module finds DEST's
    # libraries through its rpath instead (below); sluice-gen through a wrapper.
    ld=":${LD_LIBRARY_PATH-}:"
    ld=${ld//":$dest/lib:"/:} ld=${ld#:} ld=${ld%:}
    if [ -n "$ld" ]; then export LD_LIBRARY_PATH=$ld; else unset LD_LIBRARY_PATH; fi

    missing=()
    for f in python_flags.txt python_libs.txt include lib sluice-gen; do
      [ -e "$dest/$f" ] || missing+=("$dest/$f (scripts/gpu_check.sh pack BUILD DEST writes it)")
    done
    command -v "$cxx" >/dev/null || missing+=("a C++ compiler: $cxx (CXX=another)")
    pyinc='' pb11='' suffix=''
    if command -v "$py" >/dev/null; then
      pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
      [ -f "$pyinc/Python.h" ] || missing+=("Python.h for $py (not in '$pyinc': the python3-dev package)")
      suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
      pb11=${PYBIND11_INCLUDE:-$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null)}
      [ -f "$pb11/pybind11/pybind11.h" ] || missing+=("pybind11's headers (import pybind11 in $py, or PYBIND11_INCLUDE=DIR)")
    else
      missing+=("$py (PYTHON=another)")
    fi
    # CUDA's headers where the module was built with the CUDA engine: this machine's toolkit,
    # whose major version must be the carried libcudart's.
    cuda_inc='' cudart=$(cd "$dest/lib" 2>/dev/null && ls libcudart.so.* 2>/dev/null | head -1)
    if grep -q '^libcudart\.so' "$dest/python_libs.txt" 2>/dev/null; then
      nvcc=$(command -v nvcc) && nvcc=$(readlink -f "$nvcc")
      # shellcheck disable=SC2046
      for d in ${CUDA_HOME:+"$CUDA_HOME/include"} ${nvcc:+"$(dirname "$(dirname "$nvcc")")/include"} /usr/local/cuda/include \
        $(ls -d /usr/local/cuda-*/include 2>/dev/null | sort -rV) /usr/include; do
        [ -f "$d/cuda_runtime_api.h" ] && { cuda_inc=$d; break; }
      done
      if [ -z "$cuda_inc" ]; then
        missing+=("CUDA's cuda_runtime_api.h (looked in \$CUDA_HOME/include, nvcc's include, /usr/local/cuda*/include, /usr/include)")
      else
        v=$(sed -n 's/^#define CUDART_VERSION *\([0-9]*\) *$/\1/p' "$cuda_inc/cuda_runtime_api.h")
        [ "${cudart#libcudart.so.}" = "$((v / 1000))" ] ||
          missing+=("CUDA headers for the carried $cudart: $cuda_inc has CUDA $((v / 1000)).$((v % 1000 / 10))")
      fi
    fi
    if [ ${#missing[@]} -gt 0 ]; then
      for m in "${missing[@]}"; do note_fail "python: missing $m"; done
      exit 1
    fi

    work=$(mktemp -d) || exit 1
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/pkg/sluice" "$work/lib"
    cp "$repo/python/sluice/__init__.py" "$work/pkg/sluice/" || exit 1
    # The module's rpath: DEST's libraries that this machine lacks (libjpeg 62, OpenCV 4.6,
    # spng...). Those it has (libz, OpenSSL, libcurl's helpers) come from the system, as
    # for Python's own modules and torch in the same process: one copy of each, the newer.
    # An old-style rpath (DT_RPATH) also serves the carried libraries' own dependencies.
    sys_libs=$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null)
    for l in "$dest"/lib/*; do
      n=$(basename "$l")
      case $n in libstdc++.so* | libgcc_s.so*) continue ;; esac
      grep -qF $'\t'"$n (libc6,x86-64" <<<"$sys_libs" || ln -s "$l" "$work/lib/$n" || exit 1
    done
    mapfile -t flags <"$dest/python_flags.txt"
    link=()
    while read -r l; do link+=("$dest/lib/$l"); done <"$dest/python_libs.txt"
    so=$work/pkg/sluice/_sluice$suffix
    # shellcheck disable=SC2054
    cmd=("$cxx" -O2 -std=gnu++20 "${flags[@]}" -shared -fPIC -I"$repo/include" -I"$dest/include" -I"$pb11" -I"$pyinc"
      ${cuda_inc:+-I"$cuda_inc"} -MD -MF "$out/python_deps.txt" -MT _sluice -o "$so" "$repo/python/src/sluice_py.cpp"
      "${link[@]}" -Wl,-rpath-link,"$dest/lib" -Wl,--disable-new-dtags,-rpath,"$work/lib")
    pb11v=$(sed -n 's/^#define PYBIND11_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9a-z.]*\).*/\2/p' "$pb11/pybind11/detail/common.h" | paste -sd.)
    versions="$py: $("$py" -c 'import sys; print(sys.version.split()[0])') ($(command -v "$py")); pybind11 $pb11v ($pb11)"
    versions+="; $("$cxx" --version | head -1); CUDA headers ${cuda_inc:-none}${v:+ ($((v / 1000)).$((v % 1000 / 10)))}"
    {
      echo "$versions"
      echo "libraries from DEST/lib (the rest from the system): $(ls "$work/lib" | paste -sd' ')"
      echo "+ ${cmd[*]}"
    } >"$out/python_build.txt"
    echo "$versions" | tee -a "$out/summary.txt"
    t0=$SECONDS
    timeout 600 "${cmd[@]}" >>"$out/python_build.txt" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      note_fail "python: the module did not build ($([ $rc -eq 124 ] && echo "600 s ran out" || echo "$cxx's status $rc"); python_build.txt's end:)"
      tail -25 "$out/python_build.txt" | tee -a "$out/summary.txt"
      exit 1
    fi
    used=$(tr ' \\' '\n\n' <"$out/python_deps.txt" | grep -F "$dest/include/" | xargs -r realpath -s | sort -u | wc -l)
    echo "python: built $(basename "$so") in $((SECONDS - t0)) s, with $used of the $(find "$dest/include" -type f | wc -l) carried headers" |
      tee -a "$out/summary.txt"
    # Where each library the module loads comes from, as Python's loader will find them.
    { echo "+ ldd $so"; ldd "$so"; } >>"$out/python_build.txt" 2>&1
    unresolved=$(ldd "$so" 2>&1 | awk '/not found/ { print $1 }' | paste -sd' ')
    [ -z "$unresolved" ] || { note_fail "python: the module's libraries not found: $unresolved"; exit 1; }
    grep -q 'libstdc++\.so' <<<"$(ldd "$so")" || {
      note_fail "python: the module holds a libstdc++ of its own ($cxx links it statically); torch's in the same process breaks its iostreams: CXX=/usr/bin/g++ or another that links it shared"
      exit 1
    }

    printf '#!/bin/bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$dest/lib" "$dest/sluice-gen" >"$work/sluice-gen" && chmod +x "$work/sluice-gen" || exit 1
    gpu=0
    nvidia-smi -L >/dev/null 2>&1 && gpu=1

    # All of test_sluice.py but the S3 emulator's test (s3rver is not packed); its HTTP tests
    # serve themselves on 127.0.0.1.
    tests=(Batches Ranks Map Readme TrainingScript Errors SharedLimit ErrorKinds Stop)
    (cd "$repo/python/tests" && env PYTHONPATH="$work/pkg" SLUICE_GEN="$work/sluice-gen" AWS_EC2_METADATA_DISABLED=true \
      no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost timeout 300 "$py" -m unittest -v "${tests[@]/#/test_sluice.}") \
      >"$out/python.txt" 2>&1 || note_fail "python: the module's tests (python.txt)"
    grep -E "^(Ran [0-9]+ tests|OK|FAILED|FAIL:|ERROR:)" "$out/python.txt" | sed 's/^/python: /' | tee -a "$out/summary.txt"
    skips=$(grep -c "skipped '" "$out/python.txt")
    if [ "$skips" -gt 0 ]; then
      grep -o "test_[a-z_]* ([a-zA-Z_.]*) \.\.\. skipped '.*'" "$out/python.txt" | sed 's/^/python: /' | tee -a "$out/summary.txt"
      [ $gpu -eq 0 ] || note_fail "python: $skips tests skipped themselves on a machine with a GPU"
    fi

    # The test of to_device(device=0) passes without a GPU too (it expects the DeviceError
    # then): here the batches must arrive as CUDA tensors, equal to the host pipeline's.
    "$work/sluice-gen" "$work/img" --images --jpeg-only --format tar --files 2 --records 100 --classes 4 --seed 5 \
      >/dev/null 2>"$out/python_gpu.txt" || { note_fail "python: sluice-gen (python_gpu.txt)"; exit 1; }
    (cd "$work" && PYTHONPATH="$work/pkg" timeout 120 "$py" - "$work/img/shard-*.tar" "$gpu" >>"$out/python_gpu.txt" 2>&1 <<'PY'
import sys

import torch  # first, so that the process holds torch's CUDA runtime before sluice's
import sluice

shards, need_gpu = sys.argv[1], sys.argv[2] == "1"
print("torch %s: CUDA available: %s" % (torch.__version__, torch.cuda.is_available()))


def chain():
    return (sluice.list(shards) | sluice.plan(epochs=1, seed=17) | sluice.read() | sluice.webdataset()
            | sluice.decode_images(size=32, concurrency=2) | sluice.shuffle(buffer=64) | sluice.batch_images(size=16))


host = [(torch.from_dlpack(b).clone(), torch.from_dlpack(b.labels).clone()) for b in sluice.Pipeline(chain())]
try:
    p = sluice.Pipeline(chain() | sluice.to_device(device=0, ring=4))
    b = next(p)
except sluice.DeviceError as e:
    print("to_device(device=0): %s" % e)
    sys.exit(1 if need_gpu else 77)
n = 0
while b is not None:
    x, y = torch.from_dlpack(b), torch.from_dlpack(b.labels)
    assert b.__dlpack_device__() == (2, 0), b.__dlpack_device__()  # kDLCUDA, device 0
    assert x.is_cuda and x.device.index == 0, x.device
    assert x.data_ptr() == b.data.data_ptr  # the batch's own memory, no copy
    assert y.device.type == "cpu"
    assert torch.equal(x.cpu(), host[n][0]), "batch %d: pixels differ from the host pipeline's" % n
    assert torch.equal(y, host[n][1]), "batch %d: labels differ from the host pipeline's" % n
    n += 1
    del x, y
    b = next(p, None)
assert n == len(host), "%d batches on the GPU, %d on the host" % (n, len(host))
print("to_device(device=0): %d batches, CUDA tensors equal to the host pipeline's" % n)
PY
    )
    case $? in
      0) ;;
      77) echo "python: [skipped] to_device(device=0): no GPU here" | tee -a "$out/summary.txt" ;;
      *) note_fail "python: to_device(device=0) into torch (python_gpu.txt)" ;;
    esac
    tail -2 "$out/python_gpu.txt" | sed 's/^/python: /' | tee -a "$out/summary.txt"
    [ $fail -eq 0 ] && echo "python: all passed" | tee -a "$out/summary.txt"
    exit $fail
    ;;
  *)
    sed -n '2,/^[^#]/{/^#/p}' "$0" >&2
    exit 2
    ;;
esac
