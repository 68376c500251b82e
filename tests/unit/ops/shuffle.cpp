#include <sluice/ops/shuffle.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/core/record.hpp>
#include <sluice/ops/from.hpp>

#include <set>

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

namespace {
std::vector<sluice::record> epoch_records(std::uint32_t epochs, int per_epoch) {
    std::vector<sluice::record> rs;
    for (std::uint32_t e = 0; e < epochs; ++e) {
        auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", e, 0});
        for (int i = 0; i < per_epoch; ++i) rs.push_back({sluice::bytes::copy_of(std::to_string(i)), s, std::uint64_t(i), 0});
    }
    return rs;
}
}  // namespace

TEST_CASE("each epoch is shuffled on its own and never mixes with the next", "[shuffle]") {
    std::vector<sluice::record> out;
    for (auto& r : sluice::pipeline(sluice::from(epoch_records(3, 200)) | sluice::shuffle({.buffer = 50, .seed = 9})))
        out.push_back(r);
    REQUIRE(out.size() == 600);
    std::vector<std::vector<std::uint64_t>> orders(3);
    for (std::size_t i = 0; i < out.size(); ++i) {
        REQUIRE(out[i].source->epoch == i / 200);
        orders[i / 200].push_back(out[i].index);
    }
    REQUIRE(orders[0] != orders[1]);
    // An epoch's order depends on (seed, epoch) only: epoch 1 alone comes out the same.
    auto only1 = epoch_records(2, 200);
    only1.erase(only1.begin(), only1.begin() + 200);
    std::vector<std::uint64_t> alone;
    for (auto& r : sluice::pipeline(sluice::from(std::move(only1)) | sluice::shuffle({.buffer = 50, .seed = 9})))
        alone.push_back(r.index);
    REQUIRE(alone == orders[1]);
}

TEST_CASE("replaying the shuffle's choices finds exactly what it held at any position", "[shuffle]") {
    const sluice::shuffle_options o{.buffer = 40, .seed = 5};
    std::vector<std::uint64_t> live;
    for (auto& r : sluice::pipeline(sluice::from(epoch_records(1, 300)) | sluice::shuffle(o))) live.push_back(r.index);
    for (std::uint64_t at : {0, 1, 39, 100, 259, 260, 261, 299, 300}) {
        INFO("position " << at);
        auto st = sluice::detail::replay_shuffle(o, {0, at}, 300);
        REQUIRE(st);
        // Sent so far: positions below next_in not held; held: what comes next, in some order.
        std::set<std::uint64_t> sent(live.begin(), live.begin() + at);
        std::set<std::uint64_t> held(st->slots.begin(), st->slots.end());
        for (std::uint64_t p = 0; p < st->next_in; ++p) REQUIRE((sent.count(p) + held.count(p)) == 1);
        REQUIRE(sent.size() + held.size() == st->next_in);
        if (st->drained) REQUIRE(std::vector<std::uint64_t>(live.begin() + at, live.end()) == st->slots);
    }
    // Past the epoch's end, or without the epoch's size (it cannot tell whether the
    // position lies in the final drain), it says it cannot.
    REQUIRE_FALSE(sluice::detail::replay_shuffle(o, {0, 290}, 280));
    REQUIRE_FALSE(sluice::detail::replay_shuffle(o, {0, 10}, std::nullopt));
    REQUIRE_FALSE(sluice::detail::replay_shuffle(o, {0, 295}, std::nullopt));
}

TEST_CASE("a late record of an epoch already drained passes on, not lost and not restarting that epoch", "[shuffle]") {
    auto rs = epoch_records(2, 100);
    // Move epoch 0's last 10 records after epoch 1's first 50 (as an unordered fetch may).
    std::vector<sluice::record> in(rs.begin(), rs.begin() + 90);
    in.insert(in.end(), rs.begin() + 100, rs.begin() + 150);
    in.insert(in.end(), rs.begin() + 90, rs.begin() + 100);
    in.insert(in.end(), rs.begin() + 150, rs.end());
    std::multiset<std::pair<std::uint32_t, std::uint64_t>> got;
    for (auto& r : sluice::pipeline(sluice::from(std::move(in)) | sluice::shuffle({.buffer = 20, .seed = 1})))
        got.insert({r.source->epoch, r.index});
    REQUIRE(got.size() == 200);
    REQUIRE(std::set<std::pair<std::uint32_t, std::uint64_t>>(got.begin(), got.end()).size() == 200);
}
