#pragma once
// sluice::fetch: http:// and https:// objects through libcurl, streamed as chunks, many in
// flight, every transient failure retried (resuming where it stopped).

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/io/cache.hpp>
#include <sluice/io/s3.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace sluice {

struct fetch_options {
    /// Requests in flight at most (objects, and parts of large objects). On 503 or 429
    /// the limit halves, at most once per round of requests and not below
    /// `min_concurrency`; each success adds 1/limit (about one per round), back up to this
    /// (AIMD, as TCP does with losses).
    unsigned concurrency = 64;
    unsigned min_concurrency = 4;
    /// Objects in order of their shards (each waits for the one before it to be handed
    /// on; later ones download meanwhile, up to two chunks per request), or as completed.
    ordering order = ordering::unordered;
    /// Bytes per chunk handed downstream; a download holds about two while downstream is
    /// full (then it is paused, not buffered), a part waiting its turn up to its room.
    std::size_t chunk_size = 1u << 20;
    /// Large objects download as ranged parts, `parts_in_flight` at a time per object,
    /// delivered in order. A part waiting its turn behind the one being read goes on
    /// downloading, into room the stage keeps for such parts: as many bytes as `out.bytes`
    /// (64 MiB by default, and where `out.bytes` is 0), first come first served over all its
    /// objects, each part at most its share (the room over `parts_in_flight` - 1), so one
    /// object's parts come at `parts_in_flight`
    /// times one connection's rate where a store serves each connection at its own (S3:
    /// about 100 MB/s each). A part that finds no room left holds two chunks and pauses
    /// until its turn. Under a memory budget (pipeline_options::memory) the room is a
    /// channel's share of it (at most `out.bytes`): the division counts it as one more
    /// channel.
    /// The first request asks for `part_size` bytes; its Content-Range gives the size.
    /// Each part after it is twice the one before, up to `max_part_size` and up to what
    /// lets the parts behind the first fit in the room together (21 MiB with the defaults):
    /// a 1 GiB object takes 50 requests, not 128. A part cut off resumes from its last
    /// byte. `max_part_size` at or below `part_size`: every part is `part_size`. A server
    /// without range support answers 200 and the object streams whole.
    bool parallel_parts = true;
    std::uint64_t part_size = 8u << 20;
    std::uint64_t max_part_size = 64u << 20;
    unsigned parts_in_flight = 4;
    /// ... but the parts after an object's first go in parallel only once the object has
    /// come at below this many bytes per second (from its first chunk on, each later
    /// part's wait for its answer counted, its waits for the reader or its turn not;
    /// judged from 10 ms of that time on, while a new connection's windows grow), and
    /// then for the rest of it; 0: always (as before this option). From a faster
    /// connection its parts come one after another: there one connection is as fast as the
    /// receiving core, and parts in parallel only cost CPU (on loopback four in flight
    /// took 1.8 x the CPU of one for the same rate, their bytes leaving the cache while
    /// they waited in four sockets). 500 MB/s is five times what S3 gives one connection.
    /// Nothing without `parallel_parts`.
    std::uint64_t parallel_parts_below_bytes_per_s = 500'000'000;
    /// Retries of one object after a transient failure (connection error, timeout, stall,
    /// a cut body, 429, 500, 502, 503, 504), with capped exponential backoff and full
    /// jitter. A cut body resumes from its last byte (Range + If-Match on the ETag).
    unsigned retries = 8;
    std::chrono::milliseconds backoff_base{100};
    std::chrono::milliseconds backoff_cap{5000};
    /// No byte for this long, from the request on: the transfer fails (and is retried).
    /// Timed from the last byte (header or body) that came, found within half a second
    /// after the limit; a transfer held for a slow reader is not timed. 0: no limit.
    /// Connecting is timed by `connect_timeout`; the body of a redirect, which libcurl
    /// skips, by libcurl's low-speed check (an average over its last seconds).
    std::chrono::seconds stall{30};
    std::chrono::milliseconds connect_timeout{10000};
    long max_redirects = 5;
    /// TLS: verified by default; a CA bundle file to trust instead of the system's; or,
    /// explicitly, no verification at all.
    std::string ca_file = {};
    bool insecure = false;
    /// For s3:// URLs: endpoint, region, credentials, addressing (io/s3.hpp). Requests
    /// are signed (SigV4) unless `s3.anonymous`; everything above applies to them too.
    s3_options s3 = {};
    /// A local cache of what is fetched (io/cache.hpp): with `cache.dir` set, an object
    /// found there is read from local disk, and one that is not is downloaded there once
    /// for the node (other workers and processes sharing the directory wait for it) and
    /// then read from there, so later epochs and other ranks read it locally.
    cache_options cache = {};
    /// A directory where the processes of one node share one request limit: the AIMD limit
    /// above, its halvings and a back-off of `backoff_base / 5` after each halving, so N ranks
    /// together keep within one limit and answer a 503 storm once (file
    /// "<dir>/.sluice-requests", io/detail/node_limit.hpp; pass the cache's directory).
    /// `concurrency` then bounds this process, and the node's limit rises to the largest
    /// `concurrency` and falls to the smallest `min_concurrency` its processes give.
    /// Empty: this stage's own limit, as if alone.
    std::string shared_limit = {};
    /// Capacity of the output channel, in chunks and bytes.
    channel_limits out = {16, 64u << 20};
};

