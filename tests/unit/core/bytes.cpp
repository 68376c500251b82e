#include <sluice/core/bytes.hpp>

#include "support/test_support.hpp"

TEST_CASE("slices share their buffer and keep it alive", "[bytes]") {
    auto pool = sluice::buffer_pool::create(1 << 20);
    auto buf = pool->allocate(1000);
    std::memset(buf->data(), 'x', 1000);
    sluice::bytes whole(std::move(buf), 1000);
    auto part = whole.slice(10, 20);
    REQUIRE(part.size() == 20);
    REQUIRE(part.data() == whole.data() + 10);  // a view, not a copy
    REQUIRE(whole.owner_use_count() == 2);
    whole = {};
    REQUIRE(part.view() == std::string(20, 'x'));
}

TEST_CASE("freed buffers return to the pool and serve later requests of their size class", "[bytes]") {
    auto pool = sluice::buffer_pool::create(1 << 20);
    const std::byte* first = nullptr;
    {
        auto b = pool->allocate(64 << 10);
        REQUIRE(b->capacity() == (64 << 10));
        first = b->data();
    }
    REQUIRE(pool->cached_bytes() == (64 << 10));
    auto again = pool->allocate(60 << 10);  // rounds up to the same class
    REQUIRE(again->data() == first);
    REQUIRE(pool->cached_bytes() == 0);
    auto other = pool->allocate(20 << 10);  // another class: a new buffer
    REQUIRE(other->capacity() == (20 << 10));
    REQUIRE(sluice::buffer_pool::size_class(100 << 10) == (112 << 10));  // at most 25% more
    REQUIRE(sluice::buffer_pool::size_class(4 << 20) == (4 << 20));
    REQUIRE(sluice::buffer_pool::size_class(100) == 100);  // small: not pooled, exact
}

TEST_CASE("a request whose class is empty reuses a cached buffer up to twice its size, not larger", "[bytes]") {
    auto pool = sluice::buffer_pool::create(128 << 20);
    const std::byte* big = nullptr;
    {
        auto a = pool->allocate(26'214'400);  // a batch of 256 x 100 KiB: the 28 MiB class
        big = a->data();
        REQUIRE(a->capacity() == (32u << 20));  // fresh from 4 MiB up: one class larger
    }
    REQUIRE(pool->cached_bytes() == (32u << 20));
    auto tiny = pool->allocate(1 << 20);  // 32 MiB is far more than twice 1 MiB: fresh
    REQUIRE(tiny->data() != big);
    REQUIRE(tiny->capacity() == (1u << 20));  // under 4 MiB: its own class, no headroom
    auto below = pool->allocate(14'000'000);  // five classes below 32 MiB: more than twice, fresh
    REQUIRE(below->data() != big);
    REQUIRE(below->capacity() == (16u << 20));
    auto last = pool->allocate(16'000'000);  // the epoch's last, smaller batch: the 16 MiB class
    REQUIRE(last->data() == big);  // 32 MiB is at most twice 16 MiB: reused
    REQUIRE(last->capacity() == (32u << 20));
    REQUIRE(pool->cached_bytes() == 0);
    last.reset();
    REQUIRE(pool->cached_bytes() == (32u << 20));  // back to its own class
    REQUIRE(pool->allocate(26'214'400)->data() == big);
    // Batches of ragged records straddle a class boundary: one of the 24 MiB class, made
    // fresh, also serves the next batch of the 28 MiB class (without the headroom that
    // batch would fault in 28 MiB of fresh memory).
    below.reset();
    const std::byte* b24 = nullptr;
    {
        auto a = pool->allocate(25'000'000);  // the 24 MiB class; the cache has 16 and 32 MiB
        REQUIRE(a->data() == big);            // 32 MiB is at most twice 24 MiB: reused
    }
    {
        auto hold = pool->allocate(30'000'000);  // takes the 32 MiB buffer
        REQUIRE(hold->data() == big);
        auto a = pool->allocate(25'000'000);  // the 16 MiB buffer is too small: fresh
        b24 = a->data();
        REQUIRE(a->capacity() == (28u << 20));
    }
    REQUIRE(pool->allocate(29'000'000)->data() == b24);  // the 28 MiB class finds it
    // Under 4 MiB a request keeps its class (records a shuffle holds must not take
    // buffers twice their size): a cached 3 MiB buffer does not serve 2 MiB.
    const std::byte* three = nullptr;
    {
        auto b = pool->allocate(3u << 20);
        three = b->data();
        REQUIRE(b->capacity() == (3u << 20));
    }
    auto two = pool->allocate(2u << 20);
    REQUIRE(two->data() != three);
    REQUIRE(two->capacity() == (2u << 20));
    REQUIRE(pool->allocate(3u << 20)->data() == three);
    // From 4 MiB up, a size that is itself a class (a 4 MiB read chunk) gets no headroom.
    REQUIRE(pool->allocate(4u << 20)->capacity() == (4u << 20));
}

TEST_CASE("the pool caches at most its budget, and buffers may outlive it", "[bytes]") {
    std::shared_ptr<sluice::buffer> keep;
    {
        auto pool = sluice::buffer_pool::create(100 << 10);
        auto a = pool->allocate(64 << 10);
        auto b = pool->allocate(64 << 10);
        keep = pool->allocate(64 << 10);
        a.reset();
        b.reset();
        REQUIRE(pool->cached_bytes() == (64 << 10));  // the second did not fit
    }
    keep.reset();  // the pool is gone: freed normally (ASan checks)
}

TEST_CASE("compact copies a small slice out of a large buffer", "[bytes]") {
    auto big = std::make_shared<sluice::buffer>(1 << 20);
    std::memset(big->data(), 'y', 1 << 20);
    sluice::bytes whole(big, 1 << 20);
    auto small = whole.slice(100, 1000).compact();
    REQUIRE(small.owner_capacity() == 1000);
    auto pool = sluice::buffer_pool::create();
    auto pooled = whole.slice(0, 100'000).compact(pool.get());  // from the pool, its class
    REQUIRE(pooled.owner_capacity() == sluice::buffer_pool::size_class(100'000));
    REQUIRE(pooled.view() == std::string(100'000, 'y'));
    REQUIRE(small.view() == std::string(1000, 'y'));
    auto large = whole.slice(0, 600'000).compact();  // most of the buffer: kept as a slice
    REQUIRE(large.data() == whole.data());
    REQUIRE(sluice::bytes::copy_of(std::string_view("abc")).view() == "abc");
}
