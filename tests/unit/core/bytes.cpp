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

TEST_CASE("freed buffers return to the pool and are handed out again", "[bytes]") {
    auto pool = sluice::buffer_pool::create(1 << 20);
    const std::byte* first = nullptr;
    {
        auto b = pool->allocate(4096);
        first = b->data();
    }
    REQUIRE(pool->cached_bytes() == 4096);
    auto again = pool->allocate(3000);  // within [capacity/2, capacity]: reused
    REQUIRE(again->data() == first);
    REQUIRE(pool->cached_bytes() == 0);
    auto small = pool->allocate(100);  // far smaller: a new buffer, the big one not wasted
    REQUIRE(small->capacity() == 100);
}

TEST_CASE("the pool caches at most its budget, and buffers may outlive it", "[bytes]") {
    std::shared_ptr<sluice::buffer> keep;
    {
        auto pool = sluice::buffer_pool::create(5000);
        auto a = pool->allocate(4000);
        auto b = pool->allocate(4000);
        keep = pool->allocate(10);
        a.reset();
        b.reset();
        REQUIRE(pool->cached_bytes() == 4000);
    }
    keep.reset();  // the pool is gone: freed normally (ASan checks)
}

TEST_CASE("compact copies a small slice out of a large buffer", "[bytes]") {
    auto big = std::make_shared<sluice::buffer>(1 << 20);
    std::memset(big->data(), 'y', 1 << 20);
    sluice::bytes whole(big, 1 << 20);
    auto small = whole.slice(100, 1000).compact();
    REQUIRE(small.owner_capacity() == 1000);
    REQUIRE(small.view() == std::string(1000, 'y'));
    auto large = whole.slice(0, 600'000).compact();  // most of the buffer: kept as a slice
    REQUIRE(large.data() == whole.data());
    REQUIRE(sluice::bytes::copy_of(std::string_view("abc")).view() == "abc");
}
