#pragma once
// sluice::plan: decides which shards this process reads, in which order, for how many
// epochs.

#include <sluice/core/detail/random.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

struct plan_options {
    /// How many passes over the data.
    unsigned epochs = 1;
    /// With a seed, each epoch's shard order is a permutation that depends only on
    /// (seed, epoch): the same on every rank and every run. Without one, listed order.
    std::optional<std::uint64_t> seed = std::nullopt;
    /// This process's share: shards at positions p with p % world == rank in each epoch's
    /// order. Shares are disjoint and cover every shard; when the shard count is not a
    /// multiple of world, the first ranks get one shard more.
    unsigned rank = 0;
    unsigned world = 1;
};

namespace detail {
/// The shards one rank reads in one epoch, in order.
inline std::vector<shard> plan_epoch(const std::vector<std::string>& urls, const plan_options& o,
                                     std::uint32_t epoch) {
    std::vector<std::size_t> order(urls.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (o.seed) {
        rng r(mix(*o.seed, epoch));
        shuffle(order, r);
    }
    std::vector<shard> out;
    std::uint64_t index = 0;
    for (std::size_t p = o.rank; p < order.size(); p += o.world)
        out.push_back(shard{urls[order[p]], epoch, index++});
    return out;
}
}  // namespace detail

/// Takes: paths or URLs (from list). Gives: shards ({url, epoch, index}) for this rank,
/// epoch after epoch.
/// Backpressure: suspends while downstream is full; holds the list of URLs (not data).
/// Errors: rank >= world is a sluice::error at the start; upstream errors pass through.
/// Cancellation: stops at the next send.
/// Example: `sluice::list(...) | sluice::plan({.epochs = 90, .seed = 17, .rank = 3, .world = 8})`
inline stage<std::string, shard> plan(plan_options o = {}) {
    return make_stage<std::string, shard>(
        "plan", {.on = pool::io, .buffer = {256, 0}},
        [o](stage_context<std::string, shard>& ctx) -> task<void> {
            if (o.world == 0 || o.rank >= o.world)
                throw error("sluice: plan: rank " + std::to_string(o.rank) + " is not below world size " +
                            std::to_string(o.world));
            std::vector<std::string> urls;
            while (auto u = co_await ctx.in.next()) urls.push_back(std::move(*u));
            for (std::uint32_t e = 0; e < o.epochs; ++e)
                for (auto& s : detail::plan_epoch(urls, o, e)) co_await ctx.out.send(std::move(s));
        });
}
template <class A>
stage<A, shard> plan(stage<A, std::string> upstream, plan_options o = {}) {
    return std::move(upstream) | plan(o);
}

}  // namespace sluice
