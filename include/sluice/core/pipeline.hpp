#pragma once
// sluice::pipeline<T>: a running instance of a source<T>.
//
// It owns the runtime (I/O loop + CPU pool), one channel per stage and every worker. It
// starts on first use. The trainer takes items with a range-for on its own thread, or
// with `co_await p.next()` from a coroutine. stop() (also run by the destructor) cancels
// every channel, which wakes every suspended worker; each unwinds, and stop() returns when
// all have finished and both executors are joined. Stopping therefore takes as long as the
// longest single step a worker is in (one read, one user map call), never a wait.
//
// Errors travel in-band: the item after the last good one rethrows the first stage's
// error (a sluice::error naming the path, URL or offset).

#include <sluice/core/channel.hpp>
#include <sluice/core/detail/metrics_export.hpp>
#include <sluice/core/detail/trace.hpp>
#include <sluice/core/detail/tuning.hpp>
#include <sluice/core/runtime.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/core/stats.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>

namespace sluice {

/// Live figures in Prometheus' text format (pipeline_figures::prometheus()), for a scraper
/// or a person: in a file, on a loopback port, or both. Off unless asked.
struct metrics_options {
    /// Rewritten every `interval` and once more at the end (written whole beside it as
    /// FILE.tmp, then renamed over it). Empty: no file. A file that cannot be written
    /// fails the start, naming it; a later failure (a full disk) is said once on stderr.
    std::string file = {};
    /// Served at GET /metrics on 127.0.0.1 (never another address: the figures name
    /// URLs and paths) while the pipeline runs. 0: a free port, pipeline::metrics_port()
    /// says which; -1: none. A port that cannot be bound fails the start, naming it.
    int port = -1;
    std::chrono::milliseconds interval{1000};
};

struct pipeline_options {
    runtime_options runtime = {};
    /// Report progress at this interval; zero: never.
    std::chrono::milliseconds progress{0};
    /// Called with the figures so far at each progress interval (on a thread of its own);
    /// by default writes pipeline_figures::progress_line() to stderr, overwriting the
    /// previous line on a terminal.
    std::function<void(const pipeline_figures&)> on_progress = nullptr;
    /// A state written by pipeline::state(): the pipeline yields exactly what the saved
    /// one had left to yield (core/state.hpp). Empty: start from the beginning.
    std::string resume = {};
    /// Let the tuner move the settings stages offer it while the pipeline runs, toward the
    /// highest delivered rate (core/detail/tuning.hpp): fetch's requests in flight,
    /// between its `.min_concurrency` and its `.concurrency` (the ceiling), and how many
    /// workers of map, decode_images, batch's collation and read (files in flight) work,
    /// from 1 up to their `.concurrency` (core/detail/worker_gate.hpp). Every change is
    /// in figures().tuning, the settings it chose in figures().tuned (pin them in a later
    /// run). Changes how fast, never what or in which order.
    bool tune = false;
    /// One memory budget for the pipeline, in bytes (0: none, each stage's own limits):
    /// divided at the start among the buffer pool's cache, fetch's requests in flight (a
    /// request holds up to three chunks) and to_device's ring, what stages hold whatever it
    /// says (a shuffle's max_bytes), and every channel's byte budget and fetch's room for
    /// waiting parts; tuned or not. See the README's "One memory budget, and the tuner";
    /// figures().budget shows the division.
    std::uint64_t memory = 0;
    /// Prometheus text export of the live figures (see metrics_options).
    metrics_options metrics = {};
    /// A Chrome trace of the run, written to this file when the pipeline stops: one
    /// track per worker and one for the consumer, each in busy / waiting-for-input /
    /// waiting-for-room spans (open in ui.perfetto.dev or chrome://tracing). The pipeline
    /// keeps at most 262,144 waits (6 MiB), shared by its workers (at most 65,536 each);
    /// later ones are counted in the trace's otherData.dropped_spans. A path that cannot
    /// be written fails the start; a failure to write it at the stop is said on stderr.
    std::string trace = {};
};

template <class T>
class pipeline {
public:
    explicit pipeline(source<T> src, pipeline_options opts = {})
        : src_(std::move(src)), opts_(opts) {}
    pipeline(const pipeline&) = delete;
    pipeline& operator=(const pipeline&) = delete;
    ~pipeline() {
        stop();
        std::lock_guard lock(anchor_->m);  // a suspended next() resuming later finds no pipeline
        anchor_->p = nullptr;
    }

