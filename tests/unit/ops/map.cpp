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
    for (int x : sluice::pipeline(sluice::from(in) | sluice::map(f, {.concurrency = 4}), {.runtime = {.cpu_threads = 4}}))
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

// Not local nor in an anonymous namespace: a stage's coroutine frame holds it (g++'s
// -Wsubobject-linkage).
struct map_test_twice {
    int operator()(int x) const { return 2 * x; }
    std::string operator()(std::string s) const { return s + s; }
};

TEST_CASE("a generic lambda in map takes the type of what it is attached to", "[map]") {
    // Piped after a stage: the input type is that stage's output.
    std::vector<int> got;
    for (int x : sluice::pipeline(sluice::from<int>({1, 2, 3}) | sluice::map([](auto x) { return x * 2; })))
        got.push_back(x);
    REQUIRE(got == std::vector<int>{2, 4, 6});
    // Stored before it is attached, and joined to other closures; `const auto&` too.
    auto tail = sluice::map([](const auto& s) { return s + "!"; }, {.concurrency = 2}) |
                sluice::map([](auto s) { return s.size(); });
    std::vector<std::size_t> sizes;
    for (auto n : sluice::pipeline(sluice::from<std::string>({"a", "bcd"}) | tail)) sizes.push_back(n);
    REQUIRE(sizes == std::vector<std::size_t>{2, 4});
    // An overloaded function object is generic too; the overload is picked by the type.
    std::vector<std::string> strs;
    for (auto& s : sluice::pipeline(sluice::from<std::string>({"ab"}) | sluice::map(map_test_twice{}))) strs.push_back(s);
    REQUIRE(strs == std::vector<std::string>{"abab"});
    // Function pointers and noexcept lambdas still give a typed stage at once.
    auto c = sluice::map([](int x) noexcept { return x + 1; });
    static_assert(std::is_same_v<decltype(c), sluice::stage<int, int>>);
}
