// sluice-probe: how fast can this storage feed a trainer?
//
//   sluice-probe [options] SOURCE...
//
// Reads SOURCEs (paths, globs, brace patterns like data/shard-{000..063}.txt, directories)
// through list | plan | read | decode | shuffle | batch [| to_device], checks every record
// with crc32,
// prints progress and a per-stage table on stderr, and with --json one JSON object on
// stdout. Exit status: 0 done, 1 a source failed (the message names it), 2 bad usage.

#include <sluice/sluice.hpp>

#include "probe_sweep.hpp"
#if defined(SLUICE_HAVE_IMAGE)
#include <sluice/image.hpp>
#endif

#include <sys/resource.h>
#include <zlib.h>

#include <array>
#include <charconv>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

constexpr const char* usage_text = R"(usage: sluice-probe [options] SOURCE...
SOURCE: a path, a glob (data/*.txt), a brace pattern (data/shard-{000..063}.txt), a
directory (all regular files below it), http(s):// URLs (brace patterns expand), or
s3://bucket/key, s3://bucket/prefix/ (listed), s3://bucket/prefix/*.tar (listed, matched).
S3 region and endpoint come from the AWS environment variables and files unless given
below; credentials from the AWS CLI's chain (the environment, web identity, the profile's
keys, role or credential_process, container credentials, instance metadata). The table
and --json name the source that won (fetch: "credentials: ...").
options:
  --format F             raw: one record per file; lines: per line (default);
                         chunks: no decoding, the sources' chunks counted (transfer rate);
                         tar: per regular file in tar archives; tfrecord; recordio;
                         webdataset: tar members grouped into samples by key.
                         gzip'd shards (.gz or the gzip magic) are inflated, except
                         for raw (bytes as stored)
  --images train|eval    decode JPEG/PNG images (raw: one per file; webdataset: the
                         jpg/jpeg/png field, the label from .cls) and augment them:
                         train = random-resized-crop + flip, eval = resize + centre
                         crop; batches are one tensor each. "records" counts images;
                         cpu_ms_per_record is the process's CPU time per image
  --image-size N         output side (default 224); eval resizes the shorter side to
                         N * 8/7 first (256 for 224)
  --layout nchw|nhwc     image batch layout (default nchw)
  --float                image batches as float32, normalised with ImageNet's mean and
                         std (default: uint8 as decoded)
  --decode-threads D     images decoded at once (default: CPU pool threads)
  --step-ms MS           after each batch, sleep MS per 256 records (a simulated GPU
                         step); --json then gives step_wait_share, the share of the
                         loop spent waiting for batches (what the GPU would idle)
  --on-corrupt error|skip  corrupt records fail the run naming shard and byte offset
                         (default), or are skipped and counted (corrupt_skipped)
  --batch N              records per batch (default 32)
  --drop-last            drop a last batch smaller than N
  --collate-threads C    CPU workers collating batches, each with a batch of its own
                         (default: one worker, joined on a batch of 4 MiB or more by
                         one more thread of the CPU pool where it has 2 or more;
                         images: 1)
  --device N             copy each batch to CUDA device N (to_device; the batch stage
                         collates into pinned memory); the probe waits for each copy.
                         `--device host`: the same path with the host copy engine
                         (no GPU needed; memcpy in place of the bus)
  --ring R               with --device: batches copied ahead of the consumer (default 3)
  --pinned               collate batches into pinned host memory (the pinned host sink)
  --shuffle N            shuffle buffer in records; 0 = no shuffle (default 0)
  --seed S               seed for the shard order and the shuffle buffer
  --epochs E             passes over the data (default 1)
  --rank R --world W     read share R of W (default: RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/
                         OMPI_COMM_WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS, else 0 of 1)
  --share drop|pad|by_shard  how ranks share records (default drop: equal shares, the
                         remainder left out; pad: equal shares, a few records repeated;
                         by_shard: whole shards, shares may differ)
  --counts FILE          records per shard ("COUNT NAME" lines). Without it, when the
                         world is above 1, sluice counts them itself (tar headers, length
                         fields; ranged requests for URLs) and keeps them in DIR below
  --counts-dir DIR       where those counts are kept, shared by the ranks of a node (one
                         counts, the others wait for its file; default: --cache, else
                         $XDG_CACHE_HOME/sluice, else ~/.cache/sluice)
  --write-counts FILE    count the records of each shard of SOURCE, write FILE, and exit
  --deterministic        every stage ordered (http(s): objects in shard order; local:
                         files whole, in order): the same records in the same order on
                         every run, whatever the threads, requests in flight or chunk size
  --files-in-flight N    local: files read at once (default 1)
  --emit-keys FILE       write each delivered record's key (url#index), one per line
  --stop-after-batches N stop after N batches (with --save-state: a crash-like cut)
  --save-state FILE      at the end (or the cut), write the pipeline's state to FILE
  --resume FILE          start from a state written by --save-state: deliver exactly
                         what that run had not delivered. Given once per rank of the
                         world that saved them (every rank's state, after the same
                         batch), the states are merged (sluice::merge_states): this
                         rank of a world of any size takes its equal share of what no
                         old rank delivered
  --cache DIR            http(s)/s3: keep a local copy of each object in DIR; later
                         epochs and runs read it from there (shared safely by processes)
  --cache-bytes N        the cache's limit in bytes; least recently used objects go
                         first (default 0: no limit but the disk)
  --shared-limit DIR     http(s)/s3: share one request limit (AIMD and 503 back-off)
                         with every process of the node that names DIR (e.g. --cache's);
                         --in-flight then bounds this process, the node together
  --threads T            CPU pool threads (default: the CPUs it may run on)
  --chunk-size BYTES     read size (default 4194304)
  --channel-bytes BYTES  byte budget of each channel (read, gunzip, decode, batch)
                         (default 67108864); their sum is reported as budget_bytes
  --in-flight K          http(s): requests in flight at most (default 64); halves on 503/429
  --min-in-flight K      http(s): ... but not below K (default 4)
  --part-size BYTES      http(s): large objects download as ranged parts, the first of BYTES
                         (default 8388608), each next one twice the one before
  --max-part-size BYTES  http(s): up to BYTES (default 67108864; at or below --part-size:
                         every part is --part-size)
  --parts-in-flight P    http(s): parts of one object at once (default 4) ...
  --parallel-parts-below R  http(s): ... while the object comes at below R bytes/s
                         (default 500000000; 0: always)
  --ordered              http(s): objects delivered in shard order (default: as completed)
  --retries N            http(s): retries of one object after transient failures (default 8)
  --stall-seconds S      http(s): no byte for S seconds fails (and retries) a transfer (default 30)
  --ca-file FILE         https: trust this CA bundle instead of the system's (S3 listings too)
  --insecure             https: do not verify certificates (explicitly unsafe)
  --endpoint URL         s3: the S3 endpoint (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL,
                         the profile's endpoint_url, else AWS for the region)
  --region R             s3: the region (default: AWS_REGION, AWS_DEFAULT_REGION, the
                         profile's, else us-east-1)
  --profile P            s3: the profile of ~/.aws/credentials and ~/.aws/config to use
  --path-style           s3: https://host/bucket/key (default: bucket.host, except for IP
                         and localhost endpoints)
  --anonymous            s3: unsigned requests (public buckets)
  --no-mmap              read files with pread instead of mapping them (mapping is the
                         default: no copy before collation; see read_options::map)
  --map-min-bytes N      mapping: files below N bytes are read with pread unless a
                         shuffle holds the records (default 1048576; 0 maps every file)
  --no-crc               skip the per-record crc32 (measures the pipeline alone)
  --max-record-bytes N   the largest record (line, object, TFRecord...) a decoder holds;
                         a larger one is corrupt (default 1073741824)
  --tune                 let the tuner move the settings it can while the run lasts:
                         http(s)/s3 requests in flight (from 8 up to --in-flight, 256
                         when not given), local files in flight (from 1 up to
                         --files-in-flight, 16 when not given), image decoders and
                         collating workers (from 1 up to --decode-threads and
                         --collate-threads, the CPU pool's threads when not given); its
                         changes and choices end the table
  --memory BYTES         one memory budget for the run, divided among the channels,
                         requests in flight (a quarter), the buffer pool (a third), tuned
                         or not; 0: none (default)
  --sweep                measure throughput against requests in flight (1, 2, 4, ...;
                         files in flight for local paths) and, for objects of 4 MiB or
                         more, part size; print the recommended settings, the figures
                         behind them and what a target rate needs (shard size, S3
                         prefixes at an assumed 5,500 GET/s each), then exit (local
                         files read again come from the page cache)
  --sweep-seconds S      time per sweep point (default 2)
  --sweep-max K          the most in flight tried (default 128)
  --target-rate BYTES    --sweep plans for this many bytes/s (default: the best measured)
  --chart FILE           --sweep also draws throughput against in flight as SVG
  --progress SECONDS     progress line interval on stderr; 0 = none (default 1)
  --metrics-file FILE    the live figures in Prometheus' text format, rewritten each second
  --metrics-port PORT    ... served at http://127.0.0.1:PORT/metrics (0: a free port,
                         printed on stderr) while the run lasts
  --trace FILE           a Chrome trace of the run (ui.perfetto.dev, chrome://tracing):
                         each worker's busy and waiting spans, written at the end
  --quiet                no progress line and no table
  --json                 one JSON object with the figures on stdout
  --help                 this text
)";

struct options {
    std::string format = "lines";
    std::string images;  // "", "train" or "eval"
    std::uint32_t image_size = 224;
    bool nhwc = false, as_float = false;
    unsigned decode_threads = 0;
    double step_ms = 0;
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    std::size_t max_record_bytes = std::size_t{1} << 30;
    std::size_t batch = 32;
    bool drop_last = false;
    unsigned collate_threads = 0;  // 0: batch_options' default (one worker, helped on large batches)
    std::optional<int> device;  // -1: the host engine
    unsigned ring = 3;
    bool pinned = false;
    std::size_t shuffle = 0;
    std::optional<std::uint64_t> seed;
    unsigned epochs = 1;
    std::optional<unsigned> rank, world;
    sluice::share share = sluice::share::drop;
    std::string counts, counts_dir, write_counts, emit_keys, save_state, cache;
    std::vector<std::string> resume;  // several: the states of every rank, merged
    std::uint64_t cache_bytes = 0;
    std::optional<std::uint64_t> stop_after;
    bool deterministic = false;
    unsigned files_in_flight = 1;
    unsigned threads = 0;
    std::size_t chunk_size = 4u << 20;
    std::size_t channel_bytes = 64u << 20;
    bool map = true;
    std::uint64_t map_min_bytes = 1u << 20;
    unsigned in_flight = 64, retries = 8, stall = 30, min_in_flight = 4, parts_in_flight = 4;
    std::uint64_t parallel_parts_below = sluice::fetch_options{}.parallel_parts_below_bytes_per_s;
    std::uint64_t part_size = 8u << 20, max_part_size = 64u << 20;
    bool ordered = false;
    std::string ca_file;
    std::string shared_limit;
    bool insecure = false;
    sluice::s3_options s3;
    bool crc = true;
    double progress = 1;
    std::string metrics_file, trace;
    bool sweep = false, tune = false, in_flight_given = false, files_given = false, collate_given = false;
    std::uint64_t memory = 0;
    double sweep_seconds = 2, target_rate = 0;
    unsigned sweep_max = 128;
    std::string chart;
    int metrics_port = -1;
    bool quiet = false;
    bool json = false;
    std::vector<std::string> sources;
};

[[noreturn]] void usage_error(const std::string& msg) {
    std::cerr << "sluice-probe: " << msg << "\n" << usage_text;
    std::exit(2);
}

template <class T>
T number(std::string_view flag, std::string_view v) {
    T out{};
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc{} || p != v.data() + v.size())
        usage_error("bad value '" + std::string(v) + "' for " + std::string(flag));
    return out;
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        auto value = [&]() -> std::string_view {
            if (i + 1 >= argc) usage_error(std::string(a) + " needs a value");
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::cout << usage_text;
            std::exit(0);
        } else if (a == "--format") {
            o.format = value();
            if (o.format != "raw" && o.format != "lines" && o.format != "tar" && o.format != "tfrecord" &&
                o.format != "recordio" && o.format != "chunks" && o.format != "webdataset")
                usage_error("unknown format '" + o.format + "'");
        } else if (a == "--images") {
            o.images = value();
            if (o.images != "train" && o.images != "eval") usage_error("--images takes train or eval, not '" + o.images + "'");
        } else if (a == "--image-size") {
            o.image_size = number<std::uint32_t>(a, value());
            if (o.image_size == 0) usage_error("--image-size must be at least 1");
        } else if (a == "--layout") {
            const std::string v(value());
            if (v != "nchw" && v != "nhwc") usage_error("--layout takes nchw or nhwc, not '" + v + "'");
            o.nhwc = v == "nhwc";
        } else if (a == "--float") {
            o.as_float = true;
        } else if (a == "--step-ms") {
            o.step_ms = number<double>(a, value());
        } else if (a == "--decode-threads") {
            o.decode_threads = number<unsigned>(a, value());
            if (o.decode_threads == 0) usage_error("--decode-threads must be at least 1");
        } else if (a == "--on-corrupt") {
            const std::string v(value());
            if (v == "error") o.on_corrupt = sluice::on_corrupt::error;
            else if (v == "skip") o.on_corrupt = sluice::on_corrupt::skip;
            else usage_error("--on-corrupt takes error or skip, not '" + v + "'");
        } else if (a == "--batch") {
            o.batch = number<std::size_t>(a, value());
            if (o.batch == 0) usage_error("--batch must be at least 1");
        } else if (a == "--collate-threads") {
            o.collate_threads = number<unsigned>(a, value());
            o.collate_given = true;
        } else if (a == "--drop-last") {
            o.drop_last = true;
        } else if (a == "--shuffle") {
            o.shuffle = number<std::size_t>(a, value());
        } else if (a == "--seed") {
            o.seed = number<std::uint64_t>(a, value());
        } else if (a == "--epochs") {
            o.epochs = number<unsigned>(a, value());
        } else if (a == "--rank") {
            o.rank = number<unsigned>(a, value());
        } else if (a == "--world") {
            o.world = number<unsigned>(a, value());
        } else if (a == "--share") {
            const std::string v(value());
            if (v == "drop") o.share = sluice::share::drop;
            else if (v == "pad") o.share = sluice::share::pad;
            else if (v == "by_shard") o.share = sluice::share::by_shard;
            else usage_error("--share takes drop, pad or by_shard, not '" + v + "'");
        } else if (a == "--counts") {
            o.counts = value();
        } else if (a == "--counts-dir") {
            o.counts_dir = value();
        } else if (a == "--write-counts") {
            o.write_counts = value();
        } else if (a == "--deterministic") {
            o.deterministic = true;
        } else if (a == "--files-in-flight") {
            o.files_in_flight = number<unsigned>(a, value());
            o.files_given = true;
            if (o.files_in_flight == 0) usage_error("--files-in-flight must be at least 1");
        } else if (a == "--emit-keys") {
            o.emit_keys = value();
        } else if (a == "--stop-after-batches") {
            o.stop_after = number<std::uint64_t>(a, value());
        } else if (a == "--save-state") {
            o.save_state = value();
        } else if (a == "--resume") {
            o.resume.emplace_back(value());
        } else if (a == "--cache") {
            o.cache = value();
        } else if (a == "--shared-limit") {
            o.shared_limit = value();
        } else if (a == "--cache-bytes") {
            o.cache_bytes = number<std::uint64_t>(a, value());
        } else if (a == "--threads") {
            o.threads = number<unsigned>(a, value());
        } else if (a == "--chunk-size") {
            o.chunk_size = number<std::size_t>(a, value());
            if (o.chunk_size == 0) usage_error("--chunk-size must be at least 1");
        } else if (a == "--channel-bytes") {
            o.channel_bytes = number<std::size_t>(a, value());
        } else if (a == "--no-mmap") {
            o.map = false;
        } else if (a == "--map-min-bytes") {
            o.map_min_bytes = number<std::uint64_t>(a, value());
        } else if (a == "--mmap") {  // the default since issue 17; kept so older scripts run
            o.map = true;
        } else if (a == "--in-flight") {
            o.in_flight = number<unsigned>(a, value());
            o.in_flight_given = true;
            if (o.in_flight == 0) usage_error("--in-flight must be at least 1");
        } else if (a == "--min-in-flight") {
            o.min_in_flight = number<unsigned>(a, value());
        } else if (a == "--part-size") {
            o.part_size = number<std::uint64_t>(a, value());
            if (o.part_size == 0) usage_error("--part-size must be at least 1");
        } else if (a == "--max-part-size") {
            o.max_part_size = number<std::uint64_t>(a, value());
        } else if (a == "--parts-in-flight") {
            o.parts_in_flight = number<unsigned>(a, value());
            if (o.parts_in_flight == 0) usage_error("--parts-in-flight must be at least 1");
        } else if (a == "--parallel-parts-below") {
            o.parallel_parts_below = number<std::uint64_t>(a, value());
        } else if (a == "--ordered") {
            o.ordered = true;
        } else if (a == "--retries") {
            o.retries = number<unsigned>(a, value());
        } else if (a == "--stall-seconds") {
            o.stall = number<unsigned>(a, value());
            if (o.stall == 0) usage_error("--stall-seconds must be at least 1");
        } else if (a == "--ca-file") {
            o.ca_file = value();
            o.s3.ca_bundle = o.ca_file;  // listings too
        } else if (a == "--insecure") {
            o.insecure = true;
        } else if (a == "--endpoint") {
            o.s3.endpoint = value();
        } else if (a == "--region") {
            o.s3.region = value();
        } else if (a == "--profile") {
            o.s3.profile = value();
        } else if (a == "--path-style") {
            o.s3.addressing = sluice::s3_addressing::path;
        } else if (a == "--anonymous") {
            o.s3.anonymous = true;
        } else if (a == "--device") {
            const std::string v(value());
            o.device = v == "host" ? -1 : number<int>(a, v);
            if (*o.device < -1) usage_error("--device takes a CUDA device number or 'host'");
        } else if (a == "--ring") {
            o.ring = number<unsigned>(a, value());
            if (o.ring == 0) usage_error("--ring must be at least 1");
        } else if (a == "--pinned") {
            o.pinned = true;
        } else if (a == "--no-crc") {
            o.crc = false;
        } else if (a == "--max-record-bytes") {
            o.max_record_bytes = number<std::size_t>(a, value());
            if (o.max_record_bytes == 0) usage_error("--max-record-bytes must be at least 1");
        } else if (a == "--progress") {
            o.progress = number<double>(a, value());
        } else if (a == "--tune") {
            o.tune = true;
        } else if (a == "--memory") {
            o.memory = number<std::uint64_t>(a, value());
        } else if (a == "--sweep") {
            o.sweep = true;
        } else if (a == "--sweep-seconds") {
            o.sweep_seconds = number<double>(a, value());
            if (!(o.sweep_seconds > 0)) usage_error("--sweep-seconds must be above 0");
        } else if (a == "--sweep-max") {
            o.sweep_max = number<unsigned>(a, value());
            if (o.sweep_max == 0) usage_error("--sweep-max must be at least 1");
        } else if (a == "--target-rate") {
            o.target_rate = number<double>(a, value());
        } else if (a == "--chart") {
            o.chart = value();
        } else if (a == "--metrics-file") {
            o.metrics_file = value();
        } else if (a == "--metrics-port") {
            o.metrics_port = number<int>(a, value());
            if (o.metrics_port < 0 || o.metrics_port > 65535) usage_error("--metrics-port takes 0 to 65535");
        } else if (a == "--trace") {
            o.trace = value();
        } else if (a == "--quiet") {
            o.quiet = true;
        } else if (a == "--json") {
            o.json = true;
        } else if (a.size() > 1 && a[0] == '-') {
            usage_error("unknown option " + std::string(a));
        } else {
            o.sources.emplace_back(a);
        }
    }
    if (o.sources.empty()) usage_error("no SOURCE given");
    // Ceilings: the tuner climbs from 8 requests, one file, one worker.
    if (o.tune && !o.in_flight_given) o.in_flight = 256;
    if (o.tune && !o.files_given) o.files_in_flight = 16;
    if (o.tune && !o.collate_given) o.collate_threads = std::max(1u, o.threads ? o.threads : sluice::detail::usable_cpus());
    if (o.rank.has_value() != o.world.has_value()) usage_error("--rank and --world go together");
    if (o.world && (*o.world == 0 || *o.rank >= *o.world)) usage_error("--rank must be below --world");
    if (o.pinned && o.device) usage_error("--pinned is the host sink; --device collates into pinned memory itself");
    return o;
}

std::uint64_t peak_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    return 0;
}

std::uint64_t total_counter(const sluice::pipeline_figures& f, const std::string& counter) {
    std::uint64_t n = 0;
    for (auto& st : f.stages)
        for (auto& [name, v] : st.counters)
            if (name == counter) n += v;
    return n;
}

// What every report starts with: the pipeline stopped, its table on stderr (unless
// --quiet), and the JSON object opened with "ok" and, on failure, "error".
template <class P>
sluice::pipeline_figures stop_and_tabulate(P& p, const options& o) {
    p.stop();
    auto f = p.figures();
    if (!o.quiet) std::cerr << f.table();
    return f;
}
void open_report(sluice::detail::json_writer& w, int status, const std::string& failure) {
    w.begin_object();
    w.key("ok").value(status == 0);
    if (status) w.key("error").value(failure);
}

// The figures both reports end with: the fetch counters (http sources), memory, the
// bottleneck and the per-stage table; then the object is closed and printed.
void finish_report(sluice::detail::json_writer& w, const sluice::pipeline_figures& f, bool http,
                   std::optional<std::uint64_t> budget_bytes) {
    if (http)
        for (auto c : {"requests", "parts", "retries", "resumes", "throttled", "cache_hits", "cache_misses",
                       "cache_write_failures", "cache_evictions"})
            w.key(c).value(total_counter(f, c));
    w.key("peak_rss_bytes").value(peak_rss_bytes());
    w.key("io_loop_cpu_s").value(f.io_loop_cpu_s);
    if (budget_bytes) w.key("budget_bytes").value(*budget_bytes);
    w.key("bottleneck").value(f.bottleneck());
    w.key("stages");
    f.write_stages(w);
    f.write_tuning(w);
    w.end_object();
    std::cout << w.str() << std::endl;
}

// --metrics-file, --metrics-port, --trace, --tune, --memory, --progress.
sluice::pipeline_options exports(const options& o, sluice::pipeline_options po) {
    po.metrics = {.file = o.metrics_file, .port = o.metrics_port};
    po.tune = o.tune;
    po.memory = o.memory;
    po.trace = o.trace;
    if (!o.quiet && o.progress > 0) po.progress = std::chrono::milliseconds(static_cast<long>(o.progress * 1000));
    return po;
}
// Starts the pipeline and says where its figures are served (--metrics-port 0 picks one).
template <class P>
void say_metrics_port(P& p, const options& o) {
    if (o.metrics_port < 0) return;
    std::cerr << "sluice-probe: figures at http://127.0.0.1:" << p.metrics_port() << "/metrics" << std::endl;
}

// --format chunks: the transfer alone, for measuring a source against curl or cat.
template <class Source>
int count_chunks(Source src, const sluice::pipeline_options& popts, const options& o, bool http) {
    sluice::pipeline p(src, popts);
    std::uint64_t chunks = 0, bytes = 0, objects = 0;
    int status = 0;
    std::string failure;
    try {
        say_metrics_port(p, o);
        for (auto& c : p) {
            ++chunks;
            bytes += c.data.size();
            objects += c.last;
        }
    } catch (const std::exception& e) {
        failure = e.what();
        status = 1;
        std::cerr << "sluice-probe: " << failure << "\n";
    }
    const auto f = stop_and_tabulate(p, o);
    if (o.json) {
        sluice::detail::json_writer w;
        const double s = f.seconds > 0 ? f.seconds : 1e-9;
        open_report(w, status, failure);
        w.key("objects").value(objects);
        w.key("chunks").value(chunks);
        w.key("payload_bytes").value(bytes);
        w.key("seconds").value(f.seconds);
        w.key("objects_per_s").value(double(objects) / s);
        w.key("bytes_per_s").value(double(bytes) / s);
        finish_report(w, f, http, std::nullopt);
    }
    return status;
}

}  // namespace

// Runs the pipeline to its end and reports: the per-stage table on stderr, the figures as
// JSON on stdout. Host batches (the host sink) and device batches alike.
template <class Batches>
int report(Batches batches, const sluice::pipeline_options& popts, const options& o, bool http,
           std::uint64_t budget_bytes) {
    using batch_type = typename Batches::output_type;
    constexpr bool device = std::is_same_v<batch_type, sluice::device_batch>;
    sluice::pipeline p(batches, popts);

    std::uint64_t n_records = 0, n_batches = 0, payload = 0, crc_sum = 0;
    int status = 0;
    std::string failure;
    std::ofstream keys;
    if (!o.emit_keys.empty()) {
        keys.open(o.emit_keys, std::ios::trunc);
        if (!keys) {
            std::cerr << "sluice-probe: cannot write '" << o.emit_keys << "'\n";
            return 1;
        }
    }
    // --step-ms: a simulated trainer step after each batch; the time the loop waits for
    // the next batch is what a GPU would idle.
    using clock = std::chrono::steady_clock;
    const auto loop_start = clock::now();
    auto last = loop_start;
    double waited_s = 0;
    struct step_after {
        const options& o;
        std::size_t n;
        clock::time_point& last;
        ~step_after() {
            if (o.step_ms > 0)
                std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.step_ms * double(n) / 256));
            last = clock::now();
        }
    };
    try {
        say_metrics_port(p, o);
        if (o.stop_after && *o.stop_after == 0) p.start();
        else for (auto& b : p) {
            waited_s += std::chrono::duration<double>(clock::now() - last).count();
            step_after step{o, b.size(), last};
            ++n_batches;
            if (keys.is_open()) {
                const sluice::host_batch* hb;
                if constexpr (device) hb = &b.host();
                else hb = &b;
                for (std::size_t i = 0; i < hb->size(); ++i) keys << hb->key(i) << '\n';
            }
            n_records += b.size();
            payload += b.byte_size();
            // After the batch is taken and checked: state() is the state after it.
            const bool cut = o.stop_after && n_batches == *o.stop_after;
            if (!o.crc) {
                if constexpr (device) b.synchronize();  // the copy is what is measured
                if (cut) break;
                continue;
            }
            const std::byte* data;
            const std::vector<std::uint64_t>* offs;
            if constexpr (device) {
                // The host engine's memory is readable: check what the copy wrote. A
                // GPU's is not: check the pinned batch it was copied from.
                b.synchronize();
                data = static_cast<const std::byte*>(b.device() < 0 ? b.data() : b.host().data.data());
                offs = &b.offsets();
            } else {
                data = b.data.data();
                offs = &b.offsets;
            }
            for (std::size_t i = 0; i < b.size(); ++i) {
                const auto begin = (*offs)[i], end = (*offs)[i + 1];
                crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(data + begin), end - begin);
            }
            if (cut) break;
        }
    } catch (const std::exception& e) {
        failure = e.what();
        status = 1;
    }
    if (!status && !o.save_state.empty()) {
        try {
            const std::string state = p.state();
            std::ofstream out(o.save_state, std::ios::trunc);
            out << state;
            out.flush();
            if (!out) throw sluice::error("sluice: cannot write the state to '" + o.save_state + "'");
        } catch (const std::exception& e) {
            failure = e.what();
            status = 1;
        }
    }
    if (keys.is_open()) {
        keys.flush();
        if (!keys && !status) {
            failure = "cannot write the keys to '" + o.emit_keys + "'";
            status = 1;
        }
    }
    if (status) std::cerr << "sluice-probe: " << failure << "\n";
    const auto f = stop_and_tabulate(p, o);
    if (o.json) {
        sluice::detail::json_writer w;
        const double s = f.seconds > 0 ? f.seconds : 1e-9;
        open_report(w, status, failure);
        w.key("records").value(n_records);
        w.key("batches").value(n_batches);
        w.key("payload_bytes").value(payload);
        if (o.crc) w.key("crc_sum").value(crc_sum);
        else w.key("crc_sum").value("skipped");
        w.key("seconds").value(f.seconds);
        w.key("records_per_s").value(double(n_records) / s);
        rusage ru{};
        ::getrusage(RUSAGE_SELF, &ru);
        const double cpu = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                           double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
        w.key("cpu_s").value(cpu);  // the whole process, start to end
        w.key("cpu_ms_per_record").value(n_records ? cpu * 1e3 / double(n_records) : 0.0);
        w.key("bytes_per_s").value(double(payload) / s);
        w.key("corrupt_skipped").value(total_counter(f, "corrupt"));
        if (o.step_ms > 0) {
            const double loop_s = std::chrono::duration<double>(last - loop_start).count();
            w.key("step_wait_share").value(loop_s > 0 ? waited_s / loop_s : 0.0);
        }
        w.key("sink").value(!o.device ? (o.pinned ? "pinned" : "host")
                            : *o.device < 0 ? "host engine" : "cuda:" + std::to_string(*o.device));
        finish_report(w, f, http, budget_bytes);
    }
    return status;
}

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    if (o.format == "webdataset" && o.images.empty())
        usage_error("--format webdataset is read with --images train|eval (samples of an image and a label)");
    if (!o.images.empty() && o.format != "raw" && o.format != "webdataset")
        usage_error("--images reads --format raw (one image per file) or --format webdataset");
    if (!o.images.empty() && (o.pinned || !o.write_counts.empty()))
        usage_error("--images does not go with --pinned or --write-counts");

    // http(s) and s3 sources go through fetch(), local ones through read(); one kind per
    // run, told by the patterns (list files are expanded to see what they hold).
    std::vector<std::string> kinds;
    try {
        for (auto& s : o.sources)
            if (s.starts_with("@")) {
                for (auto& e : sluice::expand({s}, o.s3)) kinds.push_back(std::move(e));
            } else {
                kinds.push_back(s);
            }
    } catch (const std::exception& e) {
        std::cerr << "sluice-probe: " << e.what() << "\n";
        return 1;
    }
    auto is_http = [](const std::string& u) {
        return u.starts_with("http://") || u.starts_with("https://") || u.starts_with("s3://");
    };
    const bool http = !kinds.empty() && is_http(kinds.front());
    for (auto& u : kinds)
        if (is_http(u) != http) usage_error("sources must be all local paths or all URLs");
    if (!o.cache.empty() && !http) usage_error("--cache is for http(s) and s3 sources (local files are read in place)");
    std::shared_ptr<const sluice::record_counts> counts;
    if (!o.counts.empty()) {
        try {
            counts = sluice::read_record_counts(o.counts);
        } catch (const std::exception& e) {
            std::cerr << "sluice-probe: " << e.what() << "\n";
            return 1;
        }
    }
    sluice::plan_options plan{.epochs = o.epochs, .seed = o.seed, .rank = o.rank, .world = o.world,
                              .share = o.share, .counts = counts, .counts_dir = o.counts_dir};
    if (!o.write_counts.empty()) plan = {.rank = 0, .world = 1};  // every shard, once
    const auto order = o.ordered || o.deterministic ? sluice::ordering::ordered : sluice::ordering::unordered;
    auto shards = sluice::list(o.sources, o.s3) | sluice::plan(plan);
    // The transfer stages from the flags; the sweep runs them with its own k, part size
    // (every part that size), no cache and unordered.
    auto fetch_with = [&](unsigned k, unsigned min_k, std::uint64_t part, std::uint64_t max_part, sluice::ordering ord,
                          const std::string& cache, const std::string& shared_limit) {
        // Set field by field: GCC 12 warned (-Wmaybe-uninitialized, a false alarm) about the
        // std::function inside cache_options of a designated-initializer temporary.
        sluice::fetch_options f;
        f.concurrency = k;
        f.min_concurrency = min_k;
        f.order = ord;
        f.chunk_size = std::min<std::size_t>(o.chunk_size, 1u << 20);
        f.part_size = part;
        f.max_part_size = max_part;
        f.parts_in_flight = o.parts_in_flight;
        f.parallel_parts_below_bytes_per_s = o.parallel_parts_below;
        f.retries = o.retries;
        f.stall = std::chrono::seconds(o.stall);
        f.ca_file = o.ca_file;
        f.insecure = o.insecure;
        f.s3 = o.s3;
        f.cache.dir = cache;
        f.cache.max_bytes = o.cache_bytes;
        f.shared_limit = shared_limit;
        f.out = {16, o.channel_bytes};
        return sluice::fetch(f);
    };
    auto read_with = [&](unsigned k, sluice::ordering ord) {
        return sluice::read({.chunk_size = o.chunk_size, .concurrency = k, .order = ord, .map = o.map,
                             .map_min_bytes = o.map_min_bytes, .out = {16, o.channel_bytes}});
    };
    auto src = http ? shards | fetch_with(o.in_flight, o.min_in_flight, o.part_size, o.max_part_size, order, o.cache, o.shared_limit)
                    : shards | read_with(o.files_in_flight, order);
    if (o.sweep) {
        // Each point: the sources again and again (plan's epochs) with k in flight.
        const probe_sweep::maker make = [&](unsigned k, std::uint64_t part) {
            auto again = sluice::list(o.sources, o.s3) | sluice::plan({.epochs = 1000000});
            return http ? again | fetch_with(k, k, part, part, sluice::ordering::unordered, "", "")
                        : again | read_with(k, sluice::ordering::unordered);
        };
        try {
            return probe_sweep::run(make, {.http = http,
                                           .max_k = o.sweep_max,
                                           .seconds = o.sweep_seconds,
                                           .part_size = o.part_size,
                                           .target_rate = o.target_rate,
                                           .chart = o.chart,
                                           .json = o.json});
        } catch (const std::exception& e) {
            std::cerr << "sluice-probe: " << e.what() << "\n";
            return 1;
        }
    }
    if (o.format == "chunks") return count_chunks(src, exports(o, {.runtime = {.cpu_threads = o.threads}}), o, http);
    // The parsed formats inflate gzip'd shards first: a gunzip stage of their own (it passes
    // other shards through), given the same byte budget as every other channel.
    const sluice::decode_options decode{.on_corrupt = o.on_corrupt,
                                        .gzip = sluice::compression::none,
                                        .max_record_bytes = o.max_record_bytes,
                                        .out = {1024, o.channel_bytes}};
    auto inflated = [&] { return src | sluice::gunzip({.on_corrupt = o.on_corrupt, .out = {16, o.channel_bytes}}); };
    auto records = o.format == "raw"        ? src | sluice::raw({.on_corrupt = o.on_corrupt,
                                                                     .max_record_bytes = o.max_record_bytes,
                                                                     .out = sluice::channel_limits{64, o.channel_bytes}})
                   : o.format == "tar"      ? inflated() | sluice::tar(decode)
                   : o.format == "tfrecord" ? inflated() | sluice::tfrecord(decode)
                   : o.format == "recordio" ? inflated() | sluice::recordio(decode)
                                            : inflated() | sluice::lines(decode);
    if (!o.write_counts.empty()) {
        try {
            const auto n = sluice::count_records(records, sluice::expand(o.sources, o.s3),
                                                 {.runtime = {.cpu_threads = o.threads}});
            sluice::write_record_counts(o.write_counts, n);
            std::uint64_t total = 0;
            for (auto& [name, c] : n) total += c;
            std::cerr << "sluice-probe: " << n.size() << " shards, " << total << " records: counts written to '"
                      << o.write_counts << "'\n";
            return 0;
        } catch (const std::exception& e) {
            std::cerr << "sluice-probe: " << e.what() << "\n";
            return 1;
        }
    }
    if (o.shuffle > 0) records = records | sluice::shuffle({.buffer = o.shuffle, .seed = o.seed.value_or(0)});
    auto batches = records | sluice::batch({.size = o.batch, .drop_last = o.drop_last, .concurrency = o.collate_threads, .out = {4, o.channel_bytes}});
    if (!o.images.empty()) {
#if defined(SLUICE_HAVE_IMAGE)
        const unsigned threads =
            o.decode_threads ? o.decode_threads : std::max(1u, o.threads ? o.threads : sluice::detail::usable_cpus());
        sluice::image_options io{.mode = o.images == "train" ? sluice::image_mode::train : sluice::image_mode::eval,
                                 .size = o.image_size,
                                 .resize = o.image_size * 8 / 7,
                                 .seed = o.seed,
                                 .on_corrupt = o.on_corrupt,
                                 .concurrency = threads,
                                 .order = order};
        // Loose files in ImageFolder's layout (sluice-gen --images): the label is the
        // number in the directory name "class-LLL"; -1 elsewhere.
        io.label_from = [](const std::string& url) -> std::int64_t {
            const auto at = url.rfind("/class-");
            if (at == std::string::npos) return -1;
            std::int64_t v = -1;
            const char* p = url.data() + at + 7;
            std::from_chars(p, url.data() + url.size(), v);
            return v;
        };
        if (o.format == "webdataset") io.label_from = nullptr;  // the .cls field
        auto images = o.format == "raw" ? records | sluice::decode_images(io) : inflated() | sluice::webdataset(decode) | sluice::decode_images(io);
        if (o.shuffle > 0) images = images | sluice::shuffle({.buffer = o.shuffle, .seed = o.seed.value_or(0)});
        batches = images | sluice::batch_images({.size = o.batch,
                                                 .drop_last = o.drop_last,
                                                 .layout = o.nhwc ? sluice::tensor_layout_kind::nhwc : sluice::tensor_layout_kind::nchw,
                                                 .dtype = o.as_float ? sluice::pixel_type::float32 : sluice::pixel_type::uint8,
                                                 .mean = o.as_float ? std::array{0.485f, 0.456f, 0.406f} : std::array{0.f, 0.f, 0.f},
                                                 .std = o.as_float ? std::array{0.229f, 0.224f, 0.225f} : std::array{1.f, 1.f, 1.f},
                                                 .concurrency = o.collate_threads,
                                                 .out = {4, o.channel_bytes}});
#else
        usage_error("--images needs the image layer (libjpeg62-turbo-dev, libspng-dev, libopencv-imgproc-dev); this "
                    "sluice-probe was built without it");
#endif
    }
    // What the configuration bounds: the channels' bytes (read or fetch, gunzip for the
    // parsed formats, the format, batch). On top: the shuffle buffer (records), one chunk
    // per reader, the batch being built and the batch the consumer holds; freed buffers
    // wait in the runtime's pool for reuse (not counted: they are memory that was in use a
    // moment before).
    const std::uint64_t budget_bytes = o.memory ? o.memory : (o.format == "raw" ? 3ull : 4ull) * o.channel_bytes;

    sluice::pipeline_options popts = exports(o, {.runtime = {.cpu_threads = o.threads}});
    std::vector<std::string> states;
    for (auto& file : o.resume) {
        std::ifstream in(file);
        std::ostringstream blob;
        blob << in.rdbuf();
        if (!in || blob.str().empty()) {
            std::cerr << "sluice-probe: cannot read the state '" << file << "'\n";
            return 1;
        }
        states.push_back(blob.str());
    }
    try {
        if (states.size() == 1) popts.resume = states[0];
        else if (states.size() > 1) popts.resume = sluice::merge_states(states);
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
    try {
        if (o.pinned) {
#if defined(SLUICE_HAVE_CUDA)
            batches = records | sluice::batch({.size = o.batch, .drop_last = o.drop_last, .memory = sluice::pinned_memory(),
                                               .concurrency = o.collate_threads, .out = {4, o.channel_bytes}});
#else
            throw sluice::error("sluice: --pinned needs the CUDA engine; this sluice-probe was built without the CUDA toolkit");
#endif
        }
        if (o.device) {
            std::shared_ptr<sluice::copy_engine> engine;
            if (*o.device < 0) {
                engine = std::make_shared<sluice::host_engine>();
            } else {
#if defined(SLUICE_HAVE_CUDA)
                engine = std::make_shared<sluice::cuda_engine>(*o.device);
#else
                throw sluice::error("sluice: --device " + std::to_string(*o.device) +
                                    " needs the CUDA engine; this sluice-probe was built without the CUDA toolkit "
                                    "(--device host runs the same path with the host engine)");
#endif
            }
            return report(batches | sluice::to_device({.device = *o.device, .ring = o.ring}, engine), popts, o, http,
                          budget_bytes);
        }
    } catch (const std::exception& e) {  // no GPU, no pinned memory: before anything ran
        std::cerr << "sluice-probe: " << e.what() << "\n";
        if (o.json) {
            sluice::detail::json_writer w;
            open_report(w, 1, e.what());
            w.end_object();
            std::cout << w.str() << std::endl;
        }
        return 1;
    }
    return report(batches, popts, o, http, budget_bytes);
}
