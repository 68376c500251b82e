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
"$build/examples/sluice-probe" --epochs 2 --shuffle 10000 --seed 17 --batch 256 --json "$@" \
  "$data/shards/shard-{000000..000015}.txt"
echo "the dataset holds, per epoch: $(cat "$data/expected.json")" >&2
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
