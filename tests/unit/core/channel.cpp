#include <sluice/core/channel.hpp>

#include "support/test_support.hpp"

#include <asio/io_context.hpp>
#include <asio/thread_pool.hpp>

#include <latch>
#include <thread>

using sluice::channel;
using sluice::task;
using sluice_test::counted;

namespace {
// Runs coroutines on a pool and waits for all of them.
struct runner {
    asio::thread_pool pool{4};
    std::atomic<int> failures{0};
    std::vector<std::exception_ptr> errors;
    std::mutex m;
    std::atomic<int> pending{0};
    void go(task<void> t) {
        ++pending;
        sluice::spawn(pool.get_executor(), std::move(t), [this](std::exception_ptr e) {
            if (e) {
                std::lock_guard lock(m);
                errors.push_back(e);
            }
            --pending;
        });
    }
    void wait() {
        for (int i = 0; i < 20000 && pending.load() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        REQUIRE(pending.load() == 0);
        for (auto& e : errors) REQUIRE_NOTHROW(std::rethrow_exception(e));
    }
    ~runner() { pool.join(); }
};
}  // namespace

TEST_CASE("a closed channel still delivers what it buffered, then ends", "[channel]") {
    channel<int> ch({8, 0});
    for (int i = 0; i < 5; ++i) REQUIRE(ch.send_blocking(i));
    ch.close();
    for (int i = 0; i < 5; ++i) REQUIRE(ch.receive_blocking() == i);
    REQUIRE_FALSE(ch.receive_blocking());
    REQUIRE_FALSE(ch.send_blocking(9));  // closed: no more sends
}

TEST_CASE("a producer's error arrives after the buffered items", "[channel]") {
    channel<int> ch({8, 0});
    ch.add_producer(2);
    ch.send_blocking(1);
    ch.send_blocking(2);
    ch.producer_done(std::make_exception_ptr(std::runtime_error("shard 7 is corrupt")));
    ch.send_blocking(3);  // the other producer goes on
    ch.producer_done();
    REQUIRE(ch.receive_blocking() == 1);
    REQUIRE(ch.receive_blocking() == 2);
    REQUIRE(ch.receive_blocking() == 3);
    REQUIRE_THROWS_WITH(ch.receive_blocking(), "shard 7 is corrupt");
}

TEST_CASE("the channel closes when its last producer is done", "[channel]") {
    channel<int> ch({4, 0});
    ch.add_producer(3);
    ch.producer_done();
    ch.producer_done();
    REQUIRE_FALSE(ch.closed());
    ch.producer_done();
    REQUIRE(ch.closed());
    REQUIRE_FALSE(ch.receive_blocking());
}

TEST_CASE("send suspends while the channel is full in items", "[channel]") {
    runner r;
    channel<int> ch({2, 0});
    std::atomic<int> sent{0};
    r.go([](channel<int>& ch, std::atomic<int>& sent) -> task<void> {
        for (int i = 0; i < 5; ++i) {
            sluice_test::must(co_await ch.send(i));
            ++sent;
        }
        ch.close();
    }(ch, sent));
    for (int i = 0; i < 200 && sent.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(sent.load() == 2);  // the third send waits for room
    CHECK(ch.size() == 2);
    for (int i = 0; i < 5; ++i) REQUIRE(ch.receive_blocking() == i);
    REQUIRE_FALSE(ch.receive_blocking());
    r.wait();
}

TEST_CASE("drained waits until everything sent was taken, sends nothing, and fails on cancel or close", "[channel]") {
    runner r;
    channel<int> ch({4, 0});  // room for more: drained() waits for empty, not for room
    std::atomic<int> step{0};
    std::atomic<bool> ok{false};
    r.go([](channel<int>& ch, std::atomic<int>& step, std::atomic<bool>& ok) -> task<void> {
        sluice_test::must(co_await ch.send(1));
        sluice_test::must(co_await ch.send(2));
        step = 1;
        ok = co_await ch.drained();
        step = 2;
    }(ch, step, ok));
    for (int i = 0; i < 10000 && step.load() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(ch.receive_blocking() == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(step.load() == 1);  // one item still there
    REQUIRE(ch.receive_blocking() == 2);
    for (int i = 0; i < 10000 && step.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(step.load() == 2);
    CHECK(ok.load());
    CHECK(ch.size() == 0);  // drained() put nothing in
    r.wait();
    // Raised capacity changes nothing: still until empty.
    ch.set_items(16);
    REQUIRE(ch.send_blocking(3));
    std::atomic<int> woke{0};
    r.go([](channel<int>& ch, std::atomic<int>& woke) -> task<void> {
        if (co_await ch.drained()) ++woke;
    }(ch, woke));
    // A sender beside it: whichever queued first, both end once 3 and 4 are taken.
    std::thread sender([&] { REQUIRE(ch.send_blocking(4)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(woke.load() == 0);
    REQUIRE(ch.receive_blocking() == 3);
    REQUIRE(ch.receive_blocking() == 4);
    sender.join();
    r.wait();
    CHECK(woke.load() == 1);
    CHECK(ch.size() == 0);
    // Cancelled while waiting, and once closed: false.
    channel<int> full({1, 0});
    REQUIRE(full.send_blocking(5));
    std::atomic<int> failed{0};
    r.go([](channel<int>& ch, std::atomic<int>& failed) -> task<void> {
        if (!co_await ch.drained()) ++failed;
    }(full, failed));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(failed.load() == 0);
    full.cancel();
    r.wait();
    CHECK(failed.load() == 1);
    channel<int> closed({1, 0});
    closed.close();
    r.go([](channel<int>& ch, std::atomic<int>& failed) -> task<void> {
        if (!co_await ch.drained()) ++failed;
    }(closed, failed));
    r.wait();
    CHECK(failed.load() == 2);
}

TEST_CASE("a channel's item capacity changes while it is used: more admits waiting senders, less drops nothing",
          "[channel]") {
    runner r;
    channel<int> ch({2, 0});
    std::atomic<int> sent{0};
    r.go([](channel<int>& ch, std::atomic<int>& sent) -> task<void> {
        for (int i = 0; i < 12; ++i) {
            sluice_test::must(co_await ch.send(i));
            ++sent;
        }
        ch.close();
    }(ch, sent));
    for (int i = 0; i < 10000 && sent.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(ch.receive_blocking() == 0);  // the ring's head moves: the items wrap around when it grows
    for (int i = 0; i < 10000 && sent.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(sent.load() == 3);
    ch.set_items(8);  // the waiting sender goes in, and the ones after it
    for (int i = 0; i < 10000 && sent.load() < 9; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(sent.load() == 9);
    CHECK(ch.size() == 8);
    CHECK(ch.limits().items == 8);
    ch.set_items(3);  // below what it holds: nothing goes, no room until it drains under 3
    CHECK(ch.size() == 8);
    for (int i = 1; i <= 5; ++i) REQUIRE(ch.receive_blocking() == i);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(sent.load() == 9);  // 3 held: still full
    for (int i = 6; i < 12; ++i) REQUIRE(ch.receive_blocking() == i);
    REQUIRE_FALSE(ch.receive_blocking());
    r.wait();
}

TEST_CASE("a byte budget bounds the channel, and one oversized item still passes", "[channel]") {
    channel<std::string> ch({100, 10});
    REQUIRE(ch.send_blocking(std::string(6, 'a')));
    REQUIRE(ch.buffered_bytes() == 6);
    std::thread t([&] { REQUIRE(ch.send_blocking(std::string(6, 'b'))); });  // 12 > 10: waits
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(ch.size() == 1);
    REQUIRE(ch.receive_blocking()->front() == 'a');
    t.join();
    REQUIRE(ch.receive_blocking()->front() == 'b');
    // Empty channel: an item above the budget is admitted rather than deadlocking.
    REQUIRE(ch.send_blocking(std::string(50, 'c')));
    REQUIRE(ch.buffered_bytes() == 50);
    REQUIRE(ch.receive_blocking()->size() == 50);
}

TEST_CASE("cancel wakes every waiting sender and receiver", "[channel]") {
    runner r;
    channel<int> full({1, 0});
    channel<int> empty({1, 0});
    full.send_blocking(0);
    std::atomic<int> senders_failed{0}, receivers_ended{0};
    for (int i = 0; i < 4; ++i) {
        r.go([](channel<int>& ch, std::atomic<int>& n) -> task<void> {
            if (!co_await ch.send(1)) ++n;
        }(full, senders_failed));
        r.go([](channel<int>& ch, std::atomic<int>& n) -> task<void> {
            if (!(co_await ch.receive())) ++n;
        }(empty, receivers_ended));
    }
    std::thread blocked_receiver([&] {
        if (!empty.receive_blocking()) ++receivers_ended;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(senders_failed.load() == 0);
    CHECK(receivers_ended.load() == 0);
    full.cancel();
    empty.cancel();
    r.wait();
    blocked_receiver.join();
    REQUIRE(senders_failed.load() == 4);
    REQUIRE(receivers_ended.load() == 5);
    REQUIRE_FALSE(full.send_blocking(2));  // later sends fail
    REQUIRE_FALSE(full.receive_blocking());  // and the buffered item was dropped
}

TEST_CASE("a waiting coroutine's wake-up is posted once the lock is released, not under it", "[channel]") {
    // Posting may wake a sleeping pool thread (a futex call); the woken coroutine going
    // for the channel at once found its mutex still held and slept on it too (a quarter of
    // a raw HTTP run's context switches). The channel holds its wake-ups for the end of
    // its lock, and the outermost holder on a thread posts them, in order.
    asio::io_context io;
    channel<int> ch({4, 0});
    std::vector<int> got;
    for (int i = 0; i < 2; ++i)
        sluice::spawn(io.get_executor(), [](channel<int>& c, std::vector<int>& g) -> task<void> {
            if (auto v = co_await c.receive()) g.push_back(*v);
        }(ch, got), [](std::exception_ptr) {});
    io.poll();  // both run to their receive and wait
    REQUIRE(got.empty());
    {
        sluice::detail::wake_after_unlock outer;
        REQUIRE(ch.send_blocking(7));  // handed to the first receiver: its lock ends here
        REQUIRE(ch.send_blocking(8));
        io.restart();  // a poll that found no work leaves the context stopped
        CHECK(io.poll() == 0);  // nothing posted while the outer holder lives
        CHECK(got.empty());
    }
    io.restart();
    CHECK(io.poll() == 2);  // posted as it ended
    CHECK(got == std::vector<int>{7, 8});
    REQUIRE(ch.send_blocking(9));  // no receiver waits: buffered, nothing to wake
    io.restart();
    CHECK(io.poll() == 0);
}

TEST_CASE("cancel destroys buffered items exactly once and the channel leaks nothing", "[channel]") {
    counted::reset();
    {
        channel<counted> ch({16, 0});
        for (int i = 0; i < 10; ++i) ch.send_blocking(counted(i));
        REQUIRE(counted::live.load() == 10);
        REQUIRE(ch.receive_blocking()->value == 0);
        ch.cancel();
        REQUIRE(counted::live.load() == 0);
        for (int i = 0; i < 5; ++i) ch.send_blocking(counted(i));  // refused and destroyed
        REQUIRE(counted::live.load() == 0);
    }
    {
        channel<counted> ch({16, 0});
        for (int i = 0; i < 7; ++i) ch.send_blocking(counted(i));
    }  // destroyed with items inside
    REQUIRE(counted::live.load() == 0);
    REQUIRE(counted::copies.load() == 0);  // items are moved, never copied
}

TEST_CASE("receive reports each item's position in the order items left", "[channel]") {
    runner r;
    channel<int> ch({4, 0});
    for (int i = 0; i < 3; ++i) ch.send_blocking(i * 10);
    std::vector<std::uint64_t> seen;
    r.go([](channel<int>& ch, std::vector<std::uint64_t>& seen) -> task<void> {
        for (int i = 0; i < 3; ++i) {
            std::uint64_t idx = 99;
            auto v = co_await ch.receive(nullptr, &idx);
            sluice_test::must(v.has_value());
            seen.push_back(idx);
        }
    }(ch, seen));
    r.wait();
    REQUIRE(seen == std::vector<std::uint64_t>{0, 1, 2});
}

TEST_CASE("many producers and consumers deliver every item exactly once", "[channel][mpmc]") {
    counted::reset();
    constexpr int producers = 8, per_producer = 20000, coro_consumers = 4;
    {
        runner r;
        channel<counted> ch({32, 0});
        ch.add_producer(producers);
        std::atomic<std::int64_t> sum{0}, count{0};
        for (int p = 0; p < producers; ++p)
            r.go([](channel<counted>& ch, int p) -> task<void> {
                for (int i = 0; i < per_producer; ++i) sluice_test::must(co_await ch.send(counted(p * per_producer + i)));
                ch.producer_done();
            }(ch, p));
        for (int c = 0; c < coro_consumers; ++c)
            r.go([](channel<counted>& ch, std::atomic<std::int64_t>& sum, std::atomic<std::int64_t>& count) -> task<void> {
                while (auto v = co_await ch.receive()) {
                    sum += v->value;
                    ++count;
                }
            }(ch, sum, count));
        std::thread blocking([&] {  // an ordinary thread consumes too
            while (auto v = ch.receive_blocking()) {
                sum += v->value;
                ++count;
            }
        });
        r.wait();
        blocking.join();
        const std::int64_t n = std::int64_t(producers) * per_producer;
        REQUIRE(count.load() == n);
        REQUIRE(sum.load() == n * (n - 1) / 2);
    }
    REQUIRE(counted::live.load() == 0);
    REQUIRE(counted::copies.load() == 0);
}

TEST_CASE("under a byte budget, later senders queue behind a waiting large item", "[channel]") {
    channel<std::string> ch({100, 10});
    ch.send_blocking(std::string(6, 'a'));
    std::thread big([&] { ch.send_blocking(std::string(8, 'B')); });  // waits for room
    while (true) {  // until the big sender is queued
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (ch.size() == 1) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::thread small([&] { ch.send_blocking(std::string(1, 'c')); });  // would fit: must queue
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(ch.size() == 1);
    REQUIRE(*ch.receive_blocking() == "aaaaaa");
    big.join();
    small.join();
    REQUIRE(*ch.receive_blocking() == "BBBBBBBB");  // first come, first served
    REQUIRE(*ch.receive_blocking() == "c");
}
