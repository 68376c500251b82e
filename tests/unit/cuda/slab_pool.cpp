#include <sluice/cuda/slab_pool.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <new>
#include <set>

namespace {
// Counts what the pool asks of the "system".
struct system_memory {
    int allocs = 0, frees = 0;
    std::size_t bytes = 0;
    sluice::slab_pool_options options(std::size_t slab, std::size_t max = 0) {
        return {.what = "test memory",
                .slab_bytes = slab,
                .max_bytes = max,
                .alignment = 256,
                .allocate =
                    [this](std::size_t n) {
                        ++allocs;
                        bytes += n;
                        return static_cast<std::byte*>(::operator new(n, std::align_val_t{256}));
                    },
                .deallocate =
                    [this](std::byte* p, std::size_t n) {
                        ++frees;
                        bytes -= n;
                        ::operator delete(p, std::align_val_t{256});
                    }};
    }
};
}  // namespace

TEST_CASE("a freed buffer serves the next request of its size class", "[slab_pool]") {
    system_memory sys;
    auto pool = sluice::slab_pool::create(sys.options(8u << 20));
    auto a = pool->allocate(1u << 20);
    const std::byte* first = a->data();
    REQUIRE(pool->figures().in_use_bytes == a->capacity());
    a.reset();
    REQUIRE(pool->figures().in_use_bytes == 0);
    auto b = pool->allocate((1u << 20) - 100);  // same class
    REQUIRE(b->data() == first);
    REQUIRE(sys.allocs == 1);
    REQUIRE(pool->figures().allocations == 2);
}

TEST_CASE("buffers are carved from slabs, aligned, without overlap", "[slab_pool]") {
    system_memory sys;
    auto pool = sluice::slab_pool::create(sys.options(32u << 20));
    std::vector<std::shared_ptr<sluice::buffer>> held;
    std::set<const std::byte*> starts;
    for (int i = 0; i < 12; ++i) {
        held.push_back(pool->allocate(1000 + std::size_t(i) * 300'000));
        auto* p = held.back()->data();
        REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
        REQUIRE(held.back()->capacity() >= 1000 + std::size_t(i) * 300'000);
        REQUIRE(pool->owns(p));
        starts.insert(p);
    }
    REQUIRE(starts.size() == held.size());
    // No two buffers overlap.
    std::vector<std::pair<const std::byte*, std::size_t>> spans;
    for (auto& h : held) spans.emplace_back(h->data(), h->capacity());
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) REQUIRE(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
    REQUIRE(sys.allocs == 1);  // all from one 32 MiB slab
}

TEST_CASE("a request larger than a quarter slab gets a slab of its own", "[slab_pool]") {
    system_memory sys;
    auto pool = sluice::slab_pool::create(sys.options(4u << 20));
    auto big = pool->allocate(3u << 20);
    REQUIRE(sys.allocs == 1);
    REQUIRE(pool->figures().reserved_bytes == big->capacity());
    REQUIRE(big->capacity() >= (3u << 20));
    REQUIRE(big->capacity() <= (3u << 20) * 5 / 4);
}

TEST_CASE("the pool's limit gives an error naming the memory and the limit", "[slab_pool]") {
    system_memory sys;
    auto pool = sluice::slab_pool::create(sys.options(1u << 20, 2u << 20));
    auto a = pool->allocate(200'000);
    auto b = pool->allocate(1u << 20);  // a slab of its own needs 1 MiB more: fits
    try {
        auto c = pool->allocate(1u << 20);
        FAIL("the limit was not enforced");
    } catch (const sluice::error& e) {
        const std::string m = e.what();
        REQUIRE(m.find("test memory") != std::string::npos);
        REQUIRE(m.find("limit of 2097152 bytes") != std::string::npos);
    }
    b.reset();  // a freed buffer of the class serves the request within the limit
    REQUIRE_NOTHROW(pool->allocate(1u << 20));
}

TEST_CASE("a failing allocator gives an error naming the size and memory", "[slab_pool]") {
    auto pool = sluice::slab_pool::create({.what = "pinned host memory",
                                           .slab_bytes = 1u << 20,
                                           .allocate = [](std::size_t) -> std::byte* { throw std::bad_alloc(); },
                                           .deallocate = [](std::byte*, std::size_t) {}});
    REQUIRE_THROWS_WITH(pool->allocate(10), Catch::Contains("cannot allocate 1048576 bytes of pinned host memory"));
}

TEST_CASE("slabs go back to the system when the pool and its last buffer are gone", "[slab_pool]") {
    system_memory sys;
    std::shared_ptr<sluice::buffer> kept;
    {
        auto pool = sluice::slab_pool::create(sys.options(1u << 20));
        kept = pool->allocate(1000);
        auto other = pool->allocate(5u << 20);
    }
    REQUIRE(sys.frees == 0);  // `kept` holds the pool
    kept->data()[0] = std::byte{7};
    kept.reset();
    REQUIRE(sys.frees == sys.allocs);
    REQUIRE(sys.bytes == 0);
}
