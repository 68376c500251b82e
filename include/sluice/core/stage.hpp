#pragma once
// Stages and their composition.
//
// A stage<In, Out> is a recipe: one or more links, each a coroutine body that reads In
// items from its input channel and sends Out items to its output channel. A source<T> is
// a stage<void, T>: it has no input. Nothing runs until a pipeline is built from a source.
//
// Composition is checked at compile time: `a | b` compiles only when a's output type is
// b's input type; otherwise the error names both types as the template arguments of
// sluice::detail::pipe_type_mismatch<Produced, Expected>. Stages whose input type is
// generic (shuffle, batch with a collate function...) are closures that become typed
// stages when attached to something with a known output type, so partial pipelines like
// `auto tail = sluice::shuffle({...}) | sluice::batch({...});` can be stored and reused.
//
// Per stage: concurrency (how many workers run the body at once), ordering (ordered:
// output in input order even with several workers; unordered: as completed) and the
// executor (the I/O loop or the CPU pool).

#include <sluice/core/channel.hpp>
#include <sluice/core/detail/turnstile.hpp>
#include <sluice/core/detail/worker_gate.hpp>
#include <sluice/core/runtime.hpp>
#include <sluice/core/state.hpp>
#include <sluice/core/stats.hpp>
#include <sluice/core/task.hpp>

#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice {

enum class ordering { ordered, unordered };

struct stage_options {
    /// Workers running the stage's body at once.
    unsigned concurrency = 1;
    /// Whether several workers keep input order in their output.
    ordering order = ordering::ordered;
    /// Executor the workers run on.
    pool on = pool::cpu;
    /// Capacity of the stage's output channel (items, and bytes when non-zero).
    channel_limits out = {64, 0};
};

namespace detail {
struct run_env;

/// One worker's standing with its running pipeline. Once the stage is stopping (the
/// pipeline stops, or the stage's consumer is gone), its next send or next() throws
/// detail::stopped; a body that swallows that (a user's `catch (...)`) and sends or
/// receives again is parked there: never resumed, counted as finished, and its frame is
/// destroyed when the pipeline has joined its threads. So a stop ends every body.
struct worker_life {
    std::stop_token stop;
    bool told = false;               // a send or next() already threw stopped
    std::coroutine_handle<> root;    // the worker's outermost frame
    run_env* env = nullptr;
    std::function<void(std::exception_ptr)> done;  // the pipeline's end-of-worker bookkeeping
};
/// Suspends the worker for good: it is finished for the pipeline, its frame goes at
/// teardown. Defined after run_env.
inline void park(worker_life& w);
}  // namespace detail

/// A stage worker's end of its input channel; counts what it receives.
template <class In>
class input {
public:
    input(channel<In>* ch, worker_counters* c, detail::worker_life* life = nullptr) : ch_(ch), c_(c), life_(life) {}

    struct next_op {
        typename channel<In>::receive_awaiter aw;
        worker_counters* c;
        detail::worker_life* life;
        enum { go, stop, park } mode = go;
        bool await_ready() {
            if (life && life->told) {
                mode = park;
                return false;
            }
            if (life && life->stop.stop_requested()) {
                mode = stop;
                return true;
            }
            return aw.await_ready();
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            if (mode == park) detail::park(*life);
            else aw.await_suspend(h);
        }
        std::optional<In> await_resume() {
            if (mode == stop) {
                life->told = true;
                throw detail::stopped{};
            }
            auto r = aw.await_resume();
            if (r) {
                detail::bump(c->items_in);
                detail::bump(c->bytes_in, byte_size_of(*r));
            } else if (life && life->stop.stop_requested()) {  // ended by the stop, not by the producers
                life->told = true;
                throw detail::stopped{};
            }
            return r;
        }
    };
    /// `co_await in.next()`: the next item, or an empty optional at the end of input.
    /// Rethrows an upstream error after the items sent before it. Once the stage is
    /// stopping it throws detail::stopped instead (not an error: the stage ends cleanly),
    /// and a later call never returns (see detail::worker_life).
    next_op next(std::uint64_t* index = nullptr) {
        return next_op{ch_->receive(c_->input_meter(), index), c_, life_};
    }
    /// Stop reading: upstream stages see their sends fail and unwind.
    void cancel() { ch_->cancel(); }

private:
    channel<In>* ch_;
    worker_counters* c_;
    detail::worker_life* life_;
};
template <>
class input<void> {
public:
    input(void*, worker_counters*, detail::worker_life* = nullptr) {}
    void cancel() {}
};

