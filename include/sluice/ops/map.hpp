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
    unsigned concurrency = 1;
    /// ordered: results in input order (deterministic); unordered: as they complete,
    /// which keeps all threads busy when the cost per item varies.
    ordering order = ordering::ordered;
    /// Capacity of the output channel.
    channel_limits out = {64, 0};
    /// Name in stats and reports.
    std::string name = "map";
};

namespace detail {
struct deduce {};
/// The parameter type of a callable with exactly one non-template call operator (a
/// function pointer, a lambda with a typed parameter); no `type` for a generic lambda or
/// an overloaded function object, whose input type is decided when the stage is attached.
template <class F>
struct sole_arg {};
template <class R, class A>
struct sole_arg<R (*)(A)> {
    using type = A;
};
template <class R, class A>
struct sole_arg<R (*)(A) noexcept> {
    using type = A;
};
template <class R, class C, class A>
struct sole_arg<R (C::*)(A) const> {
    using type = A;
};
template <class R, class C, class A>
struct sole_arg<R (C::*)(A) const noexcept> {
    using type = A;
};
template <class R, class C, class A>
struct sole_arg<R (C::*)(A)> {
    using type = A;
};
template <class R, class C, class A>
struct sole_arg<R (C::*)(A) noexcept> {
    using type = A;
};
template <class F>
    requires requires { &F::operator(); }
struct sole_arg<F> : sole_arg<decltype(&F::operator())> {};

template <class F>
inline constexpr bool has_sole_arg = requires { typename sole_arg<F>::type; };

/// map's stage for input I.
template <class I, class F>
auto map_stage(F fn, const map_options& o) {
    if constexpr (!std::is_invocable_v<F&, I&&>) {
        // The function cannot take what the stage before it gives: name both types.
        if constexpr (has_sole_arg<F>) static_assert(pipe_type_mismatch<I, std::remove_cvref_t<typename sole_arg<F>::type>>::value);
        else static_assert(pipe_type_mismatch<I, F>::value);
        return stage<I, I>{};
    } else {
        using Out = std::remove_cvref_t<std::invoke_result_t<F&, I&&>>;
        static_assert(!std::is_void_v<Out>, "sluice::map: the function must return the item to send on");
        return make_item_stage<I, Out>(
            o.name, {.concurrency = o.concurrency, .order = o.order, .on = pool::cpu, .out = o.out},
            [fn = std::move(fn)](I&& in, std::vector<Out>& out) mutable {
                out.push_back(std::invoke(fn, std::move(in)));
            });
    }
}
}  // namespace detail

/// Takes: In items. Gives: fn(item) for each, on `concurrency` workers of the CPU pool.
/// In is deduced from fn's parameter. A generic lambda (`[](auto r) {...}`) or an
/// overloaded function object takes the type of what it is attached to: `map(fn)` is then
/// a closure, like shuffle, that becomes a stage when piped after a stage (`src | map(fn)`)
/// or joined to other closures; `map<record>(fn)` names the type instead. A function that
/// cannot take the items it is given fails to compile with
/// sluice::detail::pipe_type_mismatch<Produced, Expected>.
/// Backpressure: a worker suspends sending while downstream is full; at most
/// `concurrency` items are in the function at once, plus the output channel's capacity.
/// Errors: an exception from fn is sent downstream after the results before it, and
/// stops the stage.
/// Cancellation: workers stop at their next send; a call already running finishes.
/// Example: `| sluice::map([](sluice::record r) { return decode(r); }, {.concurrency = 6})`
template <class In = detail::deduce, class F>
auto map(F fn, map_options o = {}) {
    if constexpr (!std::is_same_v<In, detail::deduce>) {
        return detail::map_stage<In>(std::move(fn), o);
    } else if constexpr (detail::has_sole_arg<F>) {
        return detail::map_stage<std::remove_cvref_t<typename detail::sole_arg<F>::type>>(std::move(fn), o);
    } else {
        auto make = [fn = std::move(fn), o = std::move(o)]<class T>() { return detail::map_stage<T>(fn, o); };
        return detail::deferred<decltype(make)>{std::move(make)};
    }
}
template <class A, class B, class F>
auto map(stage<A, B> upstream, F fn, map_options o = {}) {
    return std::move(upstream) | map<B>(std::move(fn), std::move(o));
}

}  // namespace sluice
