#!/usr/bin/env bash
# The demo: builds sluice-probe, generates a local dataset (16 shards of text lines, about
# 160 MB, once) and reads it twice through list | plan | read | lines | shuffle | batch,
# printing progress, the per-stage table and the JSON figures. Extra arguments go to
# sluice-probe (e.g. --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build=build-demo
echo "building sluice-probe and sluice-gen in $build ..." >&2
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target sluice-probe sluice-gen >&2
data="$build/demo-data"
if [ ! -f "$data/expected.json" ]; then
  echo "generating $data ..." >&2
  mkdir -p "$data"
  "$build/examples/sluice-gen" "$data/shards" --files 16 --records 10000 --record-size 1000 --vary --seed 1 \
    > "$data/expected.json.tmp"
  mv "$data/expected.json.tmp" "$data/expected.json"
fi
echo "sluice-probe --epochs 2 --shuffle 10000 --seed 17 --batch 256 --json '$data/shards/shard-{000000..000015}.txt'" >&2
out=$("$build/examples/sluice-probe" --epochs 2 --shuffle 10000 --seed 17 --batch 256 --json "$@" \
  "$data/shards/shard-{000000..000015}.txt")
echo "$out"
echo "the dataset holds, per epoch: $(cat "$data/expected.json")" >&2
# The check: two epochs deliver every record twice, so the record count and the checksum
# sum (mod 2^64, as the probe and the generator print them) are twice the generator's.
field() { grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
want_records=$(( $(field records < "$data/expected.json") * 2 ))
want_crc=$(printf '%u' $(( $(field crc_sum < "$data/expected.json") * 2 )))
got_records=$(echo "$out" | tail -1 | field records)
got_crc=$(echo "$out" | tail -1 | field crc_sum)
if [ "$got_records" = "$want_records" ] && [ "$got_crc" = "$want_crc" ]; then
  echo "check: $got_records records over 2 epochs with the checksums the generator wrote, each record once per epoch: OK" >&2
else
  echo "check FAILED: got $got_records records, crc_sum $got_crc; want $want_records and $want_crc" >&2
  exit 1
fi
# Images, where the image layer was built: 1,000 synthetic photos in WebDataset shards,
# decoded, randomly cropped to 224x224, flipped and batched.
if [ -f "$data/images.json" ] ||
   "$build/examples/sluice-gen" "$data/images" --images --format tar --files 2 --records 500 --seed 1 > "$data/images.json" 2>/dev/null ||
   { rm -f "$data/images.json"; false; }; then
  echo "sluice-probe --images train --format webdataset --batch 256 --json '$data/images/shard-*.tar'" >&2
  "$build/examples/sluice-probe" --images train --format webdataset --batch 256 --json "$data/images/shard-*.tar"
else
  echo "(no image layer in this build: the image demo is left out)" >&2
fi
