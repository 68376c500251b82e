#pragma once
// sluice::fetch: http:// and https:// objects through libcurl, streamed as chunks, many in
// flight, every transient failure retried (resuming where it stopped).

#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/io/detail/curl_engine.hpp>
#include <sluice/io/detail/curl_errors.hpp>
#include <sluice/io/cache.hpp>
#include <sluice/io/local.hpp>

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <stop_token>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <optional>
#include <random>
#include <string>

namespace sluice {

struct fetch_options {
    /// Requests in flight at most (objects, and parts of large objects). On 503 or 429
    /// the limit halves, at most once per round of requests and not below
    /// `min_in_flight`; each success adds 1/limit (about one per round), back up to this
    /// (AIMD, as TCP does with losses).
    unsigned in_flight = 64;
    unsigned min_in_flight = 4;
    /// Objects in order of their shards (each waits for the one before it to be handed
    /// on; later ones download meanwhile, up to two chunks per request), or as completed.
    ordering order = ordering::unordered;
    /// Bytes per chunk handed downstream; a download holds about two while downstream is
    /// full (then it is paused, not buffered).
    std::size_t chunk_size = 1u << 20;
    /// Large objects download as ranged parts of `part_size` bytes, `parts_in_flight` at a
    /// time per object, delivered in order (each part holds at most two chunks while it
    /// waits its turn). The first request asks for one part; its Content-Range gives the
    /// size. A server without range support answers 200 and the object streams whole.
    bool parallel_parts = true;
    std::uint64_t part_size = 8u << 20;
    unsigned parts_in_flight = 4;
    /// Retries of one object after a transient failure (connection error, timeout, stall,
    /// a cut body, 429, 500, 502, 503, 504), with capped exponential backoff and full
    /// jitter. A cut body resumes from its last byte (Range + If-Match on the ETag).
    unsigned retries = 8;
    std::chrono::milliseconds backoff_base{100};
    std::chrono::milliseconds backoff_cap{5000};
    /// No byte for this long: the transfer fails (and is retried).
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
    /// found there is read from local disk, and one that is not is written there as it
    /// streams, so later epochs (and other processes on the node) read it locally.
    cache_options cache = {};
    /// Capacity of the output channel, in chunks and bytes.
    channel_limits out = {16, 64u << 20};
};

namespace detail {


/// Continues the coroutine on `ex` (its wake-ups still go to its own executor).
struct switch_to {
    executor ex;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { resume_on(ex, h); }
    void await_resume() const noexcept {}
};

/// What a stop must reach in one fetch worker besides its channels: its transfers, its
/// backoff timer and its wait for a permit. The stop callback posts `fire` to the I/O
/// loop, where the worker runs, so the worker and `fire` never run at once; the worker
/// sets and clears what `fire` reaches as it goes.
struct fetch_stop_hooks {
    std::function<void()> transfers;     // cancels the transfers in flight
    asio::steady_timer* sleeping = nullptr;
    std::function<void()> permit_wait;   // ends a wait for a permit
    void fire() {
        if (transfers) transfers();
        if (sleeping) sleeping->cancel();
        if (permit_wait) permit_wait();
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
        if (hooks) hooks->sleeping = &*timer;
        timer->async_wait([h](const std::error_code&) { h.resume(); });
    }
    void await_resume() noexcept {
        if (hooks) hooks->sleeping = nullptr;
    }
};

inline std::string http_failure(const http_transfer& t) {
    return request_failure(t.result, t.errbuf, t.status, t.error_body);
}

/// The stage's request budget: additive increase, multiplicative decrease. Every request
/// takes a permit — first requests, parts and retries, ordered or not — so under 503s the
/// requests in flight shrink for all of them. Permits go in the order asked. Two cases go
/// ahead over the limit rather than wait, since waiting could close a cycle: a request of
/// a worker that already holds permits (its other parts finish without it), and, in an
/// ordered stage, the object whose turn it is (later objects may hold every permit while
/// they wait for their turn). So the requests in flight exceed the limit by at most one
/// per worker, and only while those cases last.
class aimd_limit : public std::enable_shared_from_this<aimd_limit> {
    struct wait_state {
        std::coroutine_handle<> h;
        std::optional<asio::steady_timer> timer;
        std::uint64_t* seq = nullptr;
        std::function<bool()> go_ahead;  // asked every tick while waiting
        std::uint64_t priority = 0;      // lowest first
        bool granted = false, ended = false, stop = false;
    };

public:
    aimd_limit(unsigned max, unsigned min) : max_(std::max(1u, max)), min_(std::clamp(min, 1u, max_)), limit_(max_) {}

