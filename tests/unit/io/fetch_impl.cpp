#include <sluice/io/impl/fetch.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

// What one run of a fetch stage shares among its workers: the AIMD limit from the
// stage's options, and a cache only when one is asked for.
TEST_CASE("a fetch run's shared state: the request limit from .concurrency, a cache only when asked", "[fetch]") {
    auto plain = sluice::detail::make_fetch_run({.concurrency = 12, .min_concurrency = 3});
    REQUIRE(plain->limit);
    CHECK(plain->limit->limit() == 12);
    CHECK(plain->cache == nullptr);
    sluice_test::temp_dir d;
    auto cached = sluice::detail::make_fetch_run({.cache = {.dir = (d / "cache")}});
    CHECK(cached->cache != nullptr);
}

TEST_CASE("a fetch run's room for the parts waiting their turn: the output channel's bytes, a channel's share of a memory budget",
          "[fetch][parts]") {
    constexpr std::uint64_t mib = 1u << 20;
    auto run = sluice::detail::make_fetch_run({});  // out: 64 MiB; 4 parts in flight
    CHECK(run->part_room == 64 * mib);
    CHECK(run->part_grow_max == 21 * mib);  // three waiting parts of at most this fit in it
    auto small = sluice::detail::make_fetch_run({.out = {4, 4 * mib}});
    CHECK(small->part_room == 4 * mib);
    CHECK(small->part_grow_max == mib);  // parts stay at part_size then (8 MiB: the floor)
    // Under a budget the room is what the division gives it as one more channel, at most
    // the output channel's own bytes (the division caps it there), and nothing until then.
    std::vector<sluice::detail::budget_share> shares;
    auto budgeted = sluice::detail::make_fetch_run({}, nullptr, &shares);
    CHECK(budgeted->part_room == 0);
    REQUIRE(shares.size() == 1);
    CHECK(shares[0].as_channel);
    CHECK(shares[0].most == 64 * mib);
    shares[0].give(12 * mib);
    CHECK(budgeted->part_room == 12 * mib);
    CHECK(budgeted->part_grow_max == 4 * mib);
    shares[0].give(64 * mib);
    CHECK(budgeted->part_room == 64 * mib);
    CHECK(budgeted->part_grow_max == 21 * mib);
    std::vector<sluice::detail::budget_share> own;
    sluice::detail::make_fetch_run({.out = {4, 4 * mib}}, nullptr, &own);
    REQUIRE(own.size() == 1);
    CHECK(own[0].most == 4 * mib);
    std::vector<sluice::detail::budget_share> none;
    sluice::detail::make_fetch_run({.parts_in_flight = 1}, nullptr, &none);
    sluice::detail::make_fetch_run({.parallel_parts = false}, nullptr, &none);
    CHECK(none.empty());  // no parts wait: no share asked for
    CHECK(sluice::detail::make_fetch_run({.parts_in_flight = 1})->part_room == 0);
    CHECK(sluice::detail::make_fetch_run({.parallel_parts = false})->part_room == 0);
    {
        // A lease takes what it asks for, or what is left; moved, it is given back once.
        sluice::detail::part_room_lease a(run->part_room, 60 * mib);
        CHECK(a.bytes() == 60 * mib);
        sluice::detail::part_room_lease b(run->part_room, 8 * mib);
        CHECK(b.bytes() == 4 * mib);
        CHECK(run->part_room == 0);
        sluice::detail::part_room_lease c(run->part_room, 8 * mib);
        CHECK(c.bytes() == 0);
        sluice::detail::part_room_lease d = std::move(b);
        CHECK(d.bytes() == 4 * mib);
        CHECK(b.bytes() == 0);
        a = std::move(d);  // a's 60 MiB go back, and it holds d's 4
        CHECK(a.bytes() == 4 * mib);
        CHECK(run->part_room == 60 * mib);
        sluice::detail::part_room_lease e(run->part_room, 3 * mib / 2, mib);  // whole chunks only
        CHECK(e.bytes() == mib);
        CHECK(run->part_room == 59 * mib);
    }
    CHECK(run->part_room == 64 * mib);
}

