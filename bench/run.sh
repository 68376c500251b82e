#!/usr/bin/env bash
# Runs each benchmark beside its peer, on the same data in the same run, and prints the
# figures and ratios (one JSON object per line on stdout, a summary on stderr).
#   bench/run.sh [channel|crc32c|local|formats|memory]...     (default: all)
# Data goes to build-release/bench-data (made once: 2.1 GiB of lines; for formats also
# 2.1 GiB each of tar and TFRecord and a gzip'd copy of the TFRecord set).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build=build-release
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target channel_hop crc32c_bench sluice-probe sluice-gen >/dev/null
probe=$build/examples/sluice-probe
field() { grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2 | tr -d '"'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
now() { date +%s.%N; }
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(channel crc32c local formats memory)

data=$build/bench-data
make_data() {
  [ -f "$data/expected.json" ] && return
  echo "generating $data: 64 files of 100 KiB lines, 2.06 GiB ..." >&2
  "$build/examples/sluice-gen" "$data/shards" --files 64 --records 330 --record-size 102400 --seed 5 > "$data/expected.json.tmp"
  mv "$data/expected.json.tmp" "$data/expected.json"
}

make_format() {  # format, extension, extra sluice-gen flags: the same records as make_data's
  local fmt=$1 ext=$2; shift 2
  [ -f "$data/$ext.json" ] && return
  echo "generating $data/$ext: 64 files of 330 x 100 KiB $fmt records ..." >&2
  "$build/examples/sluice-gen" "$data/$ext" --files 64 --records 330 --record-size 102400 --seed 5 --format "$fmt" "$@" > "$data/$ext.json.tmp"
  mv "$data/$ext.json.tmp" "$data/$ext.json"
}
best_of_3() {  # command...: prints the best GB/s of three runs over $bytes bytes
  local best=0 t0 t1 gbs
  for i in 1 2 3; do
    t0=$(now); "$@" > /dev/null; t1=$(now)
    gbs=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN { printf "%.3f", b / (c - a) / 1e9 }')
    best=$(awk -v x="$gbs" -v y="$best" 'BEGIN { print (x > y) ? x : y }')
  done
  echo "$best"
}
probe_best() {  # label, peer GB/s, expected.json, probe flags...: best of 3 probe runs, with the ratio
  local label=$1 peer=$2 expected=$3; shift 3
  local best=0 out="" o gbs epochs=1 prev=""
  for a in "$@"; do [ "$prev" = --epochs ] && epochs=$a; prev=$a; done
  for i in 1 2 3; do
    o=$("$probe" --json --quiet --batch 256 "$@")
    [ "$(echo "$o" | field ok)" = true ] || { echo "$o" >&2; exit 1; }
    gbs=$(echo "$o" | field bytes_per_s | awk '{ printf "%.3f", $1 / 1e9 }')
    if awk -v x="$gbs" -v y="$best" 'BEGIN { exit !(x > y) }'; then best=$gbs; out=$o; fi
  done
  echo "$out"
  [ "$(echo "$out" | field records)" = "$(( $(field records < "$expected") * epochs ))" ] || { echo "$label: record count mismatch" >&2; exit 1; }
  echo "{\"bench\":\"formats\",\"config\":\"$label\",\"bytes\":$bytes,\"sluice_gb_per_s\":$best,\"peer_gb_per_s\":$peer,\"ratio\":$(ratio "$best" "$peer"),\"peak_rss_bytes\":$(echo "$out" | field peak_rss_bytes),\"bottleneck\":\"$(echo "$out" | field bottleneck)\"}"
  echo "$label: sluice $best GB/s, peer $peer GB/s, ratio $(ratio "$best" "$peer"), bottleneck $(echo "$out" | field bottleneck)" >&2
}

for w in "${what[@]}"; do
  case $w in
  channel)
    # Peer: a plain loop doing the same arithmetic. Goal: >= 10 M items/s per hop.
    for threads in 1 2; do
      out=$("$build/bench/channel_hop" 20000000 "$threads")
      echo "$out"
      echo "channel hop ($threads cpu thread(s)): $(echo "$out" | field hop_items_per_s) items/s per hop," \
           "$(echo "$out" | field ns_per_hop) ns per hop; plain loop $(echo "$out" | field plain_loop_items_per_s) items/s" >&2
    done
    ;;
  crc32c)
    # Peer: zlib's crc32 on the same buffers. Goal: >= 8 GB/s.
    out=$("$build/bench/crc32c")
    echo "$out"
    echo "crc32c: $(echo "$out" | field records_100k_gb_per_s) GB/s over 100 KiB records," \
         "$(echo "$out" | field buffer_64m_gb_per_s) GB/s over 64 MiB; portable $(echo "$out" | field portable_100k_gb_per_s) GB/s;" \
         "zlib crc32 $(echo "$out" | field zlib_crc32_100k_gb_per_s) GB/s" >&2
    ;;
  formats)
    # Peers: cat of the same tar / TFRecord files; zcat of the gzip'd TFRecord files (both
    # to /dev/null, warm cache). Goals: parse+shuffle+batch >= 0.8 x cat; gzip'd >= 0.9 x zcat.
    make_format tar tar
    make_format tfrecord tfrecord
    make_format tfrecord tfrecord-gz --gzip
    for fmt in tar tfrecord; do
      files=("$data/$fmt"/shard-*)
      bytes=$(cat "${files[@]}" | wc -c)
      cat_gbs=$(best_of_3 cat "${files[@]}")
      probe_best "$fmt shuffle+batch" "$cat_gbs" "$data/$fmt.json" --format "$fmt" --no-crc --shuffle 10000 --seed 1 "$data/$fmt/shard-*"
      probe_best "$fmt batch" "$cat_gbs" "$data/$fmt.json" --format "$fmt" --no-crc "$data/$fmt/shard-*"
      probe_best "$fmt shuffle+batch mmap" "$cat_gbs" "$data/$fmt.json" --format "$fmt" --no-crc --mmap --shuffle 10000 --seed 1 "$data/$fmt/shard-*"
      probe_best "$fmt batch mmap" "$cat_gbs" "$data/$fmt.json" --format "$fmt" --no-crc --mmap "$data/$fmt/shard-*"
      probe_best "$fmt shuffle+batch 4 epochs" "$cat_gbs" "$data/$fmt.json" --format "$fmt" --no-crc --shuffle 10000 --seed 1 --epochs 4 "$data/$fmt/shard-*"
    done
    files=("$data/tfrecord-gz"/shard-*)
    bytes=$(zcat "${files[@]}" | wc -c)  # ratios of uncompressed bytes per second
    zcat_gbs=$(best_of_3 zcat "${files[@]}")
    probe_best "tfrecord.gz batch" "$zcat_gbs" "$data/tfrecord-gz.json" --format tfrecord --no-crc "$data/tfrecord-gz/shard-*"
    probe_best "tfrecord.gz shuffle+batch" "$zcat_gbs" "$data/tfrecord-gz.json" --format tfrecord --no-crc --shuffle 10000 --seed 1 "$data/tfrecord-gz/shard-*"
    ;;
  local)
    # Peer: cat of the same files to /dev/null, warm cache. Goal: sluice >= 0.8 x cat.
    make_data
    files=("$data"/shards/shard-*.txt)
    bytes=$(cat "${files[@]}" | wc -c)  # also warms the page cache
    best_cat=0
    for i in 1 2 3; do
      t0=$(now); cat "${files[@]}" > /dev/null; t1=$(now)
      gbs=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN { printf "%.3f", b / (c - a) / 1e9 }')
      best_cat=$(awk -v x="$gbs" -v y="$best_cat" 'BEGIN { print (x > y) ? x : y }')
    done
    # The configurations: the issue's (shuffle 10,000, batch 256), the same over 4 epochs
    # (the 1 GiB shuffle buffer's first touch amortised), without the shuffle, and with the
    # crc32 check the probe does by default.
    run_probe() {  # name, epochs, flags...
      local name=$1 epochs=$2; shift 2
      local best=0 out="" o gbs
      for i in 1 2 3; do
        o=$("$probe" --json --quiet --batch 256 --epochs "$epochs" "$@" "$data/shards/shard-*.txt")
        gbs=$(echo "$o" | field bytes_per_s | awk '{ printf "%.3f", $1 / 1e9 }')
        if awk -v x="$gbs" -v y="$best" 'BEGIN { exit !(x > y) }'; then best=$gbs; out=$o; fi
      done
      echo "$out"
      if [ "$name" = shuffle-crc ]; then  # the figures are of data delivered whole
        [ "$(echo "$out" | field crc_sum)" = "$(field crc_sum < "$data/expected.json")" ] || { echo "crc_sum mismatch" >&2; exit 1; }
      fi
      echo "{\"bench\":\"local_read\",\"config\":\"$name\",\"epochs\":$epochs,\"bytes_per_epoch\":$bytes,\"sluice_gb_per_s\":$best,\"cat_gb_per_s\":$best_cat,\"ratio\":$(ratio "$best" "$best_cat"),\"peak_rss_bytes\":$(echo "$out" | field peak_rss_bytes),\"bottleneck\":\"$(echo "$out" | field bottleneck)\"}"
      echo "local read [$name, $epochs epoch(s)]: sluice $best GB/s, cat $best_cat GB/s, ratio $(ratio "$best" "$best_cat")," \
           "peak RSS $(( $(echo "$out" | field peak_rss_bytes) >> 20 )) MiB, bottleneck $(echo "$out" | field bottleneck)" >&2
    }
    run_probe shuffle 1 --no-crc --shuffle 10000 --seed 1
    run_probe shuffle 4 --no-crc --shuffle 10000 --seed 1
    run_probe no-shuffle 1 --no-crc
    run_probe shuffle-crc 1 --shuffle 10000 --seed 1
    run_probe shuffle-mmap 1 --no-crc --shuffle 10000 --seed 1 --mmap
    run_probe no-shuffle-mmap 1 --no-crc --mmap
    ;;
  memory)
    # Peak RSS streaming a dataset >= 20 x the configured budgets. Goal: <= budgets + 64 MiB.
    make_data
    budget_each=$((16 << 20))
    out=$("$probe" --json --quiet --no-crc --batch 64 --channel-bytes $budget_each "$data/shards/shard-*.txt")
    echo "$out"
    rss=$(echo "$out" | field peak_rss_bytes); budget=$(echo "$out" | field budget_bytes)
    payload=$(echo "$out" | field payload_bytes)
    echo "{\"bench\":\"memory\",\"dataset_bytes\":$payload,\"budget_bytes\":$budget,\"dataset_over_budget\":$(ratio "$payload" "$budget"),\"peak_rss_bytes\":$rss,\"rss_over_budget_mib\":$(awk -v r="$rss" -v b="$budget" 'BEGIN { printf "%.1f", (r - b) / 1048576 }')}"
    echo "memory: dataset $(ratio "$payload" "$budget") x budgets ($((budget >> 20)) MiB); peak RSS $((rss >> 20)) MiB;" \
         "goal <= $(((budget >> 20) + 64)) MiB" >&2
    ;;
  *) echo "unknown benchmark $w (channel, crc32c, local, formats, memory)" >&2; exit 2 ;;
  esac
done
