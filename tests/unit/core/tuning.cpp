// The tuner's hill climb (core/detail/tuning.hpp), driven with made-up figures: it climbs
// only the bottleneck's knob, keeps a doubling only when it pays 5 %, goes back and
// settles when one does not, never climbs under throttling, and respects its ceiling.
#include <sluice/core/detail/tuning.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <functional>

namespace {
// A source whose rate grows with in flight up to `knee`, then stays.
struct model {
    unsigned value = 64;
    unsigned knee = 16;
    double per_request = 1e6;  // bytes/s each request in flight gives
    std::atomic<std::uint64_t> throttled{0};
    double bytes = 0, now = 0;
    sluice::detail::knob knob(unsigned max = 256) {
        return {.stage = "fetch", .name = "concurrency", .min = 2, .max = max, .start = 8, .bytes_each = 3u << 20, .bytes_now = nullptr,
                .get = [this] { return value; }, .set = [this](unsigned v) { value = v; }, .pressure = &throttled};
    }
    // Half a second of the pipeline at the current setting.
    sluice::pipeline_figures window(const char* bottleneck = "fetch") {
        now += 0.5;
        bytes += 0.5 * per_request * std::min(value, knee);
        sluice::pipeline_figures f;
        f.seconds = now;
        f.stages.push_back({.name = "fetch", .workers = 1, .items_out = 1, .bytes_out = std::uint64_t(bytes), .busy_s = now,
                            .counts_records = true, .counters = {}, .notes = {}});
        f.stages.push_back({.name = "consumer", .workers = 1, .busy_s = std::string(bottleneck) == "consumer" ? 2 * now : 0,
                            .counters = {}, .notes = {}});
        return f;
    }
};
}  // namespace

TEST_CASE("the tuner climbs to the knee, keeps it, and settles there", "[tune]") {
    model m;
    sluice::detail::hill_climb climb({m.knob()}, 0);
    climb.begin(0);
    CHECK(m.value == 8);  // starts low
    for (int i = 0; i < 20; ++i) climb.step(m.window(), m.now);
    CHECK(m.value == 16);  // 8 -> 16 paid, 16 -> 32 did not: back to 16
    auto s = climb.settings();
    REQUIRE(s.size() == 1);
    CHECK(s[0].value == 16);
    CHECK(s[0].settled);
    const auto& log = climb.log();
    REQUIRE(log.size() == 3);
    CHECK((log[0].from == 64 && log[0].to == 8));
    CHECK((log[1].from == 8 && log[1].to == 16));
    CHECK(log[1].why.find("MB/s") != std::string::npos);
    CHECK((log[2].from == 16 && log[2].to == 16));
    CHECK(log[2].why.find("settled: doubling to 32 gave +0 %, kept 16") != std::string::npos);
    // Settled means settled: more windows change nothing, whatever the rate does.
    m.knee = 1000;
    for (int i = 0; i < 20; ++i) climb.step(m.window(), m.now);
    CHECK(m.value == 16);
    CHECK(climb.log().size() == 3);
}

TEST_CASE("the tuner stops at its ceiling, and a memory budget lowers the ceiling", "[tune]") {
    model m;
    m.knee = 10000;
    sluice::detail::hill_climb climb({m.knob(40)}, 0);
    climb.begin(0);
    for (int i = 0; i < 30; ++i) climb.step(m.window(), m.now);
    CHECK(m.value == 40);  // 8, 16, 32, then 40 (the ceiling), then settled
    CHECK(climb.settings()[0].settled);
    CHECK(climb.log().back().why.find("ceiling") != std::string::npos);

    model b;
    b.knee = 10000;
    sluice::detail::hill_climb capped({b.knob()}, std::uint64_t{48} << 20);  // a quarter: 12 MiB = 4 x 3 MiB
    capped.begin(0);
    CHECK(b.value == 4);
    for (int i = 0; i < 10; ++i) capped.step(b.window(), b.now);
    CHECK(b.value == 4);
}

TEST_CASE("the tuner leaves a knob alone when its stage is not the bottleneck, and never climbs under throttling",
          "[tune]") {
    model m;
    sluice::detail::hill_climb climb({m.knob()}, 0);
    climb.begin(0);
    for (int i = 0; i < 10; ++i) climb.step(m.window("consumer"), m.now);
    CHECK(m.value == 8);  // the consumer is the limit: more requests would not help
    CHECK_FALSE(climb.settings()[0].settled);
    m.throttled += 3;  // 503s: AIMD's business
    for (int i = 0; i < 10; ++i) climb.step(m.window(), m.now);
    CHECK(m.value == 8);
    CHECK(climb.settings()[0].settled);
    CHECK(climb.log().back().why.find("throttles") != std::string::npos);
}

