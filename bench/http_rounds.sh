#!/bin/bash
# Alternating rounds over HTTP: curl --parallel 64, then each given sluice-probe, ROUNDS
# times; prints each program's median wall clock and CPU (task-clock) and its ratio to
# curl's. build-release/bench/sluice-probe-io is the probe as bench/run.sh http runs it
# (no OpenCV, no CUDA runtime: 12-13 ms less CPU at each start than examples/sluice-probe).
# For comparing builds or settings on a noisy VM, where bench/run.sh's best of 5 whole
# processes catches curl's lucky runs.
#
#   bench/http_rounds.sh BASE_URL raw|raw5|tar|big ROUNDS NAME=PROBE [NAME=PROBE...]
#
# BASE_URL serves bench/run.sh http's data (build-release/bench-data/http: w/obj-*.bin,
# o/shard-*.tar, big.bin), e.g. nginx started as bench/run.sh http starts it. A NAME
# ending in "@1" runs its probe with SLUICE_HTTP_THREADS=1, one ending in "@nodirect"
# with SLUICE_HTTP_DIRECT=0 (bodies copied out of libcurl's buffer, not received into the
# chunks), one ending in "@chunks" (raw or tar mode) with --format chunks: the fetch alone,
# no records, no batch. In big mode PROBE may be bench/direct_recv (built beside sluice-probe in
# build-release/bench), which fetches big.bin alone; with a NAME ending in "+copy" it
# runs with --copy.
#
# SERVER_PIDS="PID..." (the server's worker processes, e.g. nginx's workers: pgrep -P
# MASTER) adds their CPU in each round, and client + server. On loopback the kernel's
# work of sending is done partly in the receiver's time (its receive opens the window,
# and the sender's queued segments go out in the receiver's softirq), so a client that
# drains the socket in large reads is charged some of the server's sending: the sum is
# the cost per GB that does not depend on who was charged.
#
# CA_FILE=PEM (an https:// BASE_URL with a certificate of one's own) is given to curl as
# --cacert and to each probe as --ca-file: both verify the server, as a user's would.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,26p' "$0" >&2; exit 2; }
command -v perf >/dev/null || { echo "bench/http_rounds.sh: needs perf (Debian: linux-perf) for task-clock" >&2; exit 2; }
base=$1 mode=$2 rounds=$3; shift 3
case $mode in
  raw) args=(--format raw --batch 256 --no-crc --json --quiet --in-flight 64 "$base/w/obj-{000000..001999}.bin")
       curlurl="$base/w/obj-[000000-001999].bin" ;;
  raw5) args=(--format raw --batch 256 --no-crc --json --quiet --in-flight 64 --epochs 5 "$base/w/obj-{000000..001999}.bin")
       curlurl="$base/w/obj-[000000-001999].bin" ;;
  tar) args=(--format tar --batch 256 --no-crc --json --quiet --in-flight 64 "$base/o/shard-{000000..001999}.tar")
       curlurl="$base/o/shard-[000000-001999].tar" ;;
  big) args=(--format chunks --no-crc --json --quiet "$base/big.bin"); curlurl="$base/big.bin" ;;
  *) echo "mode: raw, raw5, tar or big" >&2; exit 2 ;;
esac
tls=()
if [ -n "${CA_FILE:-}" ]; then args+=(--ca-file "$CA_FILE"); tls=(--cacert "$CA_FILE"); fi
# curl writes the bodies to its stdout, which one() sends to /dev/null (as bench/run.sh
# does). Not `-o /dev/null`: with a glob that makes curl open, stat and close /dev/null
# once per URL, 12-19 % more CPU and 10-17 % more time over 2,000 objects
# (bench/RESULTS.md, issue 17, twenty-eighth session), which flattered the raw and tar
# ratios to it.
curls=(-s "${tls[@]}" --parallel --parallel-max 64 "$curlurl")
# raw5: five epochs in one process; curl is given the URLs five times: the first epoch's
# faults of fresh memory (sluice's batches and chunks) are then a fifth of the run, as in
# a longer one.
[ "$mode" = raw5 ] && curls=(-s "${tls[@]}" --parallel --parallel-max 64 "$curlurl" "$curlurl" "$curlurl" "$curlurl" "$curlurl")
out=$(mktemp); trap 'rm -f "$out"' EXIT
server_ns() {  # the CPU time of SERVER_PIDS so far, in ns (first field of schedstat)
  local s=0 p
  for p in ${SERVER_PIDS:-}; do s=$((s + $(cut -d' ' -f1 "/proc/$p/schedstat"))); done
  echo "$s"
}
one() {  # NAME command...: "NAME wall_s cpu_s server_cpu_s"
  local name=$1 t0 t1 c s0 s1; shift
  s0=$(server_ns); t0=$EPOCHREALTIME
  c=$(perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | grep task-clock | cut -d, -f1)
  t1=$EPOCHREALTIME; s1=$(server_ns)
  awk -v n="$name" -v a="$t0" -v b="$t1" -v c="$c" -v s="$((s1 - s0))" 'BEGIN { printf "%s %.4f %.4f %.4f\n", n, b - a, c / 1000, s / 1e9 }'
}
for p in ${SERVER_PIDS:-}; do [ -r "/proc/$p/schedstat" ] || { echo "SERVER_PIDS: no process $p" >&2; exit 2; }; done
for _ in $(seq "$rounds"); do
  one curl curl "${curls[@]}" >> "$out"
  for p in "$@"; do
    name=${p%%=*} probe=${p#*=}
    if [[ $(basename "$probe") == direct_recv ]]; then
      [ "$mode" = big ] || { echo "direct_recv: big mode only" >&2; exit 2; }
      if [[ $name == *+copy ]]; then one "$name" "$probe" "$base/big.bin" --copy >> "$out"
      else one "$name" "$probe" "$base/big.bin" >> "$out"; fi
    elif [[ $name == *@1 ]]; then SLUICE_HTTP_THREADS=1 one "$name" "$probe" "${args[@]}" >> "$out"
    elif [[ $name == *@nodirect ]]; then SLUICE_HTTP_DIRECT=0 one "$name" "$probe" "${args[@]}" >> "$out"
    elif [[ $name == *@chunks ]]; then
      c=("${args[@]}"); for i in "${!c[@]}"; do [ "${c[$i]}" = --format ] && c[i+1]=chunks; done
      one "$name" "$probe" "${c[@]}" >> "$out"
    else one "$name" "$probe" "${args[@]}" >> "$out"; fi
  done
done
python3 - "$out" "${SERVER_PIDS:+server}" <<'PY'
import collections, statistics as st, sys
w, c, s, t = (collections.defaultdict(list) for _ in range(4))
for line in open(sys.argv[1]):
    k, a, b, d = line.split()
    w[k].append(float(a)); c[k].append(float(b)); s[k].append(float(d)); t[k].append(float(b) + float(d))
cw, cc, ct = st.median(w["curl"]), st.median(c["curl"]), st.median(t["curl"])
ratio = lambda a, b: f"{a / b:.3f}" if b > 0 else "n/a"  # perf printed no task-clock: 0
for k in w:
    line = (f"{k}: {len(w[k])} rounds, wall median {st.median(w[k]):.4f} s ({ratio(cw, st.median(w[k]))} x curl), "
            f"CPU median {st.median(c[k]):.4f} s ({ratio(st.median(c[k]), cc)} x curl's)")
    if sys.argv[2]:
        line += (f", server {st.median(s[k]):.4f} s, client + server {st.median(t[k]):.4f} s "
                 f"({ratio(st.median(t[k]), ct)} x curl's)")
    print(line)
PY
