// Channel overhead: items/s through a chain of 4 trivial stages (+1 each), a generator and
// a summing sink, all on one CPU-pool thread, against a plain loop doing the same
// arithmetic. Prints one JSON object.
//   channel_hop [ITEMS] [THREADS]
#include <sluice/sluice.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {
using clock_type = std::chrono::steady_clock;

sluice::source<std::uint64_t> generate(std::uint64_t n) {
    return sluice::make_stage<void, std::uint64_t>(
        "generate", {.on = sluice::pool::cpu},
        [n](sluice::stage_context<void, std::uint64_t>& ctx) -> sluice::task<void> {
            for (std::uint64_t i = 0; i < n; ++i) co_await ctx.out.send(i);
        });
}
auto plus_one() {
    return sluice::make_item_stage<std::uint64_t, std::uint64_t>(
        "plus_one", {.on = sluice::pool::cpu, .out = {256, 0}},
        [](std::uint64_t&& x, std::vector<std::uint64_t>& out) { out.push_back(x + 1); });
}
auto sum() {
    return sluice::make_stage<std::uint64_t, std::uint64_t>(
        "sum", {.on = sluice::pool::cpu}, [](sluice::stage_context<std::uint64_t, std::uint64_t>& ctx) -> sluice::task<void> {
            std::uint64_t s = 0;
            while (auto x = co_await ctx.in.next()) s += *x;
            co_await ctx.out.send(s);
        });
}
}  // namespace

int main(int argc, char** argv) {
    const std::uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20'000'000;
    const unsigned threads = argc > 2 ? unsigned(std::atoi(argv[2])) : 1;
    constexpr int stages = 4, hops = stages + 1;  // channels an item crosses

    auto t0 = clock_type::now();
    volatile std::uint64_t plain = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        std::uint64_t x = i;
        for (int s = 0; s < stages; ++s) x = x + 1;
        plain = plain + x;
    }
    const double plain_s = std::chrono::duration<double>(clock_type::now() - t0).count();

    t0 = clock_type::now();
    sluice::pipeline p(generate(n) | plus_one() | plus_one() | plus_one() | plus_one() | sum(),
                       {.runtime = {.cpu_threads = threads}});
    const auto result = p.next_blocking().value_or(0);
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (result != plain) {
        std::fprintf(stderr, "channel_hop: wrong sum %llu, expected %llu\n", (unsigned long long)result,
                     (unsigned long long)plain);
        return 1;
    }
    std::printf(
        "{\"bench\":\"channel_hop\",\"items\":%llu,\"cpu_threads\":%u,\"stages\":%d,\"hops\":%d,"
        "\"seconds\":%.4f,\"items_per_s\":%.0f,\"hop_items_per_s\":%.0f,\"ns_per_hop\":%.2f,"
        "\"plain_loop_seconds\":%.4f,\"plain_loop_items_per_s\":%.0f}\n",
        (unsigned long long)n, threads, stages, hops, s, n / s, n * hops / s, s * 1e9 / (double(n) * hops), plain_s,
        n / plain_s);
}
