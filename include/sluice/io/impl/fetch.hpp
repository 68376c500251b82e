#pragma once
// fetch()'s worker: the part scheduler, retries, resumption, permits and cache copies of
// one object at a time. Included at the end of io/http.hpp (not on its own).

#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/io/cache.hpp>
#include <sluice/core/detail/shard_counting.hpp>
#include <sluice/core/detail/tuning.hpp>
#include <sluice/io/detail/aimd.hpp>
#include <sluice/io/detail/curl_engine.hpp>
#include <sluice/io/detail/curl_errors.hpp>
#include <sluice/io/detail/retry.hpp>
#include <sluice/io/detail/aws_credentials.hpp>
#include <sluice/io/detail/aws_http.hpp>  // request_failure: S3's XML error replies
#include <sluice/io/detail/s3_config.hpp>
#include <sluice/io/detail/s3_sign.hpp>
#include <sluice/io/http.hpp>
#include <sluice/io/local.hpp>

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <vector>
#include <cctype>
#include <cstring>
#include <thread>
#include <utility>
#include <condition_variable>

namespace sluice::detail {


/// What a stop must reach in one fetch worker besides its channels: its transfers, its
/// backoff timer and its wait for a permit. The stop callback posts `fire` to the I/O
/// loop. The worker sets and clears what `fire` reaches as it goes, under `m`: it runs on
/// the I/O loop too, except for its cache disk work on the CPU pool, where it may also
/// unwind (and destroy what `transfers` reaches) while `fire` runs.
struct fetch_stop_hooks {
    std::mutex m;
    std::function<void()> transfers;     // cancels the transfers in flight
    asio::steady_timer* sleeping = nullptr;
    std::function<void()> permit_wait;   // ends a wait for a permit
    void fire() {
        std::lock_guard lock(m);
        if (transfers) transfers();
        if (sleeping) sleeping->cancel();  // timers live on the I/O loop, as fire does
        if (permit_wait) permit_wait();
    }
    void set_transfers(std::function<void()> f) {
        std::lock_guard lock(m);
        transfers = std::move(f);
    }
    void set_sleeping(asio::steady_timer* t) {
        std::lock_guard lock(m);
        sleeping = t;
    }
    void set_permit_wait(std::function<void()> f) {
        std::lock_guard lock(m);
        permit_wait = std::move(f);
    }
    void clear() {
        std::lock_guard lock(m);
        transfers = nullptr;
        sleeping = nullptr;
        permit_wait = nullptr;
    }
};

/// Waits on the coroutine's executor; a stop (through `hooks`) cuts it short.
struct sleep_for {
    std::chrono::steady_clock::duration d;
    fetch_stop_hooks* hooks = nullptr;
    std::optional<asio::steady_timer> timer;
    bool await_ready() const noexcept { return d <= std::chrono::steady_clock::duration::zero(); }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
        timer.emplace(h.promise().ex, d);
        if (hooks) hooks->set_sleeping(&*timer);
        timer->async_wait([h](const std::error_code&) { h.resume(); });
    }
    void await_resume() noexcept {
        if (hooks) hooks->set_sleeping(nullptr);
    }
};

inline std::string http_failure(const http_transfer& t) {
    return request_failure(t.result, t.errbuf, t.status, t.error_body);
}