TEST_CASE("started past the knee, the tuner halves while it costs under 5 %, then settles", "[tune]") {
    model m;
    m.knee = 4;  // four requests give all there is
    sluice::detail::hill_climb climb({m.knob()}, 0);
    climb.begin(0);
    for (int i = 0; i < 30; ++i) climb.step(m.window(), m.now);
    std::string text;
    for (auto& c : climb.log()) text += std::to_string(c.from) + " -> " + std::to_string(c.to) + ": " + c.why + "\n";
    INFO(text);
    CHECK(m.value == 4);  // 8 -> 16 did not pay; 8 -> 4 cost nothing; 4 -> 2 halved the rate
    auto s = climb.settings();
    CHECK(s[0].settled);
    CHECK(climb.log().back().why.find("halving to 2 gave -50 %, kept 4") != std::string::npos);
    bool tried_fewer = false;
    for (auto& c : climb.log()) tried_fewer |= c.why.find("try fewer") != std::string::npos;
    CHECK(tried_fewer);
}

TEST_CASE("a knob that starts at its floor (fetch's part size) settles there when doubling does not pay, and "
          "climbs where it pays",
          "[tune]") {
    model m;
    m.knee = 4;  // as above: past the knee at the start
    auto k = m.knob();
    k.name = "part_size_mib";
    k.min = 8;  // its start
    sluice::detail::hill_climb climb({k}, 0);
    climb.begin(0);
    for (int i = 0; i < 30; ++i) climb.step(m.window(), m.now);
    std::string text;
    for (auto& c : climb.log()) text += std::to_string(c.from) + " -> " + std::to_string(c.to) + ": " + c.why + "\n";
    INFO(text);
    CHECK(m.value == 8);  // 8 -> 16 did not pay: back to 8, never below
    CHECK(climb.settings()[0].settled);
    CHECK(climb.log().back().why.find("settled: doubling to 16 gave +0 %, kept 8") != std::string::npos);
    CHECK(text.find("try fewer") == std::string::npos);
    model up;
    up.knee = 64;
    auto k2 = up.knob(64);
    k2.min = 8;
    sluice::detail::hill_climb climb2({k2}, 0);
    climb2.begin(0);
    for (int i = 0; i < 30; ++i) climb2.step(up.window(), up.now);
    CHECK(up.value == 64);
    CHECK(climb2.settings()[0].settled);
}

namespace {
// A producer and a consumer that work in bursts out of step: with `room` items between
// them both wait on each other, less as the room grows, up to `enough`.
struct bursts {
    unsigned room = 4, enough = 32;
    bool bursty = true;  // false: the consumer is a steady bottleneck, the producer only waits
    double items = 0, now = 0, in_wait = 0, out_wait = 0, busy = 0;
    sluice::detail::knob knob() {
        return {.stage = "map", .name = "out.items", .min = 4, .max = 64, .start = 4, .bytes_each = 0, .bytes_now = nullptr,
                .get = [this] { return room; }, .set = [this](unsigned v) { room = v; }, .pressure = nullptr, .at = 0,
                .channel = true};
    }
    sluice::pipeline_figures window() {
        now += 0.5;
        const double share = bursty ? 0.5 * (1.0 - double(std::min(room, enough)) / (2.0 * enough)) : 0.0;
        items += 0.5 * 1000 * (bursty ? 1.0 - share : 1.0);
        out_wait += 0.5 * (bursty ? share : 0.5);  // the producer waits for room
        in_wait += 0.5 * share;                     // the consumer waits for input (never when steady)
        busy += 0.5 * (1.0 - share);
        sluice::pipeline_figures f;
        f.seconds = now;
        f.stages.push_back({.name = "map", .workers = 1, .items_out = std::uint64_t(items), .busy_s = busy / 2,
                            .wait_output_s = out_wait, .counts_records = true, .counters = {}, .notes = {}});
        f.stages.push_back({.name = "consumer", .workers = 1, .items_in = std::uint64_t(items), .busy_s = busy,
                            .wait_input_s = in_wait, .counters = {}, .notes = {}});
        return f;
    }
};
}  // namespace

