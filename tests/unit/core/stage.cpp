#include <sluice/core/stage.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stop_token>
#include <thread>

namespace {
struct timer_wait {
    asio::steady_timer& t;
    bool await_ready() { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        t.async_wait([h](const std::error_code&) { h.resume(); });
    }
    void await_resume() {}
};
template <class T>
std::vector<T> drain(sluice::source<T> s, sluice::pipeline_options o = {}) {
    std::vector<T> out;
    for (auto& x : sluice::pipeline(std::move(s), o)) out.push_back(x);
    return out;
}
}  // namespace

TEST_CASE("stages compose with | and by direct call, checked by type", "[stage]") {
    auto twice = sluice::map([](int x) { return 2 * x; });
    auto to_string = sluice::map([](int x) { return std::to_string(x); });
    auto both = twice | to_string;  // a partial pipeline, stored and reused
    static_assert(std::is_same_v<decltype(both), sluice::stage<int, std::string>>);
    REQUIRE(drain(sluice::from(sluice_test::iota(3)) | both) == std::vector<std::string>{"0", "2", "4"});
    REQUIRE(drain(both(sluice::from(sluice_test::iota(2)))) == std::vector<std::string>{"0", "2"});
    REQUIRE(drain(sluice::from(sluice_test::iota(2)) | both) == std::vector<std::string>{"0", "2"});  // reused
}

TEST_CASE("a stage's setup hands its workers typed state, made once per run", "[stage]") {
    struct tally {
        std::atomic<int> items{0};
    };
    std::atomic<int> setups{0};
    // Four workers share the one tally their run's setup made; a second run gets a new one.
    auto counted = sluice::make_stage<int, int>(
        "counted", {.concurrency = 4},
        [&](sluice::stage_setup&) {
            ++setups;
            return std::make_shared<tally>();
        },
        [](sluice::stage_context<int, int>& ctx, tally& t) -> sluice::task<void> {
            while (auto x = co_await ctx.in.next()) {
                const int n = ++t.items;
                co_await ctx.out.send(n);
            }
        });
    for (int run = 1; run <= 2; ++run) {
        auto got = drain(sluice::from(sluice_test::iota(50)) | counted);
        std::sort(got.begin(), got.end());
        REQUIRE(got == [] {
            std::vector<int> v;
            for (int i = 1; i <= 50; ++i) v.push_back(i);
            return v;
        }());  // one counter for all four workers, starting afresh each run
        REQUIRE(setups == run);
    }
}

TEST_CASE("a custom stage is a coroutine body over its ports", "[stage]") {
    // Emits each item n times: one input, many outputs, with state across items.
    auto repeat = sluice::make_stage<int, int>(
        "repeat", {}, [](sluice::stage_context<int, int>& ctx) -> sluice::task<void> {
            int seen = 0;
            while (auto x = co_await ctx.in.next()) {
                for (int i = 0; i < *x; ++i) co_await ctx.out.send(*x);
                ++seen;
            }
            co_await ctx.out.send(-seen);  // a trailer after the end of input
        });
    REQUIRE(drain(sluice::from(std::vector<int>{1, 2, 3}) | repeat) == std::vector<int>{1, 2, 2, 3, 3, 3, -3});
}

TEST_CASE("an ordered stage with several workers keeps input order", "[stage]") {
    auto jittery = sluice::make_item_stage<int, int>(
        "jitter", {.concurrency = 4, .order = sluice::ordering::ordered},
        [](int&& x, std::vector<int>& out) {
            std::this_thread::sleep_for(std::chrono::microseconds((x * 7919) % 500));
            out.push_back(x);
            if (x % 3 == 0) out.push_back(-x);  // several outputs for one input stay together
        });
    auto got = drain(sluice::from(sluice_test::iota(300)) | jittery, {.runtime = {.cpu_threads = 4}});
    std::vector<int> want;
    for (int x = 0; x < 300; ++x) {
        want.push_back(x);
        if (x % 3 == 0) want.push_back(-x);
    }
    REQUIRE(got == want);
}

TEST_CASE("an unordered stage with several workers delivers every item", "[stage]") {
    auto m = sluice::map(
        [](int x) {
            std::this_thread::sleep_for(std::chrono::microseconds((x * 31) % 300));
            return x;
        },
        {.concurrency = 4, .order = sluice::ordering::unordered});
    auto got = drain(sluice::from(sluice_test::iota(500)) | m, {.runtime = {.cpu_threads = 4}});
    std::sort(got.begin(), got.end());
    REQUIRE(got == sluice_test::iota(500));
}

