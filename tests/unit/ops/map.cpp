#include <sluice/ops/map.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>

#include <mutex>
#include <set>
#include <thread>

TEST_CASE("map runs the user's function on N threads of the CPU pool", "[map]") {
    std::mutex m;
    std::set<std::thread::id> threads;
    std::atomic<int> running{0}, peak{0};
    auto f = [&](int x) {
        const int now = ++running;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {}
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        {
            std::lock_guard lock(m);
            threads.insert(std::this_thread::get_id());
        }
        --running;
        return x * x;
    };
    std::vector<int> in(64);
    for (int i = 0; i < 64; ++i) in[i] = i;
    std::vector<int> got;
    for (int x : sluice::pipeline(sluice::from(in) | sluice::map(f, {.threads = 4}), {.runtime = {.cpu_threads = 4}}))
        got.push_back(x);
    REQUIRE(got.size() == 64);
    for (int i = 0; i < 64; ++i) REQUIRE(got[i] == i * i);  // ordered by default
    REQUIRE(peak.load() > 1);
    REQUIRE(peak.load() <= 4);
    REQUIRE(threads.size() > 1);
}

TEST_CASE("map deduces its input type, or takes it explicitly for generic lambdas", "[map]") {
    auto a = sluice::map([](const std::string& s) { return s.size(); });
    static_assert(std::is_same_v<decltype(a), sluice::stage<std::string, std::size_t>>);
    auto b = sluice::map<int>([](auto x) { return x + 0.5; });
    static_assert(std::is_same_v<decltype(b), sluice::stage<int, double>>);
    std::vector<double> got;
    for (double x : sluice::pipeline(sluice::map(sluice::from<int>({1}), [](int x) { return x + 0.5; })))
        got.push_back(x);
    REQUIRE(got == std::vector<double>{1.5});
}
