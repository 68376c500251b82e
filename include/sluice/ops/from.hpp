#pragma once
// sluice::from: a source that sends the items of a vector (tests, small in-memory data).

#include <sluice/core/stage.hpp>

#include <memory>
#include <vector>

namespace sluice {

/// Takes: a vector of T. Gives: its items, in order (copies, so the source can run in
/// several pipelines).
/// Backpressure: suspends while downstream is full.
/// Errors: none of its own.
/// Cancellation: stops at the next send.
/// Example: `auto p = sluice::pipeline(sluice::from<int>({1, 2, 3}) | sluice::map(f));`
template <class T>
source<T> from(std::vector<T> items, channel_limits out = {64, 0}) {
    auto data = std::make_shared<const std::vector<T>>(std::move(items));
    return make_stage<void, T>(
        "from", {.on = pool::io, .out = out},
        [data](stage_context<void, T>& ctx) -> task<void> {
            for (const auto& x : *data) co_await ctx.out.send(x);
        });
}

}  // namespace sluice
