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