namespace detail {
/// What one run of a fetch stage shares among its workers (made by its setup).
struct fetch_run;
struct knob;
struct budget_share;
/// `shares`: where the stage asks for its share of a memory budget (null: no budget).
inline std::shared_ptr<fetch_run> make_fetch_run(const fetch_options& o, std::vector<knob>* knobs = nullptr,
                                                 std::vector<budget_share>* shares = nullptr);
inline void offer_remote_access(stage_setup& s, const std::shared_ptr<fetch_run>& run, const fetch_options& o);
/// Says where the stage hands its chunks over (state.hpp, delivers_on_loop): with a cache,
/// its hits are read on the CPU pool.
inline void note_fetch_delivery(stage_setup& s, const fetch_run& run);
/// One worker of a fetch stage: its objects' requests, retries, parts and cache copies
/// (io/impl/fetch.hpp).
template <class = void>  // a coroutine: compiled only where used (see make_stage)
task<void> fetch_worker(stage_context<shard, chunk>& ctx, fetch_run& run, fetch_options o);
}  // namespace detail


/// Takes: shards whose url is http://, https:// or s3://bucket/key (see s3_options). Gives: each object's bytes as chunks
/// (the last one flagged), in order per object; `concurrency` objects download at once and
/// their chunks interleave (decoders keep per-shard state).
/// Backpressure: each download holds at most about two chunks; when downstream is full
/// the transfer is paused, not buffered. The parts of a large object behind the one being
/// read hold up to their whole part meanwhile, within `out.bytes` over the stage (see
/// fetch_options::parts_in_flight).
/// Errors: a sluice::source_error naming the URL and what failed ("HTTP 404", "Couldn't
/// connect to server (...) after 9 attempts", the byte offset of a failed resume), after
/// every chunk delivered before it; 4xx other than 429 are not retried. An object whose
/// ETag changes between a cut and its resumption is an error, not two versions mixed.
/// Stats: requests, parts (ranged requests after an object's first), retries, resumes,
/// throttled (429/503).
/// Cancellation: stops at the next chunk; transfers in flight are abandoned.
/// Example: `sluice::list("https://host/shards/{0000..0099}.tar") | sluice::plan() | sluice::fetch() | sluice::webdataset()`
template <class = void>  // compiled only where used (see make_stage)
stage<shard, chunk> fetch(fetch_options o = {}) {
    return make_stage<shard, chunk>(
        "fetch", {.concurrency = std::max(1u, o.concurrency), .order = o.order, .on = pool::io, .out = o.out},
        [o](stage_setup& s) {
            auto run = detail::make_fetch_run(o, s.internal.knobs, s.internal.shares);
            detail::offer_remote_access(s, run, o);  // for plan's record counting
            detail::note_fetch_delivery(s, *run);
            return run;
        },
        [o](stage_context<shard, chunk>& ctx, detail::fetch_run& run) { return detail::fetch_worker(ctx, run, o); });
}

}  // namespace sluice

#include <sluice/io/impl/fetch.hpp>
