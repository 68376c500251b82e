#include <sluice/core/task.hpp>

#include "support/test_support.hpp"

#include <asio/thread_pool.hpp>

#include <future>

namespace {
sluice::task<int> answer() { co_return 42; }
sluice::task<int> twice() { co_return 2 * co_await answer(); }
sluice::task<void> fails() {
    co_await answer();
    throw std::runtime_error("boom at byte 7");
}
sluice::task<std::string> move_only_result() { co_return std::string(1000, 'x'); }
}  // namespace

TEST_CASE("tasks are lazy, compose, and return values", "[task]") {
    REQUIRE(sluice::sync_wait(answer()) == 42);
    REQUIRE(sluice::sync_wait(twice()) == 84);
    REQUIRE(sluice::sync_wait(move_only_result()).size() == 1000);
}

TEST_CASE("an exception in a task reaches the awaiter", "[task]") {
    REQUIRE_THROWS_WITH(sluice::sync_wait(fails()), "boom at byte 7");
}

TEST_CASE("spawn runs a task on an executor and reports completion", "[task]") {
    asio::thread_pool pool(2);
    std::promise<std::pair<int, bool>> done;
    sluice::spawn(pool.get_executor(), twice(), [&](std::optional<int> v, std::exception_ptr e) {
        done.set_value({v.value_or(-1), e != nullptr});
    });
    auto [v, failed] = done.get_future().get();
    REQUIRE(v == 84);
    REQUIRE_FALSE(failed);
    pool.join();
}

TEST_CASE("switch_to moves a coroutine to another executor", "[task]") {
    asio::thread_pool a(1), b(1);
    std::promise<bool> done;
    std::thread::id ta, tb;
    auto t = [](asio::thread_pool& b, std::thread::id& ta, std::thread::id& tb) -> sluice::task<void> {
        ta = std::this_thread::get_id();
        co_await sluice::switch_to{b.get_executor()};
        tb = std::this_thread::get_id();
        auto ex = co_await sluice::current_executor{};
        sluice_test::must(ex == sluice::executor(b.get_executor()));
    }(b, ta, tb);
    sluice::spawn(a.get_executor(), std::move(t), [&](std::exception_ptr e) { done.set_value(e == nullptr); });
    REQUIRE(done.get_future().get());
    REQUIRE(ta != tb);
    a.join();
    b.join();
}

TEST_CASE("sync_wait waits for a task suspended on work of another thread", "[task]") {
    asio::thread_pool other(1);
    std::promise<int> p;
    auto f = p.get_future();
    auto t = [](asio::thread_pool& other, std::promise<int>& p) -> sluice::task<int> {
        co_await sluice::switch_to{other.get_executor()};  // leaves sync_wait's loop idle
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        p.set_value(1);
        co_return 7;
    }(other, p);
    REQUIRE(sluice::sync_wait(std::move(t)) == 7);
    REQUIRE(f.get() == 1);
    other.join();
}