    /// How often a waiter asks `go_ahead` (an ordered stage: is it my turn?).
    static constexpr std::chrono::milliseconds tick{20};

    struct acquire_op {
        std::shared_ptr<aimd_limit> l;
        std::shared_ptr<wait_state> w;
        bool await_ready() {
            std::lock_guard lock(l->m_);
            if (!l->take(w->seq)) {
                if (!w->go_ahead || !w->go_ahead()) return false;
                l->take_unchecked(w->seq);
            }
            w->granted = true;
            w->ended = true;
            return true;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            w->h = h;
            w->timer.emplace(h.promise().ex);
            {
                std::lock_guard lock(l->m_);
                auto at = std::upper_bound(l->waiters_.begin(), l->waiters_.end(), w->priority,
                                           [](std::uint64_t p, const auto& x) { return p < x->priority; });
                l->waiters_.insert(at, w);
            }
            l->arm(w);
        }
        /// Whether a permit was taken (not when the wait ended by a stop).
        bool await_resume() const noexcept { return w->granted; }
    };
    /// `co_await acquire(&seq, go_ahead, cancel, ticket)`: a permit; `seq` gets the
    /// request's sequence number (for release). `go_ahead`, if given, is asked while
    /// waiting: true takes a permit over the limit. `cancel`, if given, receives a function
    /// that ends the wait without a permit (for a stop; call it on the waiter's executor).
    /// Waiters get permits in the order of `ticket` when given (an ordered stage: the
    /// object whose turn is nearest first), else in the order they asked.
    acquire_op acquire(std::uint64_t* seq, std::function<bool()> go_ahead = nullptr,
                       std::function<void()>* cancel = nullptr, std::optional<std::uint64_t> ticket = {}) {
        auto w = std::make_shared<wait_state>();
        w->seq = seq;
        w->go_ahead = std::move(go_ahead);
        {
            std::lock_guard lock(m_);
            w->priority = ticket ? *ticket : arrivals_++;
        }
        if (cancel)
            *cancel = [w] {
                w->stop = true;
                if (w->timer) w->timer->cancel();
            };
        return acquire_op{shared_from_this(), std::move(w)};
    }
    /// A permit over the limit, at once (see the class comment for when).
    void take_over(std::uint64_t* seq) {
        std::lock_guard lock(m_);
        take_unchecked(seq);
    }
    bool try_acquire(std::uint64_t* seq) {
        std::lock_guard lock(m_);
        return take(seq);
    }
    /// A request ended: `throttled` for 503/429 (halve, once per round: not again for
    /// requests started before the last halving), `ok` for a success (grow).
    void release(std::uint64_t seq, bool ok, bool throttled) {
        std::vector<std::shared_ptr<wait_state>> wake;
        {
            std::lock_guard lock(m_);
            if (active_) --active_;
            if (throttled && seq >= round_) {
                limit_ = std::max<double>(min_, limit_ / 2);
                round_ = next_seq_;
            } else if (ok) {
                limit_ = std::min<double>(max_, limit_ + 1.0 / limit_);
            }
            while (!waiters_.empty() && active_ < allowed()) {
                auto w = waiters_.front();
                waiters_.pop_front();
                take_unchecked(w->seq);
                w->granted = true;
                wake.push_back(std::move(w));
            }
            publish();
        }
        // The waiter resumes from its timer's handler, which a cancel runs now.
        for (auto& w : wake) asio::post(w->timer->get_executor(), [w] { w->timer->cancel(); });
    }
    unsigned limit() const {
        std::lock_guard lock(m_);
        return allowed();
    }
    /// Gauges kept up to date with the limit and the requests holding permits (stats).
    void watch(std::atomic<std::uint64_t>* limit, std::atomic<std::uint64_t>* active) {
        std::lock_guard lock(m_);
        limit_gauge_ = limit;
        active_gauge_ = active;
        publish();
    }
    /// Requests holding a permit now.
    unsigned active() const {
        std::lock_guard lock(m_);
        return active_;
    }

private:
    void arm(const std::shared_ptr<wait_state>& w) {
        w->timer->expires_after(w->go_ahead ? std::chrono::steady_clock::duration(tick) : std::chrono::hours(24));
        w->timer->async_wait([self = shared_from_this(), w](const std::error_code&) { self->on_tick(w); });
    }
    // The one place a waiter resumes: granted, stopped, allowed to go ahead, or waits on.
    void on_tick(const std::shared_ptr<wait_state>& w) {
        bool resume = false;
        {
            std::lock_guard lock(m_);
            if (w->ended) return;
            if (!w->granted && (w->stop || (w->go_ahead && w->go_ahead()))) {
                std::erase(waiters_, w);
                if (!w->stop) {
                    take_unchecked(w->seq);
                    w->granted = true;
                }
            }
            resume = w->granted || w->stop;
            w->ended = resume;
        }
        if (resume) w->h.resume();
        else arm(w);
    }
    unsigned allowed() const { return static_cast<unsigned>(std::min<double>(limit_, max_)); }
    bool take(std::uint64_t* seq) {  // m_ held
        if (active_ >= allowed() || !waiters_.empty()) return false;  // first come, first served
        take_unchecked(seq);
        return true;
    }
    void take_unchecked(std::uint64_t* seq) {
        ++active_;
        *seq = next_seq_++;
        publish();
    }
    void publish() {  // m_ held
        if (limit_gauge_) limit_gauge_->store(allowed(), std::memory_order_relaxed);
        if (active_gauge_) active_gauge_->store(active_, std::memory_order_relaxed);
    }
    mutable std::mutex m_;
    unsigned max_, min_;
    double limit_;
    unsigned active_ = 0;
    std::uint64_t next_seq_ = 0, round_ = 0;
    std::uint64_t arrivals_ = 0;
    std::deque<std::shared_ptr<wait_state>> waiters_;  // by priority
    std::atomic<std::uint64_t>* limit_gauge_ = nullptr;
    std::atomic<std::uint64_t>* active_gauge_ = nullptr;
};

// One byte range of an object in flight: [from, to] (to inclusive; npos: to the end).
struct http_part {
    std::uint64_t from = 0, to = http_request::npos;
    std::shared_ptr<http_transfer> t;
    bool permit = false;  // holds one of the limiter's permits
    std::uint64_t seq = 0;  // the permit's sequence number
};

struct fetch_state {
    curl_engine& eng;
    const fetch_options& o;
    stage_context<shard, chunk>& ctx;
    std::atomic<std::uint64_t>& requests;
    std::optional<s3_config> s3;  // resolved at the first s3:// URL