TEST_CASE("a tuned fetch offers its requests in flight as a knob between its floor and its workers", "[fetch][tune]") {
    std::vector<sluice::detail::knob> knobs;
    // Fixed parts (max_part_size no larger than part_size): growing parts, the default,
    // offer no part size (see below).
    auto run = sluice::detail::make_fetch_run(
        {.concurrency = 48, .min_concurrency = 3, .chunk_size = 1u << 20, .max_part_size = 8u << 20}, &knobs);
    REQUIRE(knobs.size() == 2);  // the requests in flight, then the part size
    auto& k = knobs[0];
    CHECK(k.stage == "fetch");
    CHECK(k.name == "concurrency");
    CHECK(k.min == 3);
    CHECK(k.max == 48);
    CHECK(k.start == 8);
    CHECK(k.bytes_each == 3u << 20);
    CHECK(k.get() == 48);
    k.set(16);  // the ceiling AIMD stays under
    CHECK(k.get() == 16);
    CHECK(run->limit->limit() == 16);
    k.set(32);  // raised: the limit goes up with it at once
    CHECK(run->limit->limit() == 32);
    std::uint64_t seq = 0;  // a 503: AIMD halves below the ceiling
    REQUIRE(run->limit->try_acquire(&seq));
    run->limit->release(seq, false, true);
    CHECK(run->limit->limit() == 16);
    k.set(24);  // a lower ceiling above the backed-off limit leaves it backed off
    CHECK(run->limit->limit() == 16);
    CHECK(k.get() == 24);
    REQUIRE(k.pressure == &run->throttled);
    // The part size, in MiB, from the one given, which is its floor (it only climbs); no
    // memory of its own (a part streams through the same chunks), the same throttling.
    auto& p = knobs[1];
    CHECK(p.name == "part_size_mib");
    CHECK(p.min == 8);
    CHECK(p.start == 8);
    CHECK(p.max == 64);
    CHECK(p.bytes_each == 0);
    CHECK(p.pressure == &run->throttled);
    CHECK(p.get() == 8);
    CHECK(run->part_size == 8u << 20);
    p.set(32);
    CHECK(run->part_size == 32u << 20);
    CHECK(p.get() == 32);
    // A single-request stage offers only its part size; one without parallel parts, or
    // with a part size that is no whole number of MiB, offers nothing.
    std::vector<sluice::detail::knob> one;
    sluice::detail::make_fetch_run({.concurrency = 1, .max_part_size = 8u << 20}, &one);
    REQUIRE(one.size() == 1);
    CHECK(one[0].name == "part_size_mib");
    // Growing parts (the default) offer no part size: every part past the third is
    // max_part_size whatever the first.
    std::vector<sluice::detail::knob> grow;
    sluice::detail::make_fetch_run({.concurrency = 48}, &grow);
    REQUIRE(grow.size() == 1);
    CHECK(grow[0].name == "concurrency");
    // A chunk_size of 0 asks for 1 MiB chunks: a request holds three of them, not nothing
    // (which a memory budget would not cap).
    std::vector<sluice::detail::knob> zero;
    sluice::detail::make_fetch_run({.concurrency = 48, .chunk_size = 0}, &zero);
    REQUIRE(zero.size() == 1);
    CHECK(zero[0].bytes_each == 3u << 20);
    CHECK(zero[0].bytes_now() == 3u << 20);
    std::vector<sluice::detail::knob> none;
    sluice::detail::make_fetch_run({.concurrency = 1, .parallel_parts = false}, &none);
    CHECK(none.empty());
    auto odd = sluice::detail::make_fetch_run({.concurrency = 1, .part_size = 100'000}, &none);
    CHECK(none.empty());
    CHECK(odd->part_size == 100'000);
}