    /// Start now instead of on first use.
    void start() {
        std::lock_guard lock(m_);
        if (!run_) start_locked();
    }

    /// The next item, blocking the calling thread; empty at the end. Rethrows a stage's
    /// error after the items produced before it.
    std::optional<T> next_blocking() {
        reader_guard guard(readers_);
        auto ch = channel_();  // shared: a stop() on another thread cannot free it under us
        if (last_return_ns_) detail::bump(consumer().wait_out_ns, detail::now_ns() - last_return_ns_);
        std::optional<T> got;
        if (has_wait_check()) {
            // Wait in slices, asking the last stage after each whether what we wait for
            // can still come: a consumer holding every ring batch gets an error, not a
            // hang, whenever the stage gets there. The same answer twice in a row: a
            // release from another thread had half a second. The stage's state is read
            // before the channel: its send happens before it says it waits.
            bool suspect = false;
            for (;;) {
                got = ch->receive_blocking_for(std::chrono::milliseconds(500), consumer().input_meter());
                if (got || ((ch->closed() || ch->cancelled()) && ch->size() == 0)) break;
                const auto why = would_never_arrive(*ch);
                if (why.empty() || ch->size() != 0) {
                    suspect = false;
                } else if (suspect) {
                    throw error(why);
                } else {
                    suspect = true;
                }
            }
        } else {
            got = ch->receive_blocking(consumer().input_meter());
        }
        if (got) {
            detail::bump(consumer().items_in);
            detail::bump(consumer().bytes_in, byte_size_of(*got));
            note_position(*got);
        }
        last_return_ns_ = detail::now_ns();
        return got;
    }

    class next_op;
    /// `co_await p.next()` from a coroutine: the next item, or empty at the end. Rethrows a
    /// stage's error after the items produced before it. The pipeline's threads wake the
    /// coroutine by posting to its executor: stop the pipeline before that executor goes.
    next_op next() { return next_op(*this); }

    /// The state after the last item taken, as a small text blob: start a pipeline
    /// built the same way with `pipeline_options{.resume = blob}` and it yields exactly the
    /// items this one had not yet yielded. Needs items that carry their position
    /// (host_batch, device_batch: the batch stage stamps them); call it from the thread
    /// that takes the items, between items. Throws sluice::error otherwise.
    std::string state() {
        std::lock_guard lock(m_);
        if (!run_ && !last_run_) throw error("sluice: state(): the pipeline has not started");
        auto& rs = run_ ? *run_->env.run : *last_run_;
        if (auto why = rs.why_unknown(); !why.empty())
            throw error("sluice: state(): cannot save a position: " + why);
        stream_point at = position_;
        if (took_other_)
            throw error("sluice: state(): the pipeline's items carry no position: end the pipeline at "
                        "sluice::batch() or after it with stages that give one item per batch (to_device, map)");
        if (!took_position_ && rs.resume()) at = *rs.resume();
        if (auto n = rs.epoch_records(at.epoch); n && at.position >= *n) at = {at.epoch + 1, 0};
        return rs.serialize(at);
    }

