#include <sluice/ops/shuffle.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/core/record.hpp>
#include <sluice/ops/from.hpp>

namespace {
std::vector<int> shuffled(int n, sluice::shuffle_options o) {
    std::vector<int> in(n);
    for (int i = 0; i < n; ++i) in[i] = i;
    std::vector<int> out;
    for (int x : sluice::pipeline(sluice::from(in) | sluice::shuffle(o))) out.push_back(x);
    return out;
}
}  // namespace

TEST_CASE("shuffle is a seeded permutation", "[shuffle]") {
    auto a = shuffled(1000, {.buffer = 100, .seed = 3});
    REQUIRE(a == shuffled(1000, {.buffer = 100, .seed = 3}));
    REQUIRE(a != shuffled(1000, {.buffer = 100, .seed = 4}));
    auto sorted = a;
    std::sort(sorted.begin(), sorted.end());
    REQUIRE(sorted == shuffled(1000, {.buffer = 0}));  // buffer 0: passes through in order
    auto in_order = shuffled(1000, {.buffer = 0});
    for (int i = 0; i < 1000; ++i) REQUIRE(in_order[i] == i);
}

TEST_CASE("an item moves at most as far ahead as the buffer allows", "[shuffle]") {
    auto a = shuffled(2000, {.buffer = 10, .seed = 1});
    int displaced = 0;
    for (int i = 0; i < 2000; ++i) {
        REQUIRE(a[i] <= i + 10);  // it cannot leave before it arrived
        displaced += a[i] != i;
    }
    REQUIRE(displaced > 1000);
}

TEST_CASE("shuffled records are copied out of their chunk so the chunk can go", "[shuffle]") {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", 0, 0});
    auto chunk = sluice::bytes::copy_of(std::string(1 << 16, 'r'));
    std::vector<sluice::record> rs;
    for (int i = 0; i < 4; ++i) rs.push_back({chunk.slice(i * 100, 100), s, std::uint64_t(i), 0});
    std::vector<sluice::record> out;
    for (auto& r : sluice::pipeline(sluice::from(std::move(rs)) | sluice::shuffle({.buffer = 2})))
        out.push_back(r);
    REQUIRE(out.size() == 4);
    for (auto& r : out) REQUIRE(r.data.owner_capacity() == 100);
    REQUIRE(chunk.owner_use_count() == 1);  // only ours is left
}

TEST_CASE("a byte limit bounds what the buffer holds", "[shuffle]") {
    std::vector<std::string> in;
    for (int i = 0; i < 100; ++i) in.push_back(std::string(100, char('a' + i % 26)));
    std::size_t max_seen = 0;
    auto probe = sluice::make_stage<std::string, std::string>(
        "probe", {}, [&](sluice::stage_context<std::string, std::string>& ctx) -> sluice::task<void> {
            std::size_t taken = 0;
            while (auto s = co_await ctx.in.next()) {
                ++taken;
                co_await ctx.out.send(std::move(*s));
            }
            max_seen = taken;
        });
    std::vector<std::string> out;
    for (auto& s : sluice::pipeline(sluice::from(in) | sluice::shuffle({.buffer = 1000, .max_bytes = 500, .seed = 2}) | probe))
        out.push_back(s);
    REQUIRE(out.size() == 100);
    REQUIRE(max_seen == 100);
}