/// A stage worker's end of its output channel; counts what it sends.
template <class Out>
class output {
public:
    output(channel<Out>* ch, worker_counters* c, detail::worker_life* life = nullptr) : ch_(ch), c_(c), life_(life) {}

    // A channel wait of the worker's: parked for good once the worker was told to stop
    // (see detail::worker_life); one that fails (the consumer stopped) throws stopped.
    template <class Aw>
    struct told_op {
        Aw aw;
        detail::worker_life* life;
        bool parking = false;
        bool await_ready() {
            if (life && life->told) {
                parking = true;
                return false;
            }
            return aw.await_ready();
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            if (parking) detail::park(*life);
            else aw.await_suspend(h);
        }
        void stop_unless_done() {
            if (!aw.await_resume()) {
                if (life) life->told = true;
                throw detail::stopped{};
            }
        }
    };
    struct send_op : told_op<typename channel<Out>::send_awaiter> {
        worker_counters* c;
        std::size_t n;
        void await_resume() {
            this->stop_unless_done();
            detail::bump(c->items_out);
            detail::bump(c->bytes_out, n);
        }
    };
    /// `co_await out.send(v)`: suspends while downstream is full. When the pipeline is
    /// stopping it throws detail::stopped, which unwinds the stage body (and is not an
    /// error): stage bodies need no cancellation checks of their own. A body that catches
    /// that and sends again is parked for good (see detail::worker_life).
    send_op send(Out v) {
        const std::size_t n = byte_size_of(v);
        return send_op{{ch_->send(std::move(v), c_->output_meter()), life_}, c_, n};
    }

    struct drained_op : told_op<typename channel<Out>::drained_awaiter> {
        void await_resume() { this->stop_unless_done(); }
    };
    /// `co_await out.drained()`: suspends until downstream has taken everything sent,
    /// sending nothing; the wait counts as output wait. A stage that awaits it after each
    /// send hands over one item at a time and makes the next only once the last is being
    /// worked on (batch's group stage under a memory budget), whatever the channel's
    /// capacity. Stopping as for send.
    drained_op drained() { return drained_op{{ch_->drained(c_->output_meter()), life_}}; }

private:
    channel<Out>* ch_;
    worker_counters* c_;
    detail::worker_life* life_;
};

namespace detail {
/// The library's plumbing in a worker's context: the run's shared state (resume, what
/// the stages tell each other about the sequence; see core/state.hpp) and the state the
/// stage's setup made, type-erased here and handed to the body typed (see make_stage).
struct context_internal {
    std::shared_ptr<void> state;
    run_state* run = nullptr;
    /// How many of the stage's workers may take work, when the tuner moves it (see
    /// detail::pass_gate); null otherwise.
    worker_gate* gate = nullptr;
};
/// The library's plumbing in a stage's setup.
struct knob;  // core/detail/tuning.hpp
/// A share of the memory budget for memory a stage sizes only while it runs (to_device:
/// ring batches of pinned staging memory, whose bytes come with the batches; fetch: room
/// for the parts of a large object waiting their turn).
struct budget_share {
    std::string what;  // for the budget's lines in the figures
    std::function<void(std::uint64_t)> give;  // called with its bytes before anything runs
    /// Sized as one more channel (an equal part of what the channels share), not as a
    /// setting (a part of the quarter the settings share): for memory that, like a
    /// channel's, holds bytes on their way downstream.
    bool as_channel = false;
    /// As a channel: the most it can use (its own byte limit, as a channel's `.out.bytes`);
    /// it is given at most this, and the division counts what it is given. 0: no limit.
    std::uint64_t most = 0;
};

struct setup_internal {
    /// The memory the previous stage should allocate its outputs from (null for the
    /// first stage); a setup may set it (to_device asks for its engine's staging memory).
    std::shared_ptr<buffer_source>* upstream_memory = nullptr;
    /// The memory this stage's own outputs will be allocated from, as the next stage's
    /// setup chose it (setups run last stage first); null: the runtime's pool.
    std::shared_ptr<buffer_source> memory = nullptr;
    /// Shared by every stage of this run (see core/state.hpp).
    run_state* run = nullptr;
    /// For the pipeline's last stage: asked when the consumer is about to wait for an
    /// item that has not arrived; a non-empty answer is a wait the pipeline can never
    /// satisfy by itself (every ring slot held by the consumer), thrown as an error
    /// instead of blocking forever.
    std::function<std::string()> consumer_wait_check = nullptr;
    /// What the setup returned (see make_stage).
    std::shared_ptr<void> state;
    /// Where a stage offers settings to the tuner (pipeline_options::tune); null when the
    /// pipeline is not tuned.
    std::vector<knob>* knobs = nullptr;
    /// The stage's place in the chain (0: the first), for what it offers the stages
    /// around it (core/detail/shard_counting.hpp).
    std::size_t at = 0;
    /// Where a stage adds the bytes it holds whatever the memory budget says (a shuffle's
    /// max_bytes: its buffer decides the order, so the budget cannot shrink it); null
    /// without a budget.
    std::uint64_t* fixed_bytes = nullptr;
    /// Where a stage asks for a share of the memory budget, equal to a tuner setting's or,
    /// `as_channel`, to a channel's (see budget_share); null without a budget.
    std::vector<budget_share>* shares = nullptr;
    /// Whether the pipeline has a memory budget (pipeline_options::memory).
    bool budgeted() const noexcept { return shares != nullptr; }
};
}  // namespace detail

