#pragma once
// sluice::shuffle: a seeded shuffle buffer.

#include <sluice/core/channel.hpp>
#include <sluice/core/detail/random.hpp>
#include <sluice/core/stage.hpp>

#include <cstdint>
#include <vector>

namespace sluice {

struct shuffle_options {
    /// Items held; each incoming item replaces a random held one, which is sent on.
    std::size_t buffer = 10'000;
    /// Also send on once the held items exceed this many bytes (0: no byte limit).
    std::size_t max_bytes = 0;
    std::uint64_t seed = 0;
    /// Capacity of the output channel.
    channel_limits out = {64, 0};
};

namespace detail {
template <class T>
void compact_if_possible(T& v, buffer_source* from) {
    if constexpr (requires { v.compact(from); }) v.compact(from);
    else if constexpr (requires { v.compact(); }) v.compact();
}

template <class T>
task<void> shuffle_worker(stage_context<T, T>& ctx, shuffle_options o) {
    rng r(mix(o.seed, 0x5368756666ULL));
    std::vector<T> held;
    held.reserve(std::min<std::size_t>(o.buffer + 1, 1 << 16));
    std::size_t held_bytes = 0;
    while (auto item = co_await ctx.in.next()) {
        // A small record must not pin the large chunk it was sliced from while it waits
        // here, possibly for a long time: copy it out (see bytes::compact).
        compact_if_possible(*item, ctx.rt.buffers().get());
        held_bytes += byte_size_of(*item);
        held.push_back(std::move(*item));
        while (held.size() > o.buffer || (o.max_bytes && held_bytes > o.max_bytes)) {
            std::swap(held[r.below(held.size())], held.back());
            T v = std::move(held.back());
            held.pop_back();
            held_bytes -= byte_size_of(v);
            co_await ctx.out.send(std::move(v));
        }
    }
    shuffle(held, r);
    for (auto& v : held) co_await ctx.out.send(std::move(v));
}
}  // namespace detail

/// Takes: items of any type T. Gives: the same items in a seeded random order: each
/// incoming item joins a buffer of `buffer` items and a random one of them leaves; at the
/// end the rest leave in random order. The order is a pure function of the input order and
/// the seed.
/// Backpressure: holds at most `buffer` items (and at most `max_bytes` bytes when set) plus
/// its output channel; records are compacted (copied out of their chunk when they would
/// pin a much larger buffer), so held memory is the records' own size.
/// Errors: upstream errors pass through (held items are dropped with the error).
/// Cancellation: stops at the next send and frees what it holds.
/// Example: `| sluice::shuffle({.buffer = 10'000, .seed = 17})`
inline auto shuffle(shuffle_options o = {}) {
    auto make = [o]<class T>() {
        return make_stage<T, T>("shuffle", {.on = pool::cpu, .buffer = o.out},
                                [o](stage_context<T, T>& ctx) { return detail::shuffle_worker<T>(ctx, o); });
    };
    return detail::deferred<decltype(make)>{make};
}
template <class A, class B>
stage<A, B> shuffle(stage<A, B> upstream, shuffle_options o = {}) {
    return std::move(upstream) | shuffle(o);
}

}  // namespace sluice
