#include <sluice/core/pipeline.hpp>

#include "support/test_support.hpp"

#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/shuffle.hpp>

#include <asio/thread_pool.hpp>

#include <future>
#include <thread>

using sluice_test::counted;

namespace {
std::vector<counted> counted_items(int n) {
    std::vector<counted> v;
    for (int i = 0; i < n; ++i) v.emplace_back(i);
    return v;
}
}  // namespace

TEST_CASE("a pipeline is iterated with range-for from the trainer's thread", "[pipeline]") {
    auto src = sluice::from<int>({1, 2, 3, 4, 5}) | sluice::map([](int x) { return x * 10; });
    sluice::pipeline p(src);
    std::vector<int> got;
    for (int x : p) got.push_back(x);
    REQUIRE(got == std::vector<int>{10, 20, 30, 40, 50});
    // After the end, the pipeline stays ended.
    REQUIRE_FALSE(p.next_blocking());
}

TEST_CASE("a pipeline is read with co_await next() from a coroutine", "[pipeline]") {
    sluice::pipeline p(sluice::from<int>({1, 2, 3}) | sluice::map([](int x) { return x + 1; }));
    asio::thread_pool pool(1);
    std::promise<int> sum;
    sluice::spawn(pool.get_executor(),
                  [](sluice::pipeline<int>& p) -> sluice::task<int> {
                      int s = 0;
                      while (auto x = co_await p.next()) s += *x;
                      co_return s;
                  }(p),
                  [&](std::optional<int> v, std::exception_ptr) { sum.set_value(v.value_or(-1)); });
    REQUIRE(sum.get_future().get() == 9);
    // Stop the pipeline before the consumer's executor goes: its workers may still be
    // posting the last wake-up to it.
    p.stop();
    pool.join();
}

TEST_CASE("stopping 1,000 pipelines at random points joins all work and frees everything",
          "[pipeline][stop]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    counted::reset();
    const auto items = counted_items(200);
    const long baseline = counted::live.load();
    auto chain = sluice::map([](counted c) { return c; }, {.concurrency = 2, .order = sluice::ordering::unordered}) |
                 sluice::shuffle({.buffer = 16, .seed = 1}) |
                 sluice::batch({.size = 8}, [](std::vector<counted>& g) { return std::move(g); });
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) {
        sluice::pipeline p(sluice::from(items, {4, 0}) | chain, {.runtime = {.cpu_threads = 2}});
        const auto take = r.below(30);  // 25 batches in all: some runs finish, most stop early
        std::size_t taken = 0;
        for (auto& b : p) {
            if (taken++ >= take) break;
            REQUIRE(b.size() <= 8);
        }
        if (r.below(2)) p.stop();  // explicitly, or by the destructor
    }
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("1000 pipelines in " << seconds << " s");
    REQUIRE(counted::live.load() == baseline);  // nothing leaked, nothing destroyed twice
}

TEST_CASE("stop() from another thread wakes a trainer blocked in the loop", "[pipeline][stop]") {
    // A source that never ends on its own: stops only when cancelled.
    auto forever = sluice::make_stage<void, int>(
        "forever", {}, [](sluice::stage_context<void, int>& ctx) -> sluice::task<void> {
            co_await ctx.out.send(1);
            for (;;) co_await ctx.out.send(2);
        });
    auto slow = sluice::map([](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return x;
    });
    sluice::pipeline p(forever | slow);
    REQUIRE(p.next_blocking() == 1);
    std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        p.stop();
    });
    std::size_t n = 0;
    for (auto& x : p) n += x > 0;  // ends once stopped
    stopper.join();
    REQUIRE(n > 0);
}