/// What one worker of a stage gets: its ports, the runtime, its stats, for ordered
/// stages with several workers the turnstile that restores input order, the memory its
/// outputs should be allocated from, and its stop token. The state a stage's setup made
/// reaches its body as a typed second argument (see make_stage).
template <class In, class Out>
struct stage_context {
    sluice::input<In> in;
    sluice::output<Out> out;
    sluice::runtime& rt;
    stage_stats& stats;
    unsigned worker;
    /// Ordered stages with several workers: `ctx.in.next(&ticket)`, then
    /// `co_await turn->wait(ticket)` before sending and `turn->done(ticket)` after (see
    /// detail::item_worker). Null otherwise.
    detail::turnstile* turn;
    /// Where to allocate output buffers: the runtime's pool, unless the next stage asked
    /// for other memory in its setup (to_device asks for pinned memory, so the batch
    /// stage collates straight into it).
    std::shared_ptr<buffer_source> memory;
    /// Requested when the pipeline stops or this stage's consumer is gone. Every wait of
    /// the library observes it; a user's coroutine that waits on something of its own
    /// registers a std::stop_callback on it, or polls stopping() between steps.
    std::stop_token stop = {};
    bool stopping() const noexcept { return stop.stop_requested(); }
    /// Library plumbing (resume bookkeeping); a user's stage does not need it.
    detail::context_internal internal = {};
};

/// What a stage's setup gets. Setup runs on the thread that starts the pipeline, for
/// every stage, before any stage starts; an exception from it fails the start, so a stage
/// that cannot work (no GPU) says so at once rather than at its first item. What it
/// returns (a std::shared_ptr<S>, or nothing) reaches every worker's body as `S&`.
struct stage_setup {
    sluice::runtime& rt;
    /// Functions to run when the pipeline stops, with the channels' cancellation: wake
    /// whatever the stage's workers may wait on besides channels and ctx.stop.
    std::vector<std::function<void()>> on_stop = {};
    /// Library plumbing (resume bookkeeping, the memory handshake with the stage before).
    detail::setup_internal internal = {};
};

namespace detail {

/// Shared by all stages of one running pipeline: counts live workers so that stopping can
/// wait for all of them, and knows how to cancel every channel.
struct run_env {
    explicit run_env(sluice::runtime& r) : rt(r) {}
    sluice::runtime& rt;
    std::mutex m;
    std::condition_variable cv;
    std::size_t live = 0;
    std::vector<std::function<void()>> cancellers;
    std::vector<std::shared_ptr<void>> keep;
    std::shared_ptr<run_state> run = std::make_shared<run_state>();
    std::vector<std::coroutine_handle<>> parked;  // under m

