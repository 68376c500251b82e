#!/bin/bash
# Alternating rounds over S3: boto3's get_object (bench/boto3_get.py, one stream), then
# each given sluice-probe, ROUNDS times, on one object; prints each program's median rate
# and its ratio to boto3's. Goal 4 of issue 17 (one 1 GiB object: >= 1.0 x boto3) on a
# noisy VM, where bench/run.sh's best of 3 catches either side's lucky run.
#
#   bench/s3_rounds.sh ENDPOINT BUCKET KEY ROUNDS NAME=PROBE [NAME=PROBE...]
#
# ENDPOINT serves BUCKET/KEY path-style (bench/run.sh s3 starts nginx so, with bkt/big.bin:
# nginx does not check signatures, so any credentials do; AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY are set to bench values when unset). Each side's rate is its own
# timing: boto3's of get_object and the reads (without Python's start), sluice's
# bytes_per_s (its pipeline's start included). CPU is the whole process's (perf stat
# task-clock): boto3's includes the interpreter's start-up and imports, about 0.3 s, so
# compare the probes' CPU with each other, not with boto3's.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
command -v perf >/dev/null || { echo "bench/s3_rounds.sh: needs perf (Debian: linux-perf) for task-clock" >&2; exit 2; }
endpoint=$1 bucket=$2 key=$3 rounds=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-AKIDBENCHMARK} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-bench-secret}
export AWS_REGION=${AWS_REGION:-us-east-1}
out=$(mktemp) res=$(mktemp); trap 'rm -f "$out" "$res"' EXIT
one() {  # NAME command...: "NAME bytes_per_s cpu_s"
  local name=$1 c r; shift
  c=$(perf stat -x, -o "$res.perf" -e task-clock "$@" > "$res"; grep task-clock "$res.perf" | cut -d, -f1)
  rm -f "$res.perf"
  r=$(grep -o '"bytes_per_s": *[0-9.e+]*' "$res" | head -1 | cut -d: -f2 | tr -d ' ')
  [ -n "$r" ] || { echo "$name printed no bytes_per_s:" >&2; cat "$res" >&2; exit 1; }
  awk -v n="$name" -v r="$r" -v c="$c" 'BEGIN { printf "%s %.0f %.4f\n", n, r, c / 1000 }'
}
for _ in $(seq "$rounds"); do
  one boto3 python3 "$here/boto3_get.py" "$endpoint" "$bucket" 1 "$key" >> "$out"
  for p in "$@"; do
    one "${p%%=*}" "${p#*=}" --format chunks --no-crc --json --quiet --endpoint "$endpoint" "s3://$bucket/$key" >> "$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics as st, sys
r, c = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, a, b = line.split()
    r[k].append(float(a)); c[k].append(float(b))
rb = st.median(r["boto3"])
for k in r:
    print(f"{k}: {len(r[k])} rounds, median {st.median(r[k]) / 1e9:.3f} GB/s ({st.median(r[k]) / rb:.3f} x boto3), "
          f"range {min(r[k]) / 1e9:.3f}-{max(r[k]) / 1e9:.3f}, CPU median {st.median(c[k]):.4f} s")
PY