TEST_CASE("a stage runs on the executor it asks for", "[stage]") {
    auto where = [](sluice::pool p) {
        return sluice::make_stage<int, bool>(
            "where", {.on = p}, [](sluice::stage_context<int, bool>& ctx) -> sluice::task<void> {
                auto ex = co_await sluice::current_executor{};
                const bool on_io = ex == sluice::executor(ctx.rt.io_executor());
                while (co_await ctx.in.next()) co_await ctx.out.send(on_io);
            });
    };
    REQUIRE(drain(sluice::from(sluice_test::iota(1)) | where(sluice::pool::io)) == std::vector<bool>{true});
    REQUIRE(drain(sluice::from(sluice_test::iota(1)) | where(sluice::pool::cpu)) == std::vector<bool>{false});
}

TEST_CASE("a failing stage sends its error after the items before it", "[stage]") {
    for (unsigned threads : {1u, 4u}) {
        auto m = sluice::map(
            [](int x) {
                if (x == 50) throw std::runtime_error("bad record 50");
                return x;
            },
            {.concurrency = threads});
        std::vector<int> got;
        sluice::pipeline p(sluice::from(sluice_test::iota(100)) | m, {.runtime = {.cpu_threads = 4}});
        REQUIRE_THROWS_WITH([&] { for (int x : p) got.push_back(x); }(), "bad record 50");
        REQUIRE(got == sluice_test::iota(50));  // ordered: every item before the failing one, none after
    }
}

TEST_CASE("an upstream error reaches the consumer after every item, through an ordered stage with several workers",
          "[stage]") {
    auto failing_source = sluice::make_stage<void, int>(
        "failing", {.on = sluice::pool::io}, [](sluice::stage_context<void, int>& ctx) -> sluice::task<void> {
            for (int i = 0; i < 100; ++i) co_await ctx.out.send(i);
            throw std::runtime_error("shard 3 truncated at byte 4096");
        });
    auto slow = sluice::map(
        [](int x) {
            std::this_thread::sleep_for(std::chrono::microseconds((x * 7919) % 400));
            return x;
        },
        {.concurrency = 4});
    for (int run = 0; run < 20; ++run) {
        std::vector<int> got;
        sluice::pipeline p(failing_source | slow, {.runtime = {.cpu_threads = 4}});
        REQUIRE_THROWS_WITH([&] { for (int x : p) got.push_back(x); }(), "shard 3 truncated at byte 4096");
        REQUIRE(got == sluice_test::iota(100));
    }
}

TEST_CASE("a custom stage that catches everything and sends in a loop still ends at stop", "[stage][stop]") {
    std::atomic<int> swallowed{0};
    auto stubborn = sluice::make_stage<void, int>(
        "stubborn", {}, [&swallowed](sluice::stage_context<void, int>& ctx) -> sluice::task<void> {
            for (int i = 0;; ++i) {
                try {
                    co_await ctx.out.send(i);
                } catch (...) {  // a user's catch-all: swallows the stop too
                    ++swallowed;
                }
            }
        });
    const auto t0 = std::chrono::steady_clock::now();
    {
        sluice::pipeline p(stubborn);
        for (int k = 0; k < 3; ++k) REQUIRE(p.next_blocking());
        p.stop();  // the body's second send after the stop parks it for good
    }
    REQUIRE(swallowed.load() == 1);
    REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // a hang test
}

TEST_CASE("a stage that catches everything around next() still ends at stop", "[stage][stop]") {
    std::atomic<int> swallowed{0};
    auto stubborn = sluice::make_stage<int, int>(
        "stubborn", {}, [&swallowed](sluice::stage_context<int, int>& ctx) -> sluice::task<void> {
            for (;;) {
                try {
                    auto x = co_await ctx.in.next();
                    if (x) co_await ctx.out.send(*x);
                } catch (...) {
                    ++swallowed;
                }
            }
        });
    std::vector<int> many(100000, 1);
    sluice::pipeline p(sluice::from(many) | stubborn);
    REQUIRE(p.next_blocking());
    p.stop();
    REQUIRE(swallowed.load() >= 1);
    REQUIRE_FALSE(p.next_blocking());
}

TEST_CASE("a stage's stop token is requested when the pipeline stops and when its consumer is gone",
          "[stage][stop]") {
    // A user's coroutine waiting on something of its own (here a timer) ends through the
    // token: std::stop_callback cancels the wait.
    std::atomic<bool> woke{false};
    auto waiter = sluice::make_stage<void, int>(
        "waiter", {.on = sluice::pool::io}, [&woke](sluice::stage_context<void, int>& ctx) -> sluice::task<void> {
            co_await ctx.out.send(1);
            auto ex = co_await sluice::current_executor();
            asio::steady_timer timer(ex, std::chrono::hours(1));
            std::stop_callback cb(ctx.stop, [&timer, ex] { asio::post(ex, [&timer] { timer.cancel(); }); });
            co_await timer_wait{timer};
            woke = ctx.stopping();
        });
    const auto t0 = std::chrono::steady_clock::now();
    {
        sluice::pipeline p(waiter);
        REQUIRE(p.next_blocking());
    }  // the destructor stops it
    REQUIRE(woke.load());
    REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