    void started() {
        std::lock_guard lock(m);
        ++live;
    }
    void finished() {
        std::lock_guard lock(m);
        if (--live == 0) cv.notify_all();
    }
    void cancel_all() {
        for (auto& c : cancellers) c();
    }
    void wait_idle() {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return live == 0; });
    }
    void park(std::coroutine_handle<> root) {
        std::lock_guard lock(m);
        parked.push_back(root);
    }
    /// Frees the frames of parked workers. Only once the runtime's threads are joined: no
    /// thread may still be inside the await_suspend that parked one.
    void destroy_parked() {
        std::vector<std::coroutine_handle<>> p;
        {
            std::lock_guard lock(m);
            p.swap(parked);
        }
        for (auto h : p) h.destroy();
    }
    ~run_env() { destroy_parked(); }
};

inline void park(worker_life& w) {
    w.env->park(w.root);
    w.done(std::make_exception_ptr(stopped{}));
}

inline bool is_stop(const std::exception_ptr& e) {
    if (!e) return false;
    try {
        std::rethrow_exception(e);
    } catch (const stopped&) {
        return true;
    } catch (...) {
        return false;
    }
}

/// One stage of a chain, with its types erased so chains can be stored as vectors.
struct link {
    std::string name;
    stage_options opts;
    bool counts_records = false;
    /// Its workers pass a worker_gate before each item (detail::pass_gate), so the tuner may
    /// move how many work, from 1 to opts.concurrency; `unit_bytes`: the memory one
    /// working worker may hold (read: a chunk), 0 when small.
    bool gated = false;
    std::uint64_t unit_bytes = 0;
    virtual ~link() = default;
    /// Its output channel, with `limits` (the stage's `.out`, or the memory budget's share).
    virtual std::shared_ptr<void> make_output(channel_limits limits) const = 0;
    virtual std::function<void()> canceller(const std::shared_ptr<void>& out) const = 0;
    /// Its output channel's item capacity, to read and to set (the tuner's); empty
    /// functions when a byte limit cannot bound it (its items do not say their bytes).
    virtual std::pair<std::function<std::size_t()>, std::function<void(std::size_t)>> capacity(
        const std::shared_ptr<void>& out) const = 0;
    /// Optional; see stage_setup.
    std::function<void(stage_setup&)> setup;
    /// `gate`: when the tuner moves how many workers work (gated links only), else null.
    /// `workers`: how many to start (opts.concurrency, or fewer as its setup said).
    virtual void start(run_env& env, void* in, void* out, stage_stats& st, std::shared_ptr<buffer_source> memory,
                       std::shared_ptr<void> state, worker_gate* gate, unsigned workers) const = 0;
};

template <class In, class Out>
struct link_impl final : link {
    using body_fn = std::function<task<void>(stage_context<In, Out>&)>;
    body_fn body;

