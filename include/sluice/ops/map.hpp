#pragma once
// sluice::map: the user's own function (decode, augment, tokenize...) on the CPU pool.

#include <sluice/core/stage.hpp>

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace sluice {

struct map_options {
    /// Calls of the function running at once (workers on the CPU pool; the pool's size is
    /// pipeline_options.runtime.cpu_threads).
    unsigned threads = 1;
    /// ordered: results in input order (deterministic); unordered: as they complete,
    /// which keeps all threads busy when the cost per item varies.
    ordering order = ordering::ordered;
    /// Capacity of the output channel.
    channel_limits buffer = {64, 0};
    /// Name in stats and reports.
    std::string name = "map";
};

namespace detail {
struct deduce {};
template <class F>
struct first_arg : first_arg<decltype(&F::operator())> {};
template <class R, class A>
struct first_arg<R (*)(A)> {
    using type = std::remove_cvref_t<A>;
};
template <class R, class C, class A>
struct first_arg<R (C::*)(A) const> {
    using type = std::remove_cvref_t<A>;
};
template <class R, class C, class A>
struct first_arg<R (C::*)(A)> {
    using type = std::remove_cvref_t<A>;
};
template <class In, class F>
struct map_input {
    using type = In;
};
template <class F>
struct map_input<deduce, F> {
    using type = typename first_arg<F>::type;
};
}  // namespace detail

/// Takes: In items. Gives: fn(item) for each, on `threads` workers of the CPU pool.
/// In is deduced from fn's parameter; for a generic lambda name it: `map<record>(fn)`.
/// Backpressure: a worker suspends sending while downstream is full; at most
/// `threads` items are in the function at once, plus the output channel's capacity.
/// Errors: an exception from fn is sent downstream after the results before it, and
/// stops the stage.
/// Cancellation: workers stop at their next send; a call already running finishes.
/// Example: `| sluice::map([](sluice::record r) { return decode(r); }, {.threads = 6})`
template <class In = detail::deduce, class F>
auto map(F fn, map_options o = {}) {
    using I = typename detail::map_input<In, F>::type;
    using Out = std::remove_cvref_t<std::invoke_result_t<F&, I&&>>;
    return make_item_stage<I, Out>(
        o.name, {.concurrency = o.threads, .order = o.order, .on = pool::cpu, .buffer = o.buffer},
        [fn = std::move(fn)](I&& in, std::vector<Out>& out) mutable {
            out.push_back(std::invoke(fn, std::move(in)));
        });
}
template <class A, class B, class F>
auto map(stage<A, B> upstream, F fn, map_options o = {}) {
    return std::move(upstream) | map<B>(std::move(fn), std::move(o));
}

}  // namespace sluice