TEST_CASE("a channel's capacity climbs where both its ends wait on each other, and only there", "[tune]") {
    bursts b;
    sluice::detail::hill_climb climb({b.knob()}, 0);
    climb.begin(0);
    for (int i = 0; i < 30; ++i) climb.step(b.window(), b.now);
    std::string text;
    for (auto& c : climb.log()) text += std::to_string(c.from) + " -> " + std::to_string(c.to) + ": " + c.why + "\n";
    INFO(text);
    // 4 -> 64 (its ceiling) paid; 64 -> 32 cost nothing; 32 -> 16 cost 17 %: back to 32, settled.
    CHECK(b.room == 32);
    CHECK(climb.settings()[0].settled);
    REQUIRE(climb.log().size() == 3);
    CHECK((climb.log()[0].from == 4 && climb.log()[0].to == 64));
    CHECK(climb.log().back().why.find("halving to 16 gave -17 %, kept 32") != std::string::npos);

    // Where the jump does not pay (the room was enough already), it goes back.
    bursts enough;
    enough.enough = 4;
    sluice::detail::hill_climb back({enough.knob()}, 0);
    back.begin(0);
    for (int i = 0; i < 30; ++i) back.step(enough.window(), enough.now);
    CHECK(enough.room == 4);
    CHECK(back.settings().empty());  // at the capacity given: nothing to pin
    REQUIRE(back.log().size() == 1);
    CHECK(back.log()[0].why.find("settled: room for 64 gave +0 %, kept 4") != std::string::npos);

    // A steady bottleneck downstream: the producer waits for room, the consumer never for
    // input. More room would only fill up: the capacity stays where it was given.
    bursts steady;
    steady.bursty = false;
    sluice::detail::hill_climb still({steady.knob()}, 0);
    still.begin(0);
    for (int i = 0; i < 30; ++i) still.step(steady.window(), steady.now);
    CHECK(steady.room == 4);
    CHECK(still.log().empty());
}

// The worker gate (core/detail/worker_gate.hpp) in a running pipeline: how many of a
// map's workers work is the tuner's, from 1 up to its .concurrency, without changing
// what arrives or in which order, and a gated worker never holds up the end, an error or
// a stop.
#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>

#include <chrono>
#include <numeric>
#include <thread>

namespace {
using clock_type = std::chrono::steady_clock;
// How many calls of a map's function run at once, at most, before and after a moment.
struct overlap {
    std::atomic<int> now{0}, most_early{0}, most{0};
    clock_type::time_point t0 = clock_type::now();
    std::chrono::milliseconds early{800};
    void enter() {
        const int n = ++now;
        for (auto* m : {&most, clock_type::now() - t0 < early ? &most_early : &most}) {
            int seen = m->load();
            while (seen < n && !m->compare_exchange_weak(seen, n)) {
            }
        }
    }
    void leave() { --now; }
};
}  // namespace

TEST_CASE("tuned, a map's workers start at one and the tuner climbs them while it pays, in order", "[tune]") {
    overlap o;
    // 20 ms a call, so the rate follows the workers (1 -> 2 -> 4 doubles it each time);
    // the pool has the threads for all of them.
    auto slow = sluice::map([&](int x) {
        o.enter();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        o.leave();
        return x;
    }, {.concurrency = 4});
    sluice::pipeline p(sluice::from(sluice_test::iota(400)) | slow, {.runtime = {.cpu_threads = 4}, .tune = true});
    o.t0 = clock_type::now();
    std::vector<int> got;
    for (int x : p) got.push_back(x);
    CHECK(got == sluice_test::iota(400));  // ordered map: same items, same order, tuned
    // The tuner's first move comes after two windows (a second): until then, one worker.
    CHECK(o.most_early.load() == 1);
    CHECK(o.most.load() == 4);
    const auto f = p.figures();
    REQUIRE(f.tuned.size() == 1);
    CHECK(f.tuned[0].stage == "map");
    CHECK(f.tuned[0].knob == "concurrency");
    CHECK(f.tuned[0].value == 4);
    bool one_to_two = false;
    for (auto& c : f.tuning) one_to_two = one_to_two || (c.stage == "map" && c.from == 1 && c.to == 2);
    CHECK(one_to_two);
    CHECK(f.table().find("map.concurrency = 4") != std::string::npos);
}