    std::shared_ptr<void> make_output(channel_limits limits) const override {
        return std::make_shared<channel<Out>>(limits);
    }
    std::function<void()> canceller(const std::shared_ptr<void>& out) const override {
        return [ch = static_cast<channel<Out>*>(out.get())] { ch->cancel(); };
    }
    std::pair<std::function<std::size_t()>, std::function<void(std::size_t)>> capacity(
        const std::shared_ptr<void>& out) const override {
        if constexpr (!weighs_bytes<Out>) return {};
        std::weak_ptr<channel<Out>> w = std::static_pointer_cast<channel<Out>>(out);
        return {[w] { auto ch = w.lock(); return ch ? ch->limits().items : std::size_t{0}; },
                [w](std::size_t n) { if (auto ch = w.lock()) ch->set_items(n); }};
    }
    void start(run_env& env, void* in, void* out, stage_stats& st, std::shared_ptr<buffer_source> memory,
               std::shared_ptr<void> setup_state, worker_gate* gate, unsigned workers) const override {
        struct state {
            std::vector<std::unique_ptr<stage_context<In, Out>>> contexts;
            std::vector<std::unique_ptr<worker_life>> lives;
            std::unique_ptr<turnstile> turn;
            std::stop_source stop;
        };
        auto s = std::make_shared<state>();
        auto* inch = static_cast<channel<In>*>(in);
        auto* outch = static_cast<channel<Out>*>(out);
        const unsigned n = std::max(1u, workers);
        if (n > 1 && opts.order == ordering::unordered)
            env.run->epochs_unknown("stage '" + name + "' is unordered (" + std::to_string(n) +
                                    " workers, output as completed), so the sequence depends on timing; build "
                                    "it with .order = sluice::ordering::ordered (sluice-probe --deterministic)");
        if (n > 1 && opts.order == ordering::ordered) s->turn = std::make_unique<turnstile>();
        // The stage stops with the pipeline, and when its consumer is gone; then no worker
        // may wait for a turn that will never come, nor at the gate for good. (One hook:
        // a channel keeps one.)
        auto stop_all = [ss = s->stop, t = s->turn.get(), gate]() mutable {
            ss.request_stop();
            if (t) t->cancel();
            if (gate) gate->open();
        };
        env.cancellers.push_back(stop_all);
        outch->on_cancel(stop_all);
        auto ex = env.rt.executor_for(opts.on);
        std::vector<task<void>> bodies;
        for (unsigned i = 0; i < n; ++i) {
            auto& c = st.worker(i);
            auto life = std::make_unique<worker_life>();
            life->stop = s->stop.get_token();
            life->env = &env;
            s->contexts.push_back(std::make_unique<stage_context<In, Out>>(stage_context<In, Out>{
                sluice::input<In>(inch, &c, life.get()), sluice::output<Out>(outch, &c, life.get()), env.rt, st, i,
                s->turn.get(), memory, s->stop.get_token(), {setup_state, env.run.get(), gate}}));
            s->lives.push_back(std::move(life));
            bodies.push_back(body(*s->contexts.back()));  // may throw: nothing counted yet
        }
        env.keep.push_back(s);
        outch->add_producer(n);
        for (unsigned i = 0; i < n; ++i) {
            auto& c = st.worker(i);
            c.start_ns.store(detail::now_ns(), std::memory_order_relaxed);
            env.started();
            auto* ctx = s->contexts[i].get();
            auto* life = s->lives[i].get();
            // done must capture only raw pointers: the pipeline owns everything and
            // waits for env.finished() before destroying it.
            life->done = [envp = &env, ctx, outch, c = &c, gate](std::exception_ptr e) {
                const bool stop = is_stop(e);
                // One worker ended (end of input, an error, a stop): the others must reach
                // their input to end the same way.
                if (gate) gate->open();
                if (e) {  // failed or stopped: stop upstream and sibling workers too
                    ctx->in.cancel();
                    if (ctx->turn) ctx->turn->cancel();
                }
                c->end_ns.store(detail::now_ns(), std::memory_order_relaxed);
                outch->producer_done(stop ? nullptr : e);
                envp->finished();
            };
            // A body that swallowed the stop and returned is stopped all the same.
            auto d = run_detached(std::move(bodies[i]), [life](std::exception_ptr e) {
                if (!e && life->told) e = std::make_exception_ptr(stopped{});
                life->done(e);
            });
            d.h.promise().ex = ex;
            life->root = d.h;
            resume_on(ex, d.h);
        }
    }
};

template <class... T>
inline constexpr bool always_false = false;

/// Instantiated when `a | b` joins mismatched types; the compiler's message shows
/// pipe_type_mismatch<Produced, Expected> with both types spelled out.
template <class Produced, class Expected>
struct pipe_type_mismatch {
    static_assert(always_false<Produced, Expected>,
                  "sluice: cannot compose stages: the left side produces `Produced` but the "
                  "right stage expects `Expected` (see pipe_type_mismatch<Produced, Expected> "
                  "below)");
    static constexpr bool value = false;
};

}  // namespace detail

/// A recipe for a chain of stages taking In and giving Out (In = void: a source).
template <class In, class Out>
class stage {
public:
    using input_type = In;
    using output_type = Out;

    stage() = default;
    explicit stage(std::vector<std::shared_ptr<const detail::link>> links)
        : links_(std::move(links)) {}

    const std::vector<std::shared_ptr<const detail::link>>& links() const noexcept {
        return links_;
    }

    /// Direct-call form: `s(upstream)` is `upstream | s`.
    template <class A>
    stage<A, Out> operator()(stage<A, In> upstream) const {
        return std::move(upstream) | *this;
    }

private:
    std::vector<std::shared_ptr<const detail::link>> links_;
};

/// A recipe for a stream of T: a stage with no input.
template <class T>
using source = stage<void, T>;