TEST_CASE("figures and the bottleneck name the slow stage", "[pipeline][stats]") {
    auto slow_map = sluice::map([](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return x;
    });
    std::vector<int> v(100, 1);
    sluice::pipeline p(sluice::from(v) | slow_map | sluice::map([](int x) { return x; }, {.name = "fast"}));
    int sum = 0;
    for (int x : p) sum += x;
    REQUIRE(sum == 100);
    p.stop();
    auto f = p.figures();
    REQUIRE(f.stages.size() == 4);  // from, map, fast, consumer
    REQUIRE(f.stages[1].name == "map");
    REQUIRE(f.stages[1].items_in == 100);
    REQUIRE(f.stages[1].items_out == 100);
    REQUIRE(f.stages[1].busy_s > 0.15);
    REQUIRE(f.stages[2].wait_input_s > 0.1);  // the stage after the slow one starves
    REQUIRE(f.bottleneck() == "map");
    REQUIRE(f.stages.back().name == "consumer");
    REQUIRE(f.stages.back().items_in == 100);
}

TEST_CASE("a slow consumer is named as the bottleneck", "[pipeline][stats]") {
    std::vector<int> v(60, 1);
    sluice::pipeline p(sluice::from(v, {2, 0}) | sluice::map([](int x) { return x; }, {.out = {2, 0}}));
    for (int x : p) {
        (void)x;
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    p.stop();
    auto f = p.figures();
    REQUIRE(f.bottleneck() == "consumer");
    REQUIRE(f.stages[1].wait_output_s > 0.05);  // the map waits for room
    auto json = f.json();
    REQUIRE(json.find("\"bottleneck\":\"consumer\"") != std::string::npos);
    REQUIRE(json.find("\"wait_output_s\":") != std::string::npos);
    REQUIRE(f.table().find("bottleneck: consumer") != std::string::npos);
}

TEST_CASE("the progress callback reports live figures", "[pipeline][stats]") {
    std::atomic<int> calls{0};
    std::vector<int> v(50, 1);
    sluice::pipeline p(sluice::from(v) | sluice::map([](int x) {
                           std::this_thread::sleep_for(std::chrono::milliseconds(2));
                           return x;
                       }),
                       {.progress = std::chrono::milliseconds(10),
                        .on_progress = [&](const sluice::pipeline_figures& f) {
                            if (f.progress_line().find("bottleneck") != std::string::npos) ++calls;
                        }});
    for (int x : p) (void)x;
    p.stop();
    REQUIRE(calls.load() >= 2);
}

TEST_CASE("an exception from the progress callback ends the pipeline with that error, not the process",
          "[pipeline][errors]") {
    std::vector<int> v(100000, 1);
    sluice::pipeline p(sluice::from(v) | sluice::map([](int x) {
                           std::this_thread::sleep_for(std::chrono::microseconds(50));
                           return x;
                       }),
                       {.progress = std::chrono::milliseconds(10),
                        .on_progress = [](const sluice::pipeline_figures&) {
                            throw std::runtime_error("the dashboard is down");
                        }});
    std::size_t n = 0;
    try {
        for (int x : p) n += static_cast<std::size_t>(x);
        FAIL("the pipeline ended without the callback's error");
    } catch (const std::runtime_error& e) {
        REQUIRE(std::string(e.what()) == "the dashboard is down");
    }
    REQUIRE(n < v.size());  // it ended early
}

TEST_CASE("stop() returns when a coroutine consumer's executor has stopped", "[pipeline][stop]") {
    std::vector<int> v(10, 1);
    sluice::pipeline p(sluice::from(v) | sluice::map([](int x) {
                           std::this_thread::sleep_for(std::chrono::seconds(1));  // nothing ready yet
                           return x;
                       }));
    asio::io_context io;
    std::atomic<bool> finished{false};
    sluice::spawn(io.get_executor(),
                  [](sluice::pipeline<int>& p, std::atomic<bool>& finished) -> sluice::task<void> {
                      while (co_await p.next()) {
                      }
                      finished = true;
                  }(p, finished),
                  [](std::exception_ptr) {});
    io.run();  // returns once the coroutine suspends in next(): spawn holds no work
    REQUIRE_FALSE(finished.load());
    const auto t0 = std::chrono::steady_clock::now();
    p.stop();  // used to spin for ever, waiting for the suspended reader
    REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // a hang test
    io.restart();
    io.run();  // the coroutine wakes to the end of the stream and finishes
    REQUIRE(finished.load());
}