TEST_CASE("tuned, a channel between stages that work in bursts gets more room, the items unchanged", "[tune]") {
    // The map rests 10 ms before every 32nd item, the consumer after every 32nd (half a
    // burst later): with room for 1 between them each waits through the other's rest; with
    // room for a half burst they rest at the same time, about twice the rate. Its items
    // (strings) say their bytes and the channel's bytes are bounded, so it is offered.
    auto bursty = sluice::map([](int x) {
        if (x % 32 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return std::to_string(x);
    }, {.out = {1, 1u << 20}});
    sluice::pipeline p(sluice::from(sluice_test::iota(1000000)) | bursty, {.tune = true});
    auto jumped = [](const sluice::pipeline_figures& f) {
        for (auto& c : f.tuning)
            if (c.stage == "map" && c.knob == "out.items" && c.from == 1 && c.to == 16 && c.why.find("rate") == 0)
                return true;
        return false;
    };
    std::vector<int> got;
    const auto t0 = clock_type::now();
    for (auto& s : p) {
        const int x = std::stoi(s);
        got.push_back(x);
        if (x % 32 == 16) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        // Until the jump is judged (a few half-second windows), or long enough to say it never was.
        if (x % 32 == 17 && (jumped(p.figures()) || clock_type::now() - t0 > std::chrono::seconds(15))) break;
    }
    p.stop();
    REQUIRE(got.size() > 100);
    const auto all = sluice_test::iota(1000000);
    CHECK(got == std::vector<int>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(got.size())));  // in order, none lost
    const auto f = p.figures();
    std::string text;
    for (auto& c : f.tuning)
        text += c.stage + "." + c.knob + " " + std::to_string(c.from) + " -> " + std::to_string(c.to) + ": " + c.why + "\n";
    INFO(text);
    INFO(f.table());
    CHECK(jumped(f));  // 1 -> 16 (its ceiling) paid
    bool listed = false;
    for (auto& s : f.tuned) listed = listed || (s.stage == "map" && s.knob == "out.items" && s.value >= 4);
    CHECK(listed);
    CHECK(f.table().find("map.out.items = ") != std::string::npos);  // to pin

    // The same stages passing ints: a byte limit cannot bound them (an int does not say its
    // bytes), so their channel is not offered.
    sluice::pipeline q(sluice::from(sluice_test::iota(100)) | sluice::map([](int x) { return x; }, {.out = {1, 1u << 20}}),
                       {.tune = true});
    for (int x : q) (void)x;
    CHECK(q.figures().tuning.empty());
}

TEST_CASE("gated workers end with the input, with an error, and with a stop", "[tune]") {
    auto ident = [](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return x;
    };
    SECTION("the end of the input: the gated workers see it too") {
        sluice::pipeline p(sluice::from(sluice_test::iota(30)) | sluice::map(ident, {.concurrency = 8}), {.tune = true});
        std::vector<int> got;
        for (int x : p) got.push_back(x);
        CHECK(got == sluice_test::iota(30));
        const auto f = p.figures();
        REQUIRE(f.tuned.size() == 1);
        CHECK(f.tuned[0].value == 1);  // over before the tuner's first move
    }
    SECTION("an error: it arrives after the items before it") {
        auto failing = sluice::map([](int x) {
            if (x == 20) throw std::runtime_error("item 20 is bad");
            return x;
        }, {.concurrency = 8});
        sluice::pipeline p(sluice::from(sluice_test::iota(100)) | failing, {.tune = true});
        std::vector<int> got;
        std::string what;
        try {
            for (int x : p) got.push_back(x);
        } catch (const std::exception& e) {
            what = e.what();
        }
        CHECK(what.find("item 20 is bad") != std::string::npos);
        CHECK(got == sluice_test::iota(20));
    }
    SECTION("a stop while seven of eight wait at the gate") {
        std::vector<int> many(100000, 1);
        sluice::pipeline p(sluice::from(many) | sluice::map(ident, {.concurrency = 8}), {.tune = true});
        int taken = 0;
        for (int x : p) {
            taken += x;
            if (taken == 50) break;
        }
        const auto t0 = clock_type::now();
        p.stop();
        CHECK(clock_type::now() - t0 < std::chrono::seconds(10));  // a generous bound: it must not hang
        const auto f = p.figures();
        REQUIRE(f.stages.size() == 3);
        CHECK(f.stages[1].workers == 8);
        CHECK(f.stages[1].active == 1);
        // The seven idle workers' time at the gate is waiting for input, not work.
        CHECK(f.stages[1].busy_s < 2 * f.seconds);
    }
}

TEST_CASE("the tuner tells two stages of the same name apart: it climbs the one that limits", "[tune]") {
    auto fast = sluice::map([](int x) { return x; }, {.concurrency = 4});
    auto slow = sluice::map([](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return x;
    }, {.concurrency = 4});  // also named "map"
    sluice::pipeline p(sluice::from(sluice_test::iota(300)) | fast | slow, {.runtime = {.cpu_threads = 4}, .tune = true});
    std::vector<int> got;
    for (int x : p) got.push_back(x);
    CHECK(got == sluice_test::iota(300));
    const auto f = p.figures();
    REQUIRE(f.tuned.size() == 2);  // in the order of the stages
    CHECK(f.tuned[0].stage == "map");
    CHECK(f.tuned[1].stage == "map");
    CHECK(f.tuned[0].value == 1);  // the fast one never limited the rate
    CHECK(f.tuned[1].value == 4);
}