/// Room, in bytes, that a part of a large object holds beyond its two chunks while it
/// waits its turn (taken from fetch_run::part_room when the part starts, given back when
/// it goes): what it asks for or what is left, in whole `unit`s (chunks).
class part_room_lease {
public:
    part_room_lease() = default;
    part_room_lease(std::atomic<std::uint64_t>& room, std::uint64_t want, std::uint64_t unit = 1) : room_(&room) {
        auto cur = room.load(std::memory_order_relaxed);
        do bytes_ = std::min(cur, want) / unit * unit;
        while (bytes_ && !room.compare_exchange_weak(cur, cur - bytes_, std::memory_order_relaxed));
    }
    part_room_lease(part_room_lease&& o) noexcept : room_(o.room_), bytes_(std::exchange(o.bytes_, 0)) {}
    part_room_lease& operator=(part_room_lease&& o) noexcept {
        if (this != &o) {
            give_back();
            room_ = o.room_;
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    ~part_room_lease() { give_back(); }
    std::uint64_t bytes() const noexcept { return bytes_; }

private:
    void give_back() noexcept {
        if (bytes_) room_->fetch_add(std::exchange(bytes_, 0), std::memory_order_relaxed);
    }
    std::atomic<std::uint64_t>* room_ = nullptr;
    std::uint64_t bytes_ = 0;
};

/// The bytes of a chunk the stage asks for (fetch_options::chunk_size, 1 MiB where 0).
inline std::size_t chunk_bytes(const fetch_options& o) noexcept { return o.chunk_size ? o.chunk_size : (1u << 20); }

// One byte range of an object in flight: [from, to] (to inclusive; npos: to the end).
struct http_part {
    std::uint64_t from = 0, to = http_request::npos;
    std::shared_ptr<http_transfer> t;
    bool permit = false;  // holds one of the limiter's permits
    std::uint64_t seq = 0;  // the permit's sequence number
    bool reread = false;    // credentials read again after S3 refused this part's
    part_room_lease room = {};  // what it may hold beyond two chunks while it waits its turn
};

struct fetch_state {
    curl_engine& eng;
    const fetch_options& o;
    stage_context<shard, chunk>& ctx;
    std::atomic<std::uint64_t>& requests;
    std::shared_ptr<const s3_config> s3;  // the stage's, once its first s3:// URL came

    /// The bucket and key of an s3:// URL; nothing for other URLs.
    static std::optional<s3_location> s3_target(const std::string& url) {
        auto loc = parse_s3_url(url);
        if (!loc) {
            if (url.starts_with("s3://")) throw source_error(url, "not an s3://bucket/key URL:");
            return std::nullopt;
        }
        if (loc->key.empty() || loc->key.ends_with('/'))
            throw source_error(url, "cannot fetch a prefix (list it: sluice::list gives its objects):");
        return loc;
    }

    /// The HTTP URL and signature of a shard's URL: itself, or S3's for s3:// (with the
    /// credentials now: `s3` is set by then).
    std::pair<std::string, s3_auth> locate(const std::string& url) {
        auto loc = s3_target(url);
        if (!loc) return {url, {}};
        return {s3_http_url(*s3, *loc), auth_of(*s3)};
    }

    void start(http_part& p, const std::pair<std::string, s3_auth>& where, const std::string& etag) {
        http_request req;
        req.url = where.first;
        req.auth = s3 && where.second.sign ? auth_of(*s3) : where.second;  // the credentials now
        req.from = p.from;
        req.to = p.to;
        req.if_match = etag;
        req.chunk_size = chunk_bytes(o);
        req.hold = 2 + static_cast<std::size_t>(p.room.bytes() / req.chunk_size);
        req.connect_timeout_ms = static_cast<long>(o.connect_timeout.count());
        req.stall_seconds = static_cast<long>(o.stall.count());
        req.max_redirects = o.max_redirects;
        req.verify_tls = !o.insecure;
        req.ca_file = !o.ca_file.empty() ? o.ca_file : where.second.ca_bundle;
        req.mem = ctx.rt.buffers();  // shared: the engine's lanes may outlive this pipeline's runtime
        p.t = std::make_shared<http_transfer>(std::move(req));
        requests.fetch_add(1, std::memory_order_relaxed);
        eng.add(p.t);
    }
};

/// The copy being written failed (a full disk): the object is fetched again, delivered as
/// it streams, with no copy. Nothing of it was delivered before.
struct fetch_without_copy {};

/// How often a worker waiting for another's download of the same object looks at it.
inline constexpr std::chrono::milliseconds coalesce_poll{10};

struct fetch_run {
    std::shared_ptr<aimd_limit> limit;
    std::atomic<std::uint64_t> throttled{0};  // 503s and 429s, for the tuner
    std::atomic<std::uint64_t> objects_done{0}, bytes_done{0};  // what a request holds, for the tuner
    std::atomic<std::uint64_t> part_size{8u << 20};  // fetch_options::part_size, or the tuner's
    // What the parts of large objects waiting their turn may hold beyond their two chunks,
    // over the stage's workers (see fetch_options::parts_in_flight), and one part's share of
    // it: the most room a part takes, and the size parts grow to at most, so that the parts
    // of one object fit in it (0: no room, no cap).
    std::atomic<std::uint64_t> part_room{0};
    std::uint64_t part_grow_max = 0;
    std::shared_ptr<local_cache> cache;  // null without fetch_options::cache
    std::mutex s3_m;
    std::shared_ptr<const s3_config> s3;  // resolved once for the stage, at its first s3:// URL
};

inline void note_refreshes(const s3_config& c, stage_stats& stats) {
    if (!c.credentials || !c.credentials->refreshable()) return;
    auto raise = [](std::atomic<std::uint64_t>& to, std::uint64_t v) {  // workers race: never back
        for (auto cur = to.load(std::memory_order_relaxed); cur < v && !to.compare_exchange_weak(cur, v);) {
        }
    };
    raise(stats.counter("credential_refreshes"), c.credentials->refreshes());
    raise(stats.counter("credential_refresh_failures"), c.credentials->refresh_failures());
}

/// Runs `f` (it blocks: a credential source) on the CPU pool, not on the I/O loop every
/// transfer shares; back on the I/O loop, a stop wins over what `f` threw.
template <class F>
task<void> on_cpu_pool(stage_context<shard, chunk>& ctx, F f) {
    std::exception_ptr err;
    co_await sluice::switch_to{ctx.rt.executor_for(pool::cpu)};
    try {
        f();
    } catch (...) {
        err = std::current_exception();
    }
    co_await sluice::switch_to{ctx.rt.executor_for(pool::io)};
    if (ctx.stopping()) throw stopped{};  // a stop that cut a credential request short
    if (err) std::rethrow_exception(err);
}

/// The stage's S3 settings and credentials, resolved by the first worker that needs them,
/// refreshed when due. Blocking (the credential sources are network calls): on the CPU pool.
/// The figures show which source the credentials came from and how often they were read
/// again.
inline std::shared_ptr<const s3_config> s3_for(fetch_run& run, const fetch_options& o, const std::string& url,
                                               stage_stats& stats, std::stop_token stop) {
    std::shared_ptr<const s3_config> c;
    {
        std::lock_guard lock(run.s3_m);
        if (!run.s3) {
            run.s3 = std::make_shared<const s3_config>(resolve_s3(o.s3, url, stop));
            stats.note("credentials", run.s3->where());
        }
        c = run.s3;
    }
    refresh_credentials(*c, url, stop);
    note_refreshes(*c, stats);
    return c;
}


inline std::shared_ptr<fetch_run> make_fetch_run(const fetch_options& o, std::vector<knob>* knobs,
                                                 std::vector<budget_share>* shares) {
    auto run = std::make_shared<fetch_run>();
    // Room for the parts waiting their turn: as much as the output channel holds, so the
    // stage holds at most twice that beyond its requests' two chunks each. Under a memory
    // budget (pipeline_options::memory) the output channel holds its share of the budget,
    // and so does the room: the division counts it as one more channel.
    if (o.parallel_parts && o.parts_in_flight > 1) {
        const std::uint64_t own = o.out.bytes ? o.out.bytes : std::uint64_t{64} << 20;
        auto size = [chunk = std::uint64_t{chunk_bytes(o)}, waiting = o.parts_in_flight - 1](fetch_run& r, std::uint64_t room) {
            r.part_room = room;
            // The parts of one object fit in the room only if none is larger than its share.
            r.part_grow_max = std::max(chunk, room / waiting / chunk * chunk);
        };
        if (!shares) size(*run, own);
        else
            shares->push_back({.what = "fetch: room for the parts of large objects waiting their turn",
                               .give = [size, run](std::uint64_t share) { size(*run, share); },
                               .as_channel = true,
                               .most = own});
    }
    run->limit = std::make_shared<aimd_limit>(o.concurrency, o.min_concurrency);
    if (!o.shared_limit.empty())
        // After a halving the node starts nothing for a fifth of backoff_base (20 ms by
        // default): the requests in flight drain meanwhile. A whole backoff_base (100 ms)
        // cost 1.8 x the time of 400 small objects behind a throttling server for no fewer
        // 503s (tests/support/fault_server.py --busy-503 8 --ttfb-ms 20).
        run->limit->share(std::make_unique<node_limit>(o.shared_limit, o.concurrency, o.min_concurrency, o.backoff_base / 5));
    if (!o.cache.dir.empty()) run->cache = std::make_shared<local_cache>(o.cache);
    run->part_size = std::max<std::uint64_t>(o.part_size, 1);
    if (knobs && o.concurrency > 1) {
        // Requests in flight, between the floor and the workers there are; a request holds
        // up to three chunks (two handed on, one filling).
        std::weak_ptr<aimd_limit> w = run->limit;
        knobs->push_back({.stage = "fetch",
                          .name = "concurrency",
                          .min = std::max(1u, std::min(o.min_concurrency, o.concurrency)),
                          .max = o.concurrency,
                          .start = std::min(o.concurrency, 8u),
                          .bytes_each = 3 * std::uint64_t{chunk_bytes(o)},
                          // Three chunks, or three objects where objects are smaller.
                          .bytes_now = [wr = std::weak_ptr<fetch_run>(run), chunk = std::uint64_t{chunk_bytes(o)}]() -> std::uint64_t {
                              auto r = wr.lock();
                              if (!r) return 3 * chunk;
                              const auto n = r->objects_done.load(std::memory_order_relaxed);
                              if (!n) return 3 * chunk;
                              return 3 * std::min(chunk, r->bytes_done.load(std::memory_order_relaxed) / n);
                          },
                          .get = [w] { auto l = w.lock(); return l ? l->max() : 0u; },
                          .set = [w](unsigned v) { if (auto l = w.lock()) l->set_max(v); },
                          .pressure = &run->throttled});
    }
    constexpr std::uint64_t mib = 1u << 20;
    if (knobs && o.parallel_parts && o.max_part_size <= o.part_size && o.part_size >= mib && o.part_size % mib == 0) {
        // Fixed parts only (growing parts reach max_part_size after a few doublings
        // whatever the first is). After the requests in flight (the tuner climbs one knob
        // at a time, in this order): the part size, in MiB, from the one given up to 64 MiB
        // (or the one given, if larger): fewer, larger parts cost fewer requests where one connection is fast
        // (on loopback 64 MiB parts took a 1 GiB object in 0.29-0.31 s against 0.36-0.38 s
        // with 8 MiB, bench/RESULTS.md issue 17); smaller ones save nothing, so its floor
        // is where it starts and it only climbs. A part streams through the same few
        // chunks whatever its size, and what waiting parts hold beyond those comes from
        // the stage's room (fetch_run::part_room, a channel's share under a budget): no memory of its
        // own. A change applies from the next part.
        std::weak_ptr<fetch_run> w = run;
        const auto given = static_cast<unsigned>(o.part_size / mib);
        knobs->push_back({.stage = "fetch",
                          .name = "part_size_mib",
                          .min = given,
                          .max = std::max(given, 64u),
                          .start = given,
                          .bytes_each = 0,
                          .bytes_now = nullptr,
                          .get = [w] { auto r = w.lock(); return r ? static_cast<unsigned>(r->part_size.load() / mib) : 0u; },
                          .set = [w](unsigned v) { if (auto r = w.lock()) r->part_size.store(std::uint64_t{v} * mib); },
                          .pressure = &run->throttled});
    }
    return run;
}

/// fetch's access to objects by offset, for plan's record counting
/// (core/detail/shard_counting.hpp): ranged GETs on one easy handle (its connection kept),
/// signed for s3:// with the stage's credentials, transient failures retried as fetch
/// retries them. A server that ignores Range is an error: counting would read every byte.
class remote_access final : public shard_access {
public:
    remote_access(std::shared_ptr<fetch_run> run, fetch_options o, std::stop_token stop)
        : run_(std::move(run)), o_(std::move(o)), stop_(std::move(stop)), e_(curl_easy()) {}
    ~remote_access() override {
        if (e_) curl_easy_cleanup(e_);
    }
    remote_access(const remote_access&) = delete;
    remote_access& operator=(const remote_access&) = delete;

    shard_facts facts(const std::string& url) override {
        s3_reply r;
        shard_facts f;
        if (get(url, 0, 0, r, /*probe=*/true) == reply::whole) {
            f.size = r.body.size();  // a server that answers the whole of a small object
        } else if (r.status == 416) {
            f.size = 0;  // no byte 0: the object is empty
        } else {  // "bytes 0-0/SIZE"
            const auto total = header(r.headers, "content-range");
            const auto slash = total.rfind('/');
            std::uint64_t n = 0;
            const auto digits = slash == std::string::npos ? std::string() : total.substr(slash + 1);
            bool ok = !digits.empty() && digits.size() < 20;
            for (char c : digits) ok = ok && c >= '0' && c <= '9', n = n * 10 + static_cast<unsigned>(c - '0');
            if (!ok)
                throw source_error(url, "cannot count records: the server did not say the object's size (Content-Range '" +
                                            total.substr(0, 64) + "') for");
            f.size = n;
        }
        f.version = header(r.headers, "etag");
        if (f.version.empty()) f.version = header(r.headers, "last-modified");
        return f;
    }
    /// A header and a few after it: a shard of records over 4 KiB costs one small request
    /// per record, not its bytes (a tar of 16 KiB members: a quarter of them).
    std::size_t window() const override { return 4u << 10; }
    unsigned parallel() const override { return 32; }
    std::size_t read(const std::string& url, std::uint64_t offset, std::byte* into, std::size_t n) override {
        if (n == 0) return 0;
        s3_reply r;
        const bool whole = get(url, offset, offset + n - 1, r, false) == reply::whole;
        std::string_view body = r.body;
        if (whole) body = offset < body.size() ? body.substr(static_cast<std::size_t>(offset)) : std::string_view();
        const std::size_t got = std::min(n, body.size());
        std::memcpy(into, body.data(), got);
        return got;
    }

private:
    /// The value of the last response's header `name` (lower case), trimmed; empty if none.
    static std::string header(const std::string& all, std::string_view name) {
        std::string out;
        std::size_t at = 0;
        while (at < all.size()) {
            std::size_t end = all.find('\n', at);
            if (end == std::string::npos) end = all.size();
            std::string_view line(all.data() + at, end - at);
            at = end + 1;
            if (line.starts_with("HTTP/")) out.clear();  // a new response (after a redirect)
            const auto colon = line.find(':');
            if (colon != name.size()) continue;
            bool same = true;
            for (std::size_t i = 0; i < colon && same; ++i)
                same = std::tolower(static_cast<unsigned char>(line[i])) == name[i];
            if (!same) continue;
            line.remove_prefix(colon + 1);
            while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
            while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
            out = std::string(line);
        }
        return out;
    }

    std::pair<std::string, s3_auth> where(const std::string& url) {
        auto loc = fetch_state::s3_target(url);
        if (!loc) return {url, {}};
        std::shared_ptr<const s3_config> c;
        {
            std::lock_guard lock(run_->s3_m);
            if (!run_->s3) run_->s3 = std::make_shared<const s3_config>(resolve_s3(o_.s3, url, stop_));
            c = run_->s3;
        }
        refresh_credentials(*c, url, stop_);
        return {s3_http_url(*c, *loc), auth_of(*c)};
    }

    enum class reply { range, whole };

    // GET bytes [from, to]: the range (206; for the `probe` of the size, 416 too: an empty
    // object), or the whole object where the server answers 200 with all of it (small
    // objects; a large one overflows the small-reply limit and is refused: counting would
    // read every byte).
    reply get(const std::string& url, std::uint64_t from, std::uint64_t to, s3_reply& r, bool probe) {
        const backoff_policy retry{o_.retries, o_.backoff_base, o_.backoff_cap};
        for (unsigned attempt = 0;; ++attempt) {
            r = s3_reply{};
            const auto [http, auth] = where(url);
            blocking_request q;
            q.url = http;
            q.auth = auth;
            q.headers = {"Range: bytes=" + std::to_string(from) + "-" + std::to_string(to)};
            q.ca_file = !o_.ca_file.empty() ? o_.ca_file : auth.ca_bundle;
            q.verify_tls = !o_.insecure;
            q.max_redirects = o_.max_redirects;
            q.connect_timeout_ms = static_cast<long>(o_.connect_timeout.count());
            q.timeout_ms = std::max<long>(60000, static_cast<long>(o_.stall.count()) * 1000);
            q.stall_seconds = static_cast<long>(o_.stall.count());  // a link cut mid-request: as fetch's transfers
            q.stop = stop_;
            blocking_call(q, r, e_);
            if (stop_.stop_requested()) throw stopped{};
            if (r.result == CURLE_OK && (r.status == 206 || (probe && r.status == 416))) return reply::range;
            if (r.result == CURLE_OK && r.status == 200) return reply::whole;
            if (r.status == 200 && r.result == CURLE_WRITE_ERROR)
                throw source_error(url, "cannot count records: the server ignores ranged requests (HTTP 200 to a "
                                   "Range), so counting would read all of it; pass plan_options::counts for",
                                   std::make_error_code(std::errc::not_supported));
            const bool transient = r.result != CURLE_OK ? retryable_curl(r.result) : retryable_status(r.status);
            if (!transient || attempt >= retry.retries) {
                std::string why = request_failure(r.result, r.errbuf, r.status, r.body);
                if (attempt) why += " after " + std::to_string(attempt + 1) + " attempts";
                throw source_error(url, "cannot count records (" + why + ") in", {}, from)
                    .with_code(request_code(r.result, r.status));
            }
            std::mutex m;
            std::condition_variable_any cv;
            std::unique_lock lock(m);
            cv.wait_for(lock, stop_, retry.delay(attempt, jitter_), [] { return false; });  // a stop ends it at once
            if (stop_.stop_requested()) throw stopped{};
        }
    }

    std::shared_ptr<fetch_run> run_;
    fetch_options o_;
    std::stop_token stop_;
    CURL* e_;
    std::minstd_rand jitter_{jitter_seed()};
};

inline void note_fetch_delivery(stage_setup& s, const fetch_run& run) {
    if (run.cache) note_delivers_on_loop(s.internal.run, s.internal.at, false);
}

inline void offer_remote_access(stage_setup& s, const std::shared_ptr<fetch_run>& run, const fetch_options& o) {
    offer_access(s.internal.run, s.internal.at, "fetch",
                 [run, o](std::stop_token stop) -> std::unique_ptr<shard_access> {
                     return std::make_unique<remote_access>(run, o, std::move(stop));
                 },
                 o.cache.dir);
}

template <class>  // declared in io/http.hpp
task<void> fetch_worker(stage_context<shard, chunk>& ctx, fetch_run& run, fetch_options o) {
    auto eng = curl_engine::shared();
    const curl_engine::quiesce_on_exit settled;  // destroyed first: see curl_engine::quiesce
    std::minstd_rand jitter(jitter_seed());
    const backoff_policy retry{o.retries, o.backoff_base, o.backoff_cap};
    fetch_state fs{*eng, o, ctx, ctx.stats.counter("requests"), nullptr};
    auto& retries = ctx.stats.counter("retries");
    auto& resumes = ctx.stats.counter("resumes");
    auto& throttled = ctx.stats.counter("throttled");
    auto& parts_counter = ctx.stats.counter("parts");
    auto& limit_gauge = ctx.stats.counter("in_flight_limit");
    local_cache* cache = run.cache.get();
    std::atomic<std::uint64_t> unused{0};  // without a cache, no cache counters in the stats
    auto cache_counter = [&](const char* name) -> std::atomic<std::uint64_t>& {
        return cache ? ctx.stats.counter(name) : unused;
    };
    auto& cache_hits = cache_counter("cache_hits");
    auto& cache_misses = cache_counter("cache_misses");
    auto& cache_failures = cache_counter("cache_write_failures");
    auto& cache_evictions = cache_counter("cache_evictions");
    auto& cache_skipped = cache_counter("cache_too_large");
    // Objects read from a copy another worker of the node was downloading when asked for
    // (one fetch per object per node), and waits given up on a download that stopped growing.
    auto& cache_coalesced = cache_counter("cache_coalesced");
    auto& cache_gave_up = cache_counter("cache_waits_given_up");
    auto lim = run.limit;
    lim->watch(&limit_gauge, &ctx.stats.counter("in_flight"));
    // A stop reaches this worker's transfers, backoff and permit wait on the I/O loop.
    auto hooks = std::make_shared<fetch_stop_hooks>();
    std::stop_callback on_stop(ctx.stop, [hooks, ex = ctx.rt.executor_for(pool::io)] {
        asio::post(ex, [hooks] { hooks->fire(); });
    });
    struct clear_hooks {
        fetch_stop_hooks& h;
        ~clear_hooks() { h.clear(); }
    } clear{*hooks};
    auto stop_point = [&] {  // no new request, and no new wait, once stopping
        if (ctx.stopping()) throw stopped{};
    };
    auto release = [&](http_part& p, bool ok, bool throttled) {
        if (!p.permit) return;
        p.permit = false;
        lim->release(p.seq, ok, throttled);
    };
    // The part size now (the tuner may change it while objects download).
    auto part_size_now = [&run] { return run.part_size.load(std::memory_order_relaxed); };  // >= 1
    for (;;) {
        std::uint64_t ticket = 0;
        auto s = co_await ctx.in.next(ctx.turn ? &ticket : nullptr);
        if (!s) break;
        auto src = std::make_shared<const shard>(std::move(*s));
        bool my_turn = !ctx.turn;  // ordered: hand on nothing before the objects before
        std::exception_ptr failed;
        std::unique_ptr<local_cache::writer> copy;
        try {
            if (cache) {
                // Disk work (the lookup, mapping or reading a hit, creating a copy) runs on
                // the CPU pool: the I/O loop drives every transfer of the process and only
                // waits for readiness. sluice::switch_to moves the coroutine's wake-ups too.
                co_await sluice::switch_to{ctx.rt.executor_for(pool::cpu)};
                // One fetch per object per node (io/cache.hpp): a hit is read; a miss is
                // downloaded by whoever claims it first, and the others wait for its copy.
                bool waited = false, served = false;
                std::optional<std::uint64_t> seen;  // the partial copy's length when last looked
                auto seen_since = std::chrono::steady_clock::now();
                for (;;) {
                    auto hit = cache->find(src->url);
                    local_cache::claim cl;
                    auto claimed = local_cache::claim_result::unavailable;
                    if (!hit) {
                        claimed = cache->try_claim(src->url, cl);
                        if (claimed == local_cache::claim_result::claimed) hit = cache->find(src->url);  // committed just now
                    }
                    if (hit && cl.lock_fd >= 0) {
                        local_cache::claim done(std::move(cl));  // let go before reading: no one waits on it
                    }
                    if (hit) {
                        fd_guard fd(hit->fd);
                        (waited ? cache_coalesced : cache_hits).fetch_add(1, std::memory_order_relaxed);
                        turn_gate gate(ctx.turn, ticket);
                        co_await read_file(ctx, src, hit->path, fd, cache->options().chunk_size, cache->options().map,
                                           gate, hit->size);
                        my_turn = true;
                        gate.done();
                        served = true;
                        break;
                    }
                    if (claimed == local_cache::claim_result::claimed) {
                        cache_misses.fetch_add(1, std::memory_order_relaxed);
                        copy = std::make_unique<local_cache::writer>(*cache, src->url, std::move(cl));
                        break;
                    }
                    if (claimed == local_cache::claim_result::unavailable) {  // no lock file: no copy
                        cache_misses.fetch_add(1, std::memory_order_relaxed);
                        break;
                    }
                    // Another worker of the node downloads it: wait while its partial copy
                    // grows. One that stops growing for twice `stall` (a stopped process;
                    // a download waiting for a permit or a retry starts within that) is left
                    // to it, and the object fetched here without a copy.
                    waited = true;
                    const auto now = std::chrono::steady_clock::now();
                    if (const auto len = cache->part_bytes(src->url); len != seen) {
                        seen = len;
                        seen_since = now;
                    } else if (now - seen_since > 2 * o.stall) {
                        cache_misses.fetch_add(1, std::memory_order_relaxed);
                        cache_gave_up.fetch_add(1, std::memory_order_relaxed);
                        break;
                    }
                    co_await sluice::switch_to{ctx.rt.executor_for(pool::io)};
                    stop_point();
                    sleep_for pause{coalesce_poll, hooks.get(), {}};
                    co_await pause;
                    stop_point();
                    co_await sluice::switch_to{ctx.rt.executor_for(pool::cpu)};
                }
                co_await sluice::switch_to{ctx.rt.executor_for(pool::io)};
                if (served) continue;
            }
            bool from_copy = false;  // delivered from the copy just made
            for (bool direct_again = true; direct_again;) {
            direct_again = false;
            try {
            // Taking over a partial copy a dead downloader left: from its last byte (asked
            // again, so that the range is never empty), the same version only.
            const std::uint64_t start = copy && copy->resume_from() ? copy->resume_from() - 1 : 0;
            std::uint64_t offset = start;  // of the next byte to deliver (or, to a copy, to write)
            std::uint64_t total = http_request::npos;
            const std::uint64_t part_size = part_size_now();
            std::uint64_t next_from = start + part_size;  // of the next part to start
            std::string etag = start ? copy->version() : std::string();  // strong ETags only: If-Match compares strongly
            std::deque<http_part> parts;
            // Abandons the transfers still open if the worker unwinds (the pipeline stopped).
            struct abandon {
                curl_engine& eng;
                std::deque<http_part>& parts;
                aimd_limit& lim;
                fetch_stop_hooks& hooks;
                ~abandon() {
                    hooks.set_transfers(nullptr);  // before `parts` goes: fire may run on the I/O loop
                    for (auto& p : parts) {
                        if (p.t) eng.cancel(p.t);
                        if (p.permit) lim.release(p.seq, false, false);
                    }
                }
            } guard{*eng, parts, *lim, *hooks};
            hooks->set_transfers([&parts, e = eng.get()] {
                for (auto& p : parts)
                    if (p.t) e->cancel(p.t);  // each ends at once, with CURLE_ABORTED_BY_CALLBACK
            });
            // A permit for a request of this worker when it holds no other (see aimd_limit):
            // ordered, it goes ahead when its turn comes rather than wait on later objects.
            auto my_turn_now = [t = ctx.turn, ticket] { return t->current() >= ticket; };
            auto wait_permit = [&](std::uint64_t* seq) {
                std::function<void()> cancel;
                auto op = ctx.turn ? lim->acquire(seq, my_turn_now, &cancel, ticket)
                                   : lim->acquire(seq, nullptr, &cancel);
                hooks->set_permit_wait(std::move(cancel));
                return op;
            };
            // After a wait: a permit granted just as the stop came goes back, not astray.
            auto after_wait = [&](bool got, std::uint64_t seq) {
                hooks->set_permit_wait(nullptr);
                if (!ctx.stopping()) return;
                if (got) lim->release(seq, false, false);
                throw stopped{};
            };
            // Resolving and refreshing credentials may wait on STS, a container endpoint or
            // instance metadata: on the CPU pool. Also while a large object downloads.
            auto refresh_due = [&] { return fs.s3 && fs.s3->credentials && fs.s3->credentials->due(); };
            auto refresh = [&] { return on_cpu_pool(ctx, [&] { fs.s3 = s3_for(run, o, src->url, ctx.stats, ctx.stop); }); };
            if (fs.s3_target(src->url) && (!fs.s3 || refresh_due())) co_await refresh();
            std::uint64_t first_seq = 0;
            stop_point();
            const bool first_permit = co_await wait_permit(&first_seq);
            after_wait(first_permit, first_seq);
            // The first request asks for one part: its answer gives the object's size, and
            // the other parts follow, `parts_in_flight` at a time where the object comes
            // slowly (refill), else one after another.
            parts.push_back(http_part{start, o.parallel_parts ? start + part_size - 1 : http_request::npos, {}, first_permit,
                                      first_seq});
            const auto where = fs.locate(src->url);
            fs.start(parts.front(), where, etag);
            std::uint64_t seq = 0;
            auto more_parts = [&] { return total != http_request::npos && next_from < total; };
            std::uint64_t grown = part_size;  // the last part's size: each next one doubles, to max_part_size
            auto add_part = [&](bool permit) {
                grown = grown > o.max_part_size / 2 ? o.max_part_size : 2 * grown;
                if (run.part_grow_max) grown = std::min(grown, run.part_grow_max);
                grown = std::max(part_size_now(), grown);
                http_part p{next_from, std::min(total - next_from, grown) + next_from - 1, {}, permit, permit ? seq : 0};
                next_from = p.to + 1;
                // It waits its turn behind the parts before it: room to download all of
                // itself meanwhile, so that the object's parts download in parallel where
                // one connection is slow (a store that serves each connection at its own
                // rate; with two chunks each, as before, one large object came at one
                // connection's rate). At most its share (a third of the room with 4 parts
                // in flight), so that a part larger than that (a fixed part_size above it,
                // or the tuner's) leaves the others theirs. Not a part read at once (none
                // before it), and, ordered, not one of an object whose turn has not come:
                // the room is for the object being read, not for later ones.
                const std::size_t chunk = chunk_bytes(o);
                const std::uint64_t chunks = (p.to - p.from + chunk) / chunk;
                if (chunks > 2 && !parts.empty() && run.part_grow_max && (!ctx.turn || my_turn_now()))
                    p.room = part_room_lease(run.part_room, std::min<std::uint64_t>((chunks - 2) * chunk, run.part_grow_max),
                                             chunk);
                fs.start(p, where, etag);
                parts_counter.fetch_add(1, std::memory_order_relaxed);
                parts.push_back(std::move(p));
            };
            // Parts beyond the one being read pay only where the object comes slowly (a
            // store that serves each connection at its own rate, a long wait for each
            // answer): they are opened once it has come at below
            // `parallel_parts_below_bytes_per_s`, and from then on for the rest of the
            // object (four parts at r each come at 4r, which must not close them again).
            // Measured from its first chunk on (the first request's wait also holds the
            // process's and the connection's start: 8-13 ms for 1 MiB on loopback, where
            // the rest came at 2 GB/s), each later part's wait for its answer counted, the
            // time the object waits for its reader or its turn not: a reader slower than
            // the connection is not helped by more of them. From a connection faster than
            // that the parts come one after another: on loopback, four in flight cost 1.8 x
            // the CPU of one for the same rate (their bytes wait in four sockets' buffers
            // and leave the cache before they are read; bench/RESULTS.md, issue 17,
            // twenty-second session). None are opened before its second chunk, nor before
            // 10 ms of the object's own time (its waits for the reader or its turn not
            // counted) have passed since its first: a new connection's first milliseconds
            // come slower while TCP's windows grow, and one 1 GiB object from nginx on
            // loopback, judged from its second chunk on, was found slow in 3 of 12 runs
            // (once seen at 4.3 ms, 493 MB/s), and then took 1.7 x the CPU for less speed
            // (bench/RESULTS.md, issue 17, thirty-first session). A store that is slow has
            // its parts opened up to 10 ms later, once an object (with 8 MiB first parts,
            // which take 80 ms at 100 MB/s: the verdict comes within the first part).
            std::uint64_t first_chunk = 0;
            auto first_chunk_at = std::chrono::steady_clock::now();
            std::chrono::steady_clock::duration waited{};  // for the reader or the turn, since then
            bool slow = o.parallel_parts_below_bytes_per_s == 0;
            auto slow_so_far = [&] {
                const std::uint64_t arrived = offset - start;
                if (slow || arrived <= first_chunk) return slow;
                const double s =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - first_chunk_at - waited).count();
                if (s < 0.010) return false;  // too soon to judge (above)
                slow = static_cast<double>(arrived - first_chunk) < s * static_cast<double>(o.parallel_parts_below_bytes_per_s);
                return slow;
            };
            auto refill = [&] {
                if (!slow_so_far()) return;
                while (more_parts() && parts.size() < std::max(1u, o.parts_in_flight) && lim->try_acquire(&seq))
                    add_part(true);
            };
            // The server stopped honouring ranges: what this part gives runs to the end of
            // the object, so the parts after it must not also deliver it.
            auto whole_from_here = [&](http_part& p) {
                while (parts.size() > 1) {
                    auto& q = parts.back();
                    eng->cancel(q.t);
                    release(q, false, false);
                    parts.pop_back();
                }
                next_from = total;
                p.to = http_request::npos;
            };
            unsigned attempt = 0;
            bool delivered_all = false;  // sent as the last chunk: no `last` to send after
            bool reread_now = false;  // the part is retried with credentials read again
            bool first_response = true;
            while (!parts.empty() || more_parts()) {
                if (parts.empty()) {  // no permit was free for the next part: wait for one
                    stop_point();
                    const bool got = co_await wait_permit(&seq);
                    after_wait(got, seq);
                    add_part(got);
                }
                http_part& p = parts.front();
                for (;;) {
                    next_http_event ev{*p.t, {}};  // named: see io/local.hpp on g++ 12 and braced temporaries
                    auto data = co_await ev;
                    if (!data) break;
                    stop_point();
                    http_transfer& t = *p.t;
                    if (first_response) {
                        first_response = false;
                        if (!t.etag.starts_with("W/")) etag = t.etag;
                        if (t.ranged_ignored) {  // no range support: the whole object in one
                            p.to = http_request::npos;
                        } else if (p.to != http_request::npos) {
                            total = t.total;  // npos when the server did not say
                            first_chunk = offset - start + data->size();
                            first_chunk_at = std::chrono::steady_clock::now();
                            waited = {};
                            refill();
                        }
                    } else if (!etag.empty() && !t.etag.empty() && t.etag != etag) {
                        throw source_error(src->url, "object changed while downloading (ETag " + etag + " became " +
                                                         t.etag + ") from", {}, offset);
                    } else if (t.ranged_ignored && p.to != http_request::npos) {
                        whole_from_here(p);
                    }
                    if (t.status == 206 && t.range_start != p.from && t.range_start != http_request::npos)
                        throw source_error(src->url, "the server answered bytes from " + std::to_string(t.range_start) +
                                                         " to a request for bytes from " + std::to_string(p.from) + " of", {},
                                           offset);
                    if (copy && start == 0 && offset == 0 && total != http_request::npos && cache->options().max_bytes &&
                        total + local_cache::trailer_size > cache->options().max_bytes) {
                        // It would never fit: streamed as if there were no cache (the lock
                        // goes with the copy, and the workers waiting for it fetch it too).
                        copy.reset();
                        cache_skipped.fetch_add(1, std::memory_order_relaxed);
                    }
                    chunk c{src, offset, std::move(*data), false, false};
                    if (copy) {
                        // To the copy only (pwrite on the CPU pool, not the I/O loop): this
                        // download never waits for a consumer, so workers of other ranks
                        // waiting for the copy are never held by this rank's pace. It is
                        // delivered from the copy once whole.
                        co_await sluice::switch_to{ctx.rt.executor_for(pool::cpu)};
                        copy->set_version(etag);
                        copy->write(c.data.span(), offset);
                        co_await sluice::switch_to{ctx.rt.executor_for(pool::io)};
                        stop_point();
                        if (copy->failed()) throw fetch_without_copy{};
                        offset += c.data.size();
                        eng->resume(p.t);
                        if (refresh_due()) co_await refresh();
                        refill();
                        continue;
                    }
                    offset += c.data.size();
                    // Every byte the answers said the object has is here: this chunk goes on
                    // as the object's last, and the worker does not wait for the transfer's
                    // end, which curl reaches on its own with the connection kept (a wake-up
                    // and a channel item less per small object; a server that sends more
                    // ends it, see curl_engine::detach).
                    delivered_all = total != http_request::npos && offset == total;
                    c.last = delivered_all;
                    const auto wait_from = std::chrono::steady_clock::now();
                    if (!my_turn) {
                        co_await ctx.turn->wait(ticket);
                        my_turn = true;
                    }
                    co_await ctx.out.send(std::move(c));
                    waited += std::chrono::steady_clock::now() - wait_from;
                    eng->resume(p.t);
                    if (delivered_all) break;
                    if (refresh_due()) co_await refresh();  // before the parts after sign with them
                    refill();  // permits freed since: start more parts
                }
                if (delivered_all) {
                    for (auto& q : parts) {
                        curl_engine::detach(*q.t);
                        eng->resume(q.t);  // paused (a server sending more): it ends now
                        release(q, true, false);
                    }
                    parts.clear();
                    break;
                }
                stop_point();  // a stop cancels transfers: their ending is not a failure to retry
                http_transfer& t = *p.t;
                const bool ok = t.result == CURLE_OK && t.status >= 200 && t.status < 300;
                release(p, ok, t.result == CURLE_OK && (t.status == 503 || t.status == 429));
                const bool empty_object = t.result == CURLE_OK && t.status == 416 && offset == 0 && t.total == 0;
                // All of the part (or of the object) has arrived, whatever the ending says.
                const bool have_all = (p.to != http_request::npos && offset > p.to) ||
                                      (total != http_request::npos && offset >= total);
                if (ok || empty_object || have_all) {
                    if (first_response) {  // an empty body: nothing above gave the size
                        first_response = false;
                        if (!t.etag.starts_with("W/")) etag = t.etag;
                        total = empty_object ? 0 : t.total;
                        if (!t.ranged_ignored && p.to != http_request::npos) refill();
                    }
                    // 200 (not 206): the server sent the object to its end, whatever was asked.
                    const bool part_done = p.to == http_request::npos || t.status == 200 || have_all || empty_object;
                    if (part_done) {
                        parts.pop_front();
                        attempt = 0;
                        refill();
                        continue;
                    }
                    if (ok && t.status == 206 && total == http_request::npos && offset == p.to + 1) {
                        // A range answered with an unknown total: go on with the rest in one.
                        p.from = offset;
                        p.to = http_request::npos;
                        fs.start(p, where, etag);
                        continue;
                    }
                    // A 2xx that ended early (a server that closes cleanly mid-part): resume.
                    if (attempt >= retry.retries)
                        throw source_error(src->url, "cannot fetch (the body ended early, " + std::to_string(attempt + 1) +
                                                         " attempts)", {}, offset);
                } else if (start && t.result == CURLE_OK && (t.status == 412 || t.status == 416)) {
                    // Taking over a partial copy that is of another version, or ends where
                    // the object now ends: from the start, without a copy.
                    throw fetch_without_copy{};
                } else if (t.result == CURLE_OK && t.status == 412 && !etag.empty()) {
                    throw source_error(src->url, "object changed while downloading (If-Match " + etag + " failed) from",
                                       {}, offset);
                } else {
                    bool transient = t.result != CURLE_OK ? retryable_curl(t.result) : retryable_status(t.status);
                    if (!transient && fs.s3 && !p.reread && t.result == CURLE_OK && refused_credentials(s3_error_code(t.error_body))) {
                        // Credentials that expired or were rotated under us (ExpiredToken...):
                        // read their source again, once per part, off the I/O loop; with new
                        // ones the part is retried, and the parts after it sign with them.
                        p.reread = true;
                        co_await on_cpu_pool(ctx, [&] {
                            reread_now = reread_credentials(*fs.s3, t.req.auth, src->url, ctx.stop);
                            note_refreshes(*fs.s3, ctx.stats);
                        });
                        transient = reread_now;
                    }
                    if (!transient || (attempt >= retry.retries && !reread_now)) {
                        std::string what = http_failure(t);
                        if (transient) what += " after " + std::to_string(attempt + 1) + " attempts";
                        // code(): the curl or HTTP category, for callers that branch on the kind
                        // of failure. Not in the message, which says it already.
                        source_error e(src->url, "cannot fetch (" + what + ")", {}, offset ? offset : source_error::npos);
                        throw e.with_code(request_code(t.result, t.status));
                    }
                    if (t.status == 503 || t.status == 429) {
                        throttled.fetch_add(1, std::memory_order_relaxed);
                        run.throttled.fetch_add(1, std::memory_order_relaxed);
                    }
                }
                if (offset > p.from) resumes.fetch_add(1, std::memory_order_relaxed);
                retries.fetch_add(1, std::memory_order_relaxed);
                if (reread_now) {  // new credentials: at once, and not one of the attempts
                    reread_now = false;
                } else {
                    const auto wait = retry.delay(attempt++, jitter);
                    stop_point();
                    sleep_for pause{wait, hooks.get(), {}};
                    co_await pause;
                }
                stop_point();
                // The retry takes a permit too: under 503s the requests in flight shrink. A
                // worker whose other parts hold permits goes ahead (see aimd_limit).
                if (parts.size() > 1) {
                    lim->take_over(&p.seq);
                    p.permit = true;
                } else {
                    p.permit = co_await wait_permit(&p.seq);
                    hooks->set_permit_wait(nullptr);
                    stop_point();  // p is in parts: its permit is released as it unwinds
                }
                p.from = offset;  // resume this part where it stopped, the same version only
                fs.start(p, where, offset || !first_response ? etag : "");
            }
            if (total != http_request::npos && offset != total)
                throw source_error(src->url, "cannot fetch (" + std::to_string(offset) + " of " + std::to_string(total) +
                                                 " bytes arrived)", {}, offset);
            if (copy) {
                // Flushing to disk and evicting block: on the CPU pool, not the I/O loop
                // every transfer of the process shares. Then the object is read from its
                // copy, as a hit is (even one too large to keep, or that could not be put
                // in place: its bytes are all written).
                co_await sluice::switch_to{ctx.rt.executor_for(pool::cpu)};
                const bool placed = copy->commit(offset);
                if (!placed && !copy->failed()) cache_skipped.fetch_add(1, std::memory_order_relaxed);
                cache_failures.store(cache->failures.load(std::memory_order_relaxed), std::memory_order_relaxed);
                cache_evictions.store(cache->evictions.load(std::memory_order_relaxed), std::memory_order_relaxed);
                fd_guard fd(copy->take_read_fd());
                copy.reset();  // the other workers of the node may read it now
                if (fd.get() < 0) throw fetch_without_copy{};
                turn_gate gate(ctx.turn, ticket);
                co_await read_file(ctx, src, cache->path_for(src->url), fd, cache->options().chunk_size,
                                   cache->options().map, gate, offset);
                my_turn = true;
                gate.done();
                co_await sluice::switch_to{ctx.rt.executor_for(pool::io)};
                from_copy = true;
            }
            run.bytes_done.fetch_add(offset, std::memory_order_relaxed);
            run.objects_done.fetch_add(1, std::memory_order_relaxed);
            if (!from_copy && !delivered_all) {
                chunk last{src, offset, {}, true, false};
                if (!my_turn) {
                    co_await ctx.turn->wait(ticket);
                    my_turn = true;
                }
                co_await ctx.out.send(std::move(last));
            }
            if (!from_copy && ctx.turn) ctx.turn->done(ticket);
            } catch (const fetch_without_copy&) {
                direct_again = true;  // nothing of it was delivered yet: again, without a copy
                copy.reset();
                cache_failures.store(cache->failures.load(std::memory_order_relaxed), std::memory_order_relaxed);
            }
            }
        } catch (...) {
            failed = std::current_exception();
        }
        if (failed) {
            // Ordered: the error follows every object before this one.
            if (ctx.turn && !my_turn && !is_stop(failed)) co_await ctx.turn->wait(ticket);
            std::rethrow_exception(failed);
        }
    }
}

}  // namespace sluice::detail