    /// Cancel everything and join all work. Safe to call more than once.
    void stop() {
        std::unique_ptr<running> r;
        {
            std::lock_guard lock(m_);
            r = std::move(run_);
            stopped_ = true;
        }
        if (!r) return;
        if (r->tuner.joinable()) {  // first: a cancelled pipeline's rates mean nothing
            {
                std::lock_guard lock(r->progress_m);
                r->tuner_stop = true;
            }
            r->progress_cv.notify_all();
            r->tuner.join();
        }
        r->env.cancel_all();
        // A next_blocking() on another thread may still be returning (it wakes at once).
        while (readers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
        r->env.wait_idle();
        {
            std::lock_guard lock(r->progress_m);
            r->progress_stop = true;
        }
        r->progress_cv.notify_all();
        if (r->progress.joinable()) r->progress.join();
        r->rt->join();
        r->env.destroy_parked();
        auto f = figures_of(*r);
        if (r->metrics) r->metrics->finish(f.prometheus());
        if (!opts_.trace.empty()) write_trace(*r);
        std::lock_guard lock(m_);  // figures() may read it from another thread
        final_ = std::move(f);
        last_run_ = r->env.run;  // state() still answers after stop()
    }

    /// The port serving the live figures (metrics_options::port); starts the pipeline if it
    /// has not started. -1: none, or the pipeline has stopped (the port closed with it).
    int metrics_port() {
        std::lock_guard lock(m_);
        if (!run_ && !stopped_) start_locked();  // never restarts a stopped pipeline
        return run_ && run_->metrics ? run_->metrics->port() : -1;
    }

    /// Figures so far (or final figures after stop()).
    pipeline_figures figures() const {
        std::lock_guard lock(m_);
        if (run_) return figures_of(*run_);
        return final_;
    }

    class iterator {
    public:
        using value_type = T;
        using difference_type = std::ptrdiff_t;
        iterator() = default;
        explicit iterator(pipeline* p) : p_(p) { ++*this; }
        T& operator*() const { return *const_cast<std::optional<T>&>(cur_); }
        T* operator->() const { return &**this; }
        iterator& operator++() {
            cur_.reset();  // release the previous item first: a device batch frees its ring slot
            cur_ = p_->next_blocking();
            if (!cur_) p_ = nullptr;
            return *this;
        }
        void operator++(int) { ++*this; }
        bool operator==(std::default_sentinel_t) const { return p_ == nullptr; }

    private:
        pipeline* p_ = nullptr;
        std::optional<T> cur_;
    };
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

    // Counts threads inside next_blocking(): stop() waits for them (they wake at once).
    // Not coroutines in next(): their executor may be gone, so they would never leave.
    struct reader_guard {
        std::atomic<int>& n;
        explicit reader_guard(std::atomic<int>& c) : n(c) { n.fetch_add(1, std::memory_order_acq_rel); }
        ~reader_guard() { n.fetch_sub(1, std::memory_order_acq_rel); }
        reader_guard(const reader_guard&) = delete;
        reader_guard& operator=(const reader_guard&) = delete;
    };
    // What a suspended next() reaches its pipeline through: gone (null) once destroyed.
    struct anchor {
        std::mutex m;
        pipeline* p;
    };

public:
    class next_op {
    public:
        // The wait is timed here, not by the channel: the pipeline (and its counters)
        // may be gone when a suspended next() resumes.
        explicit next_op(pipeline& p) : p_(p), anchor_(p.anchor_), ch_(p.channel_()), aw_(ch_->receive()) {}
        bool await_ready() {
            // No grace here (a coroutine cannot block): a consumer that gives batches back
            // from another thread waits with next_blocking() instead.
            why_ = p_.would_never_arrive(*ch_);
            if (!why_.empty() && ch_->size() != 0) why_.clear();
            return !why_.empty() || aw_.await_ready();
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            t0_ = detail::now_ns();
            aw_.await_suspend(h);
        }
        std::optional<T> await_resume() {
            if (!why_.empty()) throw error(why_);
            auto got = aw_.await_resume();
            std::lock_guard lock(anchor_->m);
            if (!anchor_->p) return got;
            if (t0_) p_.consumer().input_meter().add(t0_, detail::now_ns());
            if (got) p_.note_position(*got);
            return got;
        }

    private:
        pipeline& p_;
        std::shared_ptr<anchor> anchor_;
        // Shared: a stop() while this coroutine is suspended (or its executor is gone and
        // it never resumes) cannot free the channel under it.
        std::shared_ptr<channel<T>> ch_;
        std::string why_;
        std::uint64_t t0_ = 0;
        typename channel<T>::receive_awaiter aw_;
    };

private:
    struct running {
        explicit running(runtime_options o) : rt(std::make_unique<runtime>(o)), env(*rt) {}
        std::unique_ptr<runtime> rt;
        detail::run_env env;
        std::vector<std::shared_ptr<void>> channels;
        std::vector<std::unique_ptr<stage_stats>> stats;
        std::shared_ptr<channel<T>> last;
        std::function<std::string()> last_wait_check;  // the last stage's (see stage_setup)
        std::uint64_t start_ns = 0;
        std::unique_ptr<detail::metrics_exporter> metrics;  // stopped before the runtime goes
        std::vector<detail::knob> knobs;                     // what the stages offer the tuner
        std::vector<std::shared_ptr<detail::worker_gate>> gates;  // per link: its workers' gate when tuned
        std::uint64_t fixed_bytes = 0;                       // what stages hold whatever the budget
        std::vector<detail::budget_share> shares;            // what stages size while they run
        std::vector<std::pair<std::string, std::uint64_t>> budget;  // its division, for the figures
        std::unique_ptr<detail::hill_climb> climb;           // under climb_m
        mutable std::mutex climb_m;
        std::thread tuner;
        std::thread progress;
        std::mutex progress_m;
        std::condition_variable progress_cv;
        bool progress_stop = false;
        bool tuner_stop = false;  // under progress_m, like progress_stop
        ~running() {
            // stop() joins before destruction; this is the path for a pipeline that was
            // never stopped explicitly and is torn down by an exception in start.
            metrics.reset();
            env.cancel_all();
            env.wait_idle();
            if (progress.joinable() || tuner.joinable()) {
                {
                    std::lock_guard lock(progress_m);
                    progress_stop = true;
                }
                progress_cv.notify_all();
                if (progress.joinable()) progress.join();
                if (tuner.joinable()) tuner.join();
            }
            rt->join();
            env.destroy_parked();
        }
    };

    std::shared_ptr<channel<T>> channel_() {
        std::lock_guard lock(m_);
        if (!run_) {
            if (stopped_) {
                if (!empty_) empty_ = std::make_shared<channel<T>>(channel_limits{1, 0});
                empty_->close();
                return empty_;
            }
            start_locked();
        }
        return run_->last;
    }

    bool has_wait_check() {
        std::lock_guard lock(m_);
        return run_ && run_->last_wait_check;
    }

    /// Non-empty when the consumer waits for an item that cannot come: the last stage
    /// says why (to_device: the consumer holds every ring slot).
    std::string would_never_arrive(const channel<T>& ch) {
        std::function<std::string()> check;
        {
            std::lock_guard lock(m_);
            if (!run_ || run_->last.get() != &ch) return {};
            check = run_->last_wait_check;
        }
        return check ? check() : std::string{};
    }

    /// Ends the pipeline with `e`: the consumer gets what is buffered, then `e`; every
    /// stage's next send fails and it unwinds. For errors raised outside the stages
    /// (a progress callback).
    void fail(running& r, std::exception_ptr e) {
        r.last->close(std::move(e));
    }
    worker_counters& consumer() { return consumer_; }

    template <class U>
    void note_position(const U& v) {
        // One stamp per item, in order: the batch stage's record of where each batch ends.
        std::optional<stream_point> stamp;
        {
            std::lock_guard lock(m_);
            if (run_) stamp = run_->env.run->pop_stamp();
        }
        if constexpr (requires { v.epoch; v.position; }) stamp = stream_point{v.epoch, v.position};
        else if constexpr (requires { v.host().epoch; }) stamp = stream_point{v.host().epoch, v.host().position};
        if (stamp) {
            position_ = *stamp;
            took_position_ = true;
        } else {
            took_other_ = true;
        }
    }

    // The buffer pool's part of a memory budget: freed buffers it keeps for the next
    // allocation, without which each is fresh memory, faulted in page by page (0.5-1.7
    // s/GiB on the bench VMs). Large buffers are mapped directly (detail::maps_buffer), so
    // the pool is their only cache. At an eighth, a 48 MiB budget could not keep one batch
    // of 6.4 MB and every batch was fresh: sluice-probe's budget test took 0.26-0.39 s; at
    // a third 0.13-0.24 s (a quarter 0.18-0.28, a half 0.13-0.21), peak RSS 63-84 MB
    // either way.
    static constexpr std::uint64_t pool_share_of_budget = 3;

    // The shares that take part of the settings' quarter (not those sized as channels).
    static std::size_t settings_shares(const std::vector<detail::budget_share>& shares) {
        return static_cast<std::size_t>(
            std::count_if(shares.begin(), shares.end(), [](const detail::budget_share& sh) { return !sh.as_channel; }));
    }

    // The memory budget (pipeline_options::memory), divided before anything runs: a
    // third to the buffer pool's cache (set with the runtime), what stages hold whatever
    // the budget says (a shuffle's max_bytes) first, a quarter shared by the settings whose
    // units hold memory (fetch's requests in flight, capped) and the stages that size
    // theirs while they run (to_device's ring), and the rest in equal shares
    // to every channel's byte budget (a channel's own smaller budget stays) and to what
    // stages hold as a channel would (fetch's room for waiting parts). Floors (1 MiB
    // a channel and a fetch's room, a setting's minimum) can overshoot a tiny budget: the
    // figures say so.
    void divide_budget(running& r, std::vector<channel_limits>& limits) const {
        const std::uint64_t M = opts_.memory;
        auto add = [](std::uint64_t a, std::uint64_t b) { return a > ~std::uint64_t{0} - b ? ~std::uint64_t{0} : a + b; };
        auto& b = r.budget;
        b.push_back({"memory budget", M});
        const std::uint64_t pool = std::min<std::uint64_t>(opts_.runtime.pool_cache_bytes, M / pool_share_of_budget);
        b.push_back({"buffer pool cache", pool});
        std::uint64_t spent = add(pool, r.fixed_bytes);
        if (r.fixed_bytes) b.push_back({"held by stages whatever the budget (a shuffle's max_bytes)", r.fixed_bytes});
        const std::size_t settings = settings_shares(r.shares), as_channels = r.shares.size() - settings;
        const std::size_t n = detail::memory_knobs(r.knobs) + settings;
        for (auto& sh : r.shares) {
            if (sh.as_channel) continue;  // below, with the channels
            const std::uint64_t part = M / 4 / n;
            sh.give(part);
            spent = add(spent, part);
            b.push_back({sh.what, part});
        }
        for (auto& k : r.knobs) {
            if (!k.bytes_each) continue;
            // Untuned, a setting stays within its share at the worst case; the tuner may go
            // past that where units are measured to hold less (small objects).
            const unsigned cap = detail::memory_cap(k, M, n, k.bytes_each);
            if (k.get() > cap) k.set(cap);
            const std::uint64_t part = std::max(M / 4 / n, std::uint64_t{k.min} * k.bytes_each);  // the floor may pass it
            spent = add(spent, part);
            b.push_back({k.stage + "." + k.name + ": " + std::to_string(cap) + " at " + std::to_string(k.bytes_each) +
                             " bytes each (tuned: more where each holds less)",
                         part});
        }
        const std::uint64_t left = M > spent ? M - spent : 0;
        const std::uint64_t share =
            std::max<std::uint64_t>(std::uint64_t{1} << 20, left / std::max<std::size_t>(1, limits.size() + as_channels));
        for (auto& l : limits) l.bytes = l.bytes ? std::min<std::uint64_t>(l.bytes, share) : share;
        b.push_back({"each of " + std::to_string(limits.size()) + " channels", share});
        spent = add(spent, share * limits.size());
        for (auto& sh : r.shares) {
            if (!sh.as_channel) continue;
            const std::uint64_t part = sh.most ? std::min(sh.most, share) : share;
            sh.give(part);
            spent = add(spent, part);
            b.push_back({sh.what + " (as a channel)", part});
        }
        if (spent > M)
            b.push_back({"OVER the budget by (its floors: 1 MiB a channel and a fetch's room, a setting's minimum, a shuffle's max_bytes)",
                         spent - M});
    }

    void start_locked() {
        auto ro = opts_.runtime;
        if (opts_.memory) ro.pool_cache_bytes = std::min<std::size_t>(ro.pool_cache_bytes, opts_.memory / pool_share_of_budget);
        auto r = std::make_unique<running>(ro);
        if (!opts_.resume.empty()) r->env.run = std::make_shared<detail::run_state>(opts_.resume);
        r->start_ns = detail::now_ns();
        consumer_.start_ns.store(r->start_ns, std::memory_order_relaxed);
        // Setups first, last stage first, so a stage can choose the memory of the one
        // before it, and a stage that cannot work fails the start before anything runs.
        const auto& links = src_.links();
        std::vector<std::shared_ptr<buffer_source>> memory(links.size());
        std::vector<std::shared_ptr<void>> states(links.size());
        std::vector<unsigned> workers(links.size());  // each stage's workers to start
        for (std::size_t i = 0; i < links.size(); ++i) {
            workers[i] = std::max(1u, links[i]->opts.concurrency);
            detail::note_delivers_on_loop(r->env.run.get(), i, links[i]->opts.on == pool::io);
        }
        for (std::size_t i = links.size(); i-- > 0;) {
            if (!links[i]->setup) continue;
            stage_setup s{*r->rt};
            s.internal.upstream_memory = i ? &memory[i - 1] : nullptr;
            s.internal.memory = memory[i];
            s.internal.run = r->env.run.get();
            s.internal.at = i;
            if (opts_.tune || opts_.memory) s.internal.knobs = &r->knobs;
            if (opts_.memory) s.internal.fixed_bytes = &r->fixed_bytes;
            if (opts_.memory) s.internal.shares = &r->shares;
            const std::size_t knobs_before = r->knobs.size();
            links[i]->setup(s);
            for (std::size_t k = knobs_before; k < r->knobs.size(); ++k) r->knobs[k].at = i;  // its stage in the figures
            if (i + 1 == links.size()) r->last_wait_check = std::move(s.internal.consumer_wait_check);
            r->env.keep.push_back(s.internal.state);  // before its on_stop can run: ~running cancels
            states[i] = std::move(s.internal.state);
            for (auto& f : s.on_stop) r->env.cancellers.push_back(std::move(f));
        }
        r->env.run->check_noted();
        // Tuned, the stages whose workers pass a gate (map, decode_images, batch's
        // collation, read) offer how many of them work, from 1 to their .concurrency.
        r->gates.resize(links.size());
        if (opts_.tune)
            for (std::size_t i = 0; i < links.size(); ++i) {
                const auto& l = *links[i];
                if (!l.gated || workers[i] < 2) continue;
                auto g = std::make_shared<detail::worker_gate>(workers[i], r->rt->executor_for(l.opts.on));
                r->knobs.push_back({.stage = l.name,
                                    .name = "concurrency",
                                    .min = 1,
                                    .max = workers[i],
                                    .start = 1,
                                    .bytes_each = l.unit_bytes,
                                    .bytes_now = nullptr,
                                    .get = [g = g.get()] { return g->active(); },
                                    .set = [g = g.get()](unsigned n) { g->set(n); },
                                    .pressure = nullptr,
                                    .at = i});
                r->gates[i] = std::move(g);
            }
        std::vector<channel_limits> limits;
        for (auto& l : links) limits.push_back(l->opts.out);
        if (opts_.memory) divide_budget(*r, limits);
        void* prev = nullptr;
        const bool traced = !opts_.trace.empty();
        std::size_t spans_each = detail::span_log::default_max;
        if (traced) {  // a path that cannot be written fails the start, not the end (an old trace stays)
            const std::string tmp = opts_.trace + ".tmp";
            std::FILE* f = std::fopen(tmp.c_str(), "w");
            if (!f)
                throw error("sluice: trace file " + opts_.trace + " (writing " + tmp + "): " + std::strerror(errno),
                            {errno, std::generic_category()});
            std::fclose(f);
            std::remove(tmp.c_str());
            // At most 262,144 spans (6 MiB) for the whole pipeline, shared by its workers.
            std::size_t all = 1;
            for (unsigned w : workers) all += w;
            spans_each = std::clamp<std::size_t>(detail::span_log::pipeline_max / all, 256, detail::span_log::default_max);
            consumer_.spans = std::make_unique<detail::span_log>(spans_each);
        }
        for (std::size_t i = 0; i < links.size(); ++i) {
            auto& l = links[i];
            auto out = l->make_output(limits[i]);
            r->env.cancellers.push_back(l->canceller(out));
            r->stats.push_back(std::make_unique<stage_stats>(l->name, workers[i],
                                                             l->counts_records, traced, spans_each));
            r->channels.push_back(out);
            // Tuned, a channel whose bytes are bounded (every channel under a memory budget,
            // of items that say their bytes) offers its item capacity, from what it was
            // given up to 16 times that: where work comes in bursts more room lets both
            // ends keep working. Its byte budget stays, so this costs no memory past it; a
            // channel bounded by items alone is not offered (more items could hold any
            // number of bytes), nor one given more than 65,536 items.
            auto cap = opts_.tune && limits[i].bytes && limits[i].items && limits[i].items <= (1u << 16)
                           ? l->capacity(out)
                           : decltype(l->capacity(out)){};
            if (cap.first) {
                const auto given = static_cast<unsigned>(limits[i].items);
                r->knobs.push_back({.stage = l->name,
                                    .name = "out.items",
                                    .min = given,
                                    .max = given * 16,
                                    .start = given,
                                    .bytes_each = 0,
                                    .bytes_now = nullptr,
                                    .get = [g = cap.first] { return static_cast<unsigned>(g()); },
                                    .set = [s = cap.second](unsigned n) { s(n); },
                                    .pressure = nullptr,
                                    .at = i,
                                    .channel = true});
            }
        }
        if (opts_.tune && !r->knobs.empty()) {
            r->climb = std::make_unique<detail::hill_climb>(r->knobs, opts_.memory, settings_shares(r->shares));
            r->climb->begin(0);
        }
        for (std::size_t i = 0; i < src_.links().size(); ++i) {
            src_.links()[i]->start(r->env, prev, r->channels[i].get(), *r->stats[i],
                                   memory[i] ? memory[i] : r->rt->buffers(), states[i], r->gates[i].get(), workers[i]);
            prev = r->channels[i].get();
        }
        r->last = std::static_pointer_cast<channel<T>>(r->channels.back());
        if (!opts_.metrics.file.empty() || opts_.metrics.port >= 0)
            r->metrics = std::make_unique<detail::metrics_exporter>(
                opts_.metrics.file, opts_.metrics.port, opts_.metrics.interval,
                [this, rp = r.get()] { return figures_of(*rp).prometheus(); });
        if (r->climb) {
            r->tuner = std::thread([this, rp = r.get()] {
                std::unique_lock lock(rp->progress_m);
                while (!rp->progress_cv.wait_for(lock, std::chrono::milliseconds(500),
                                                 [&] { return rp->progress_stop || rp->tuner_stop; })) {
                    auto f = figures_of(*rp);
                    std::lock_guard climbing(rp->climb_m);
                    rp->climb->step(f, f.seconds);
                }
            });
        }
        if (opts_.progress.count() > 0) {
            r->progress = std::thread([this, rp = r.get()] {
                std::unique_lock lock(rp->progress_m);
                const bool tty = ::isatty(2) == 1;
                bool printed = false;
                while (!rp->progress_cv.wait_for(lock, opts_.progress, [&] { return rp->progress_stop; })) {
                    auto f = figures_of(*rp);
                    if (opts_.on_progress) {
                        // The callback is the user's: an exception from it ends the
                        // pipeline with that error (after what is buffered), never the
                        // process, and it is not called again.
                        try {
                            opts_.on_progress(f);
                        } catch (...) {
                            fail(*rp, std::current_exception());
                            break;
                        }
                    } else {
                        std::fprintf(stderr, tty ? "\r%s" : "%s\n", f.progress_line().c_str());
                        printed = true;
                    }
                }
                if (printed && tty) std::fprintf(stderr, "\n");
            });
        }
        run_ = std::move(r);
    }

    // The Chrome trace of the run (pipeline_options::trace), after every worker ended.
    void write_trace(const running& r) {
        std::vector<detail::traced_worker> ws;
        for (auto& st : r.stats)
            for (std::size_t i = 0; i < st->workers(); ++i) {
                auto& w = st->worker(i);
                ws.push_back({st->name(), static_cast<unsigned>(i), w.start_ns.load(), w.end_ns.load(),
                              w.spans ? w.spans->spans() : std::vector<detail::span_log::span>{},
                              w.spans ? w.spans->dropped() : 0});
            }
        const auto end = detail::now_ns();
        ws.push_back({"consumer", 0, r.start_ns, end, consumer_.spans ? consumer_.spans->spans() : std::vector<detail::span_log::span>{},
                      consumer_.spans ? consumer_.spans->dropped() : 0});
        const std::string text = detail::chrome_trace(ws, r.start_ns, end);
        const std::string tmp = opts_.trace + ".tmp";
        std::FILE* f = std::fopen(tmp.c_str(), "w");
        bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
        if (f) ok = std::fclose(f) == 0 && ok;
        if (!ok || std::rename(tmp.c_str(), opts_.trace.c_str()) != 0) {
            std::fprintf(stderr, "sluice: trace file %s: %s\n", opts_.trace.c_str(), std::strerror(errno));
            std::remove(tmp.c_str());
        }
    }

    pipeline_figures figures_of(const running& r) const {
        pipeline_figures f;
        const auto now = detail::now_ns();
        f.seconds = double(now - r.start_ns) * 1e-9;
        f.io_loop_cpu_s = r.rt->io_cpu_seconds();  // the I/O loop's busy time
        for (std::size_t i = 0; i < r.stats.size(); ++i) {
            f.stages.push_back(snapshot(*r.stats[i], now));
            if (i < r.gates.size() && r.gates[i]) f.stages.back().active = r.gates[i]->active();
        }
        // The consumer: busy between receives, waiting inside them.
        stage_figures c;
        c.name = "consumer";
        c.workers = 1;
        c.items_in = consumer_.items_in.load(std::memory_order_relaxed);
        c.bytes_in = consumer_.bytes_in.load(std::memory_order_relaxed);
        c.wait_input_s = double(consumer_.wait_in_ns.load(std::memory_order_relaxed)) * 1e-9;
        c.busy_s = double(consumer_.wait_out_ns.load(std::memory_order_relaxed)) * 1e-9;
        f.stages.push_back(std::move(c));
        f.budget = r.budget;
        if (r.climb) {
            std::lock_guard lock(r.climb_m);
            f.tuning = r.climb->log();
            f.tuned = r.climb->settings();
        }
        return f;
    }

    source<T> src_;
    pipeline_options opts_;
    mutable std::mutex m_;
    std::unique_ptr<running> run_;
    std::shared_ptr<channel<T>> empty_;
    std::atomic<int> readers_{0};
    std::shared_ptr<anchor> anchor_{new anchor{{}, this}};
    bool stopped_ = false;
    worker_counters consumer_;
    std::uint64_t last_return_ns_ = 0;
    pipeline_figures final_;
    std::shared_ptr<detail::run_state> last_run_;
    stream_point position_;  // of the last item taken (the trainer's thread)
    bool took_position_ = false;
    bool took_other_ = false;
};

template <class T>
pipeline(source<T>, pipeline_options) -> pipeline<T>;
template <class T>
pipeline(source<T>) -> pipeline<T>;

}  // namespace sluice