    /// The HTTP URL and signature of a shard's URL: itself, or S3's for s3://.
    std::pair<std::string, s3_auth> locate(const std::string& url) {
        auto loc = parse_s3_url(url);
        if (!loc) {
            if (url.starts_with("s3://")) throw source_error(url, "not an s3://bucket/key URL:");
            return {url, {}};
        }
        if (loc->key.empty() || loc->key.ends_with('/'))
            throw source_error(url, "cannot fetch a prefix (list it: sluice::list gives its objects):");
        if (!s3) s3 = resolve_s3(o.s3, url);
        return {s3_http_url(*s3, *loc), auth_of(*s3)};
    }

    void start(http_part& p, const std::pair<std::string, s3_auth>& where, const std::string& etag) {
        http_request req;
        req.url = where.first;
        req.auth = where.second;
        req.from = p.from;
        req.to = p.to;
        req.if_match = etag;
        req.chunk_size = o.chunk_size ? o.chunk_size : (1u << 20);
        req.connect_timeout_ms = static_cast<long>(o.connect_timeout.count());
        req.stall_seconds = static_cast<long>(o.stall.count());
        req.max_redirects = o.max_redirects;
        req.verify_tls = !o.insecure;
        req.ca_file = !o.ca_file.empty() ? o.ca_file : where.second.ca_bundle;
        req.mem = ctx.rt.buffers();  // shared: the engine's thread may outlive this pipeline's runtime
        p.t = std::make_shared<http_transfer>(std::move(req));
        requests.fetch_add(1, std::memory_order_relaxed);
        eng.add(p.t);
    }
};

/// What one run of a fetch stage shares among its workers (made by its setup).
struct fetch_run {
    std::shared_ptr<aimd_limit> limit;
    std::shared_ptr<local_cache> cache;  // null without fetch_options::cache
};

inline task<void> fetch_worker(stage_context<shard, chunk>& ctx, fetch_options o) {
    auto eng = curl_engine::shared();
    std::minstd_rand jitter(std::random_device{}());
    fetch_state fs{*eng, o, ctx, ctx.stats.counter("requests"), std::nullopt};
    auto& retries = ctx.stats.counter("retries");
    auto& resumes = ctx.stats.counter("resumes");
    auto& throttled = ctx.stats.counter("throttled");
    auto& parts_counter = ctx.stats.counter("parts");
    auto& limit_gauge = ctx.stats.counter("in_flight_limit");
    auto& run = *static_cast<fetch_run*>(ctx.state.get());
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
    auto lim = run.limit;
    lim->watch(&limit_gauge, &ctx.stats.counter("in_flight"));
    // A stop reaches this worker's transfers, backoff and permit wait on the I/O loop.
    auto hooks = std::make_shared<fetch_stop_hooks>();
    std::stop_callback on_stop(ctx.stop, [hooks, ex = ctx.rt.executor_for(pool::io)] {
        asio::post(ex, [hooks] { hooks->fire(); });
    });
    struct clear_hooks {
        fetch_stop_hooks& h;
        ~clear_hooks() { h = {}; }
    } clear{*hooks};
    auto stop_point = [&] {  // no new request, and no new wait, once stopping
        if (ctx.stopping()) throw stopped{};
    };
    auto release = [&](http_part& p, bool ok, bool throttled) {
        if (!p.permit) return;
        p.permit = false;
        lim->release(p.seq, ok, throttled);
    };
    const std::uint64_t part_size = std::max<std::uint64_t>(o.part_size, 1);
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
                if (auto hit = cache->find(src->url)) {
                    fd_guard fd(hit->fd);
                    cache_hits.fetch_add(1, std::memory_order_relaxed);
                    turn_gate gate(ctx.turn, ticket);
                    co_await read_file(ctx, src, hit->path, fd, cache->options().chunk_size, cache->options().map, gate,
                                       hit->size);
                    my_turn = true;
                    gate.done();
                    continue;
                }
                cache_misses.fetch_add(1, std::memory_order_relaxed);
                copy = std::make_unique<local_cache::writer>(*cache, src->url);
            }
            std::uint64_t offset = 0;  // of the next byte to deliver
            std::uint64_t total = http_request::npos;
            std::uint64_t next_from = part_size;  // of the next part to start
            std::string etag;                     // strong ETags only: If-Match compares strongly
            std::deque<http_part> parts;
            // Abandons the transfers still open if the worker unwinds (the pipeline stopped).
            struct abandon {
                curl_engine& eng;
                std::deque<http_part>& parts;
                aimd_limit& lim;
                fetch_stop_hooks& hooks;
                ~abandon() {
                    hooks.transfers = nullptr;
                    for (auto& p : parts) {
                        if (p.t) eng.cancel(p.t);
                        if (p.permit) lim.release(p.seq, false, false);
                    }
                }
            } guard{*eng, parts, *lim, *hooks};
            hooks->transfers = [&parts, e = eng.get()] {
                for (auto& p : parts)
                    if (p.t) e->cancel(p.t);  // each ends at once, with CURLE_ABORTED_BY_CALLBACK
            };
            // A permit for a request of this worker when it holds no other (see aimd_limit):
            // ordered, it goes ahead when its turn comes rather than wait on later objects.
            auto my_turn_now = [t = ctx.turn, ticket] { return t->current() >= ticket; };
            auto wait_permit = [&](std::uint64_t* seq) {
                return ctx.turn ? lim->acquire(seq, my_turn_now, &hooks->permit_wait, ticket)
                                : lim->acquire(seq, nullptr, &hooks->permit_wait);
            };
            std::uint64_t first_seq = 0;
            stop_point();
            const bool first_permit = co_await wait_permit(&first_seq);
            hooks->permit_wait = nullptr;
            stop_point();
            // The first request asks for one part: its answer gives the object's size, and
            // the other parts then download in parallel, `parts_in_flight` at a time.
            parts.push_back(http_part{0, o.parallel_parts ? part_size - 1 : http_request::npos, {}, first_permit, first_seq});
            const auto where = fs.locate(src->url);
            fs.start(parts.front(), where, "");
            std::uint64_t seq = 0;
            auto more_parts = [&] { return total != http_request::npos && next_from < total; };
            auto add_part = [&](bool permit) {
                http_part p{next_from, std::min(total, next_from + part_size) - 1, {}, permit, permit ? seq : 0};
                next_from = p.to + 1;
                fs.start(p, where, etag);
                parts_counter.fetch_add(1, std::memory_order_relaxed);
                parts.push_back(std::move(p));
            };
            auto refill = [&] {
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
            bool first_response = true;
            while (!parts.empty() || more_parts()) {
                if (parts.empty()) {  // no permit was free for the next part: wait for one
                    stop_point();
                    const bool got = co_await wait_permit(&seq);
                    hooks->permit_wait = nullptr;
                    stop_point();
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
                    chunk c{src, offset, std::move(*data), false, false};
                    if (copy) copy->write(c.data.span(), offset);
                    offset += c.data.size();
                    if (!my_turn) {
                        co_await ctx.turn->wait(ticket);
                        my_turn = true;
                    }
                    co_await ctx.out.send(std::move(c));
                    eng->resume(p.t);
                    refill();  // permits freed since: start more parts
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
                    if (attempt >= o.retries)
                        throw source_error(src->url, "cannot fetch (the body ended early, " + std::to_string(attempt + 1) +
                                                         " attempts)", {}, offset);
                } else if (t.result == CURLE_OK && t.status == 412 && !etag.empty()) {
                    throw source_error(src->url, "object changed while downloading (If-Match " + etag + " failed) from",
                                       {}, offset);
                } else {
                    const bool transient = t.result != CURLE_OK ? retryable_curl(t.result) : retryable_status(t.status);
                    if (!transient || attempt >= o.retries) {
                        std::string what = http_failure(t);
                        if (transient) what += " after " + std::to_string(attempt + 1) + " attempts";
                        throw source_error(src->url, "cannot fetch (" + what + ")", {}, offset ? offset : source_error::npos);
                    }
                    if (t.status == 503 || t.status == 429) throttled.fetch_add(1, std::memory_order_relaxed);
                }
                if (offset > p.from) resumes.fetch_add(1, std::memory_order_relaxed);
                retries.fetch_add(1, std::memory_order_relaxed);
                // Full jitter: a uniform wait up to min(cap, base * 2^attempt).
                const auto ceiling =
                    std::min<long long>(o.backoff_cap.count(), o.backoff_base.count() << std::min(attempt, 20u));
                ++attempt;
                const auto wait =
                    std::chrono::milliseconds(ceiling > 0 ? jitter() % static_cast<unsigned long long>(ceiling + 1) : 0);
                stop_point();
                sleep_for pause{wait, hooks.get(), {}};
                co_await pause;
                stop_point();
                // The retry takes a permit too: under 503s the requests in flight shrink. A
                // worker whose other parts hold permits goes ahead (see aimd_limit).
                if (parts.size() > 1) {
                    lim->take_over(&p.seq);
                    p.permit = true;
                } else {
                    p.permit = co_await wait_permit(&p.seq);
                    hooks->permit_wait = nullptr;
                    stop_point();
                }
                p.from = offset;  // resume this part where it stopped, the same version only
                fs.start(p, where, offset || !first_response ? etag : "");
            }
            if (total != http_request::npos && offset != total)
                throw source_error(src->url, "cannot fetch (" + std::to_string(offset) + " of " + std::to_string(total) +
                                                 " bytes arrived)", {}, offset);
            if (copy) {
                // Flushing to disk and evicting block: on the CPU pool, not the I/O loop
                // every transfer of the process shares.
                co_await switch_to{ctx.rt.executor_for(pool::cpu)};
                const bool placed = copy->commit(offset);
                co_await switch_to{ctx.rt.executor_for(pool::io)};
                if (!placed && !copy->failed()) cache_skipped.fetch_add(1, std::memory_order_relaxed);
                cache_failures.store(cache->failures.load(std::memory_order_relaxed), std::memory_order_relaxed);
                cache_evictions.store(cache->evictions.load(std::memory_order_relaxed), std::memory_order_relaxed);
                copy.reset();
            }
            chunk last{src, offset, {}, true, false};
            if (!my_turn) {
                co_await ctx.turn->wait(ticket);
                my_turn = true;
            }
            co_await ctx.out.send(std::move(last));
            if (ctx.turn) ctx.turn->done(ticket);
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

}  // namespace detail

/// Takes: shards whose url is http://, https:// or s3://bucket/key (see s3_options). Gives: each object's bytes as chunks
/// (the last one flagged), in order per object; `in_flight` objects download at once and
/// their chunks interleave (decoders keep per-shard state).
/// Backpressure: each download holds at most about two chunks; when downstream is full
/// the transfer is paused, not buffered.
/// Errors: a sluice::source_error naming the URL and what failed ("HTTP 404", "Couldn't
/// connect to server (...) after 9 attempts", the byte offset of a failed resume), after
/// every chunk delivered before it; 4xx other than 429 are not retried. An object whose
/// ETag changes between a cut and its resumption is an error, not two versions mixed.
/// Stats: requests, parts (ranged requests after an object's first), retries, resumes,
/// throttled (429/503).
/// Cancellation: stops at the next chunk; transfers in flight are abandoned.
/// Example: `sluice::list("https://host/shards/{0000..0099}.tar") | sluice::plan() | sluice::fetch() | sluice::webdataset()`
inline stage<shard, chunk> fetch(fetch_options o = {}) {
    return make_stage<shard, chunk>(
        "fetch", {.concurrency = std::max(1u, o.in_flight), .order = o.order, .on = pool::io, .buffer = o.out},
        [o](stage_setup& s) {
            auto run = std::make_shared<detail::fetch_run>();
            run->limit = std::make_shared<detail::aimd_limit>(o.in_flight, o.min_in_flight);
            if (!o.cache.dir.empty()) run->cache = std::make_shared<detail::local_cache>(o.cache);
            s.state = std::move(run);
        },
        [o](stage_context<shard, chunk>& ctx) { return detail::fetch_worker(ctx, o); });
}

}  // namespace sluice