template <class A, class B, class C, class D>
auto operator|(stage<A, B> lhs, stage<C, D> rhs) {
    if constexpr (!std::is_same_v<B, C>) {
        static_assert(detail::pipe_type_mismatch<B, C>::value);
        return stage<A, D>{};
    } else {
        auto links = lhs.links();
        links.insert(links.end(), rhs.links().begin(), rhs.links().end());
        return stage<A, D>(std::move(links));
    }
}

namespace detail {
template <class T>
inline constexpr bool is_stage = false;
template <class A, class B>
inline constexpr bool is_stage<stage<A, B>> = true;

/// A stage whose input type is decided when it is attached: `make.template
/// operator()<T>()` builds the typed stage for input T.
template <class F>
struct deferred {
    F make;
    template <class A, class B>
    auto apply(stage<A, B> s) const {
        return std::move(s) | make.template operator()<B>();
    }
};
template <class L, class R>
struct chained {
    L l;
    R r;
    template <class A, class B>
    auto apply(stage<A, B> s) const {
        return (std::move(s) | l) | r;
    }
};
template <class T>
inline constexpr bool is_closure = false;
template <class F>
inline constexpr bool is_closure<deferred<F>> = true;
template <class L, class R>
inline constexpr bool is_closure<chained<L, R>> = true;
}  // namespace detail

template <class A, class B, class C>
    requires detail::is_closure<C>
auto operator|(stage<A, B> s, C c) {
    return c.apply(std::move(s));
}
template <class C, class X>
    requires(detail::is_closure<C> && (detail::is_closure<X> || detail::is_stage<X>))
auto operator|(C c, X x) {
    return detail::chained<C, X>{std::move(c), std::move(x)};
}

// The library's stage factories (lines(), tar(), fetch(), ...) are templates with one
// defaulted parameter, `template <class = void>`, though nothing depends on it: a plain
// inline function is compiled in every translation unit that includes its header, with
// the whole stage behind it (link_impl, its channel, the worker coroutine, which g++
// emits at -O0 even when nothing calls it); a template only where it is called. That cut
// a user TU including <sluice/sluice.hpp> by about a quarter (bench/RESULTS.md, "Compile
// time").

/// A stage from a coroutine body run by each worker:
/// `task<void> body(stage_context<In, Out>& ctx)`. The body loops over
/// `co_await ctx.in.next()` and `co_await ctx.out.send(...)` itself, so it can keep state
/// across items (batch, shuffle) or produce a whole stream from one item (read, fetch).
/// With several workers the items are shared among them and the output is unordered.
template <class In, class Out, class Body>
stage<In, Out> make_stage(std::string name, stage_options opts, Body body,
                          bool counts_records = false) {
    auto l = std::make_shared<detail::link_impl<In, Out>>();
    l->name = std::move(name);
    l->opts = opts;
    l->counts_records = counts_records;
    l->body = std::move(body);
    return stage<In, Out>({std::move(l)});
}

namespace detail {
template <class T>
inline constexpr bool is_shared_ptr = false;
template <class T>
inline constexpr bool is_shared_ptr<std::shared_ptr<T>> = true;
}  // namespace detail

/// make_stage with a setup run before the pipeline starts (see stage_setup). A setup that
/// returns nothing, `void setup(stage_setup&)`, goes with `task<void> body(ctx)`; one
/// that returns this run's state, `std::shared_ptr<S> setup(stage_setup&)`, goes with
/// `task<void> body(ctx, S& state)`: every worker of the run gets the same S, which lives
/// until the pipeline is gone.
template <class In, class Out, class Setup, class Body>
stage<In, Out> make_stage(std::string name, stage_options opts, Setup setup, Body body, bool counts_records = false) {
    using made = std::invoke_result_t<Setup&, stage_setup&>;
    auto l = std::make_shared<detail::link_impl<In, Out>>();
    l->name = std::move(name);
    l->opts = opts;
    l->counts_records = counts_records;
    if constexpr (std::is_void_v<made>) {
        l->setup = std::move(setup);
        l->body = std::move(body);
    } else {
        static_assert(detail::is_shared_ptr<made>,
                      "sluice::make_stage: a setup returns void or std::shared_ptr<S> (the run's state)");
        using S = typename made::element_type;
        static_assert(std::is_invocable_v<Body&, stage_context<In, Out>&, S&>,
                      "sluice::make_stage: a setup returning std::shared_ptr<S> needs a body taking "
                      "(stage_context<In, Out>&, S&)");
        l->setup = [setup = std::move(setup)](stage_setup& s) mutable { s.internal.state = setup(s); };
        // The one place the erased state is cast back: the setup above made it an S.
        l->body = [body = std::move(body)](stage_context<In, Out>& ctx) {
            return body(ctx, *static_cast<S*>(ctx.internal.state.get()));
        };
    }
    return stage<In, Out>({std::move(l)});
}

namespace detail {
/// `co_await pass_gate(ctx)` before taking an item, in the body of a gated stage (see
/// link::gated and core/detail/worker_gate.hpp): waits while the tuner has this worker
/// idle; passes at once untuned.
template <class In, class Out>
worker_gate::pass_op pass_gate(stage_context<In, Out>& ctx) {
    return worker_gate::pass(ctx.internal.gate, ctx.worker, ctx.stats.worker(ctx.worker));
}

/// `s`, a stage of one link just made, with workers the tuner may gate (link::gated): its
/// body passes pass_gate(ctx) before every item. `unit_bytes`: what one working worker
/// may hold.
template <class In, class Out>
stage<In, Out> gated_stage(stage<In, Out> s, std::uint64_t unit_bytes = 0) {
    auto l = std::make_shared<link_impl<In, Out>>(static_cast<const link_impl<In, Out>&>(*s.links().front()));
    l->gated = true;
    l->unit_bytes = unit_bytes;
    return stage<In, Out>({std::move(l)});
}

/// `s`, a stage of one link just made, with `f` run at its setup after the setup it has:
/// for what a library stage offers the stages around it (core/detail/shard_counting.hpp).
template <class In, class Out>
stage<In, Out> also_at_setup(stage<In, Out> s, std::function<void(stage_setup&)> f) {
    auto l = std::make_shared<link_impl<In, Out>>(static_cast<const link_impl<In, Out>&>(*s.links().front()));
    l->setup = [before = std::move(l->setup), f = std::move(f)](stage_setup& st) {
        if (before) before(st);
        f(st);
    };
    return stage<In, Out>({std::move(l)});
}

template <class In, class Out, class F>
task<void> item_worker(stage_context<In, Out>& ctx, F fn) {  // fn copied per worker
    std::vector<Out> outs;
    for (;;) {
        co_await pass_gate(ctx);
        std::uint64_t ticket = 0;
        std::optional<In> item;
        std::exception_ptr upstream;
        try {
            item = co_await ctx.in.next(ctx.turn ? &ticket : nullptr);
        } catch (...) {
            upstream = std::current_exception();
        }
        if (upstream) {
            // Ordered: the upstream error follows every item; let the workers still
            // holding earlier items emit them first. A stop has no ticket: it ends now.
            if (ctx.turn && !is_stop(upstream)) co_await ctx.turn->wait(ticket);
            std::rethrow_exception(upstream);
        }
        if (!item) co_return;
        std::exception_ptr failed;
        try {
            fn(std::move(*item), outs);
        } catch (...) {
            failed = std::current_exception();
        }
        // Ordered: wait for our turn even when failing, so the error reaches the consumer
        // after the outputs of every earlier item.
        if (ctx.turn) co_await ctx.turn->wait(ticket);
        if (failed) std::rethrow_exception(failed);
        for (auto& o : outs) co_await ctx.out.send(std::move(o));
        outs.clear();
        if (ctx.turn) ctx.turn->done(ticket);
    }
}
}  // namespace detail

/// A stage from a plain function `void fn(In&& item, std::vector<Out>& out)` that turns one
/// item into zero or more outputs. Each worker has its own copy of `fn`. With several
/// workers and ordering::ordered, outputs keep the order of the inputs (a worker holds the
/// outputs of one item until its turn). Under pipeline_options::tune, how many of its
/// workers work is the tuner's, up to `opts.concurrency`.
template <class In, class Out, class F>
stage<In, Out> make_item_stage(std::string name, stage_options opts, F fn,
                               bool counts_records = false) {
    return detail::gated_stage(make_stage<In, Out>(
        std::move(name), opts,
        [fn = std::move(fn)](stage_context<In, Out>& ctx) { return detail::item_worker(ctx, fn); },
        counts_records));
}

}  // namespace sluice
