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

TEST_CASE("an epoch's drain overlaps the next one's fill without changing either order", "[shuffle]") {
    // Epochs shorter and longer than the buffer: the drain of one ends while the next
    // fills (one out per one in), or after the next epoch ended too.
    for (std::size_t per : {30u, 50u, 51u, 120u}) {
        INFO("records per epoch " << per);
        std::vector<sluice::record> out;
        for (auto& r : sluice::pipeline(sluice::from(epoch_records(3, per)) | sluice::shuffle({.buffer = 50, .seed = 4})))
            out.push_back(r);
        REQUIRE(out.size() == 3 * per);
        for (std::uint32_t e = 0; e < 3; ++e) {
            auto only = epoch_records(e + 1, per);
            only.erase(only.begin(), only.begin() + static_cast<std::ptrdiff_t>(e * per));
            std::vector<std::uint64_t> alone, mixed;
            for (auto& r : sluice::pipeline(sluice::from(std::move(only)) | sluice::shuffle({.buffer = 50, .seed = 4})))
                alone.push_back(r.index);
            for (std::size_t i = e * per; i < (e + 1) * per; ++i) {
                REQUIRE(out[i].source->epoch == e);
                mixed.push_back(out[i].index);
            }
            REQUIRE(mixed == alone);
        }
    }
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

// ---- plan's seed feeds a shuffle without one; items that cannot keep epochs apart ----

#include <sluice/ops/batch.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/plan.hpp>

namespace {
// A decoder stand-in: each shard holds `per_shard` records, and only those the shard
// takes are sent (as real decoders do on resume).
sluice::task<void> make_records(sluice::stage_context<sluice::shard, sluice::record>& ctx, std::uint64_t per_shard) {
    while (auto s = co_await ctx.in.next()) {
        auto src = std::make_shared<const sluice::shard>(std::move(*s));
        for (std::uint64_t i = 0; i < per_shard; ++i) {
            if (!src->takes(i)) continue;
            sluice::record r{sluice::bytes::copy_of(src->url + "#" + std::to_string(i)), src, i, 0};
            co_await ctx.out.send(std::move(r));
        }
    }
}
sluice::stage<sluice::shard, sluice::record> decoder(std::uint64_t per_shard) {
    return sluice::make_stage<sluice::shard, sluice::record>(
        "decode", {}, [per_shard](sluice::stage_context<sluice::shard, sluice::record>& ctx) {
            return make_records(ctx, per_shard);
        });
}
std::vector<std::string> shard_names(int n) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back("s" + std::to_string(i));
    return v;
}
std::vector<std::string> keys_of(sluice::pipeline<sluice::host_batch>& p, std::size_t max_batches = ~std::size_t{0}) {
    std::vector<std::string> out;
    for (std::size_t n = 0; n < max_batches; ++n) {
        auto b = p.next_blocking();
        if (!b) break;
        for (std::size_t i = 0; i < b->size(); ++i) out.push_back(b->key(i));
    }
    return out;
}
sluice::source<sluice::host_batch> seeded(sluice::plan_options po, sluice::shuffle_options so,
                                          std::uint64_t per_shard = 30) {
    return sluice::from(shard_names(5)) | sluice::plan(po) | decoder(per_shard) | sluice::shuffle(so) |
           sluice::batch({.size = 7});
}
}  // namespace

TEST_CASE("a shuffle without a seed of its own takes plan's: one seed, given once", "[shuffle][plan]") {
    const sluice::plan_options po{.epochs = 2, .seed = 17, .rank = 0, .world = 1};
    auto keys = [](sluice::source<sluice::host_batch> src) {
        sluice::pipeline p(std::move(src));
        return keys_of(p);
    };
    const auto from_plan = keys(seeded(po, {.buffer = 40}));
    REQUIRE(from_plan.size() == 300);
    REQUIRE(from_plan == keys(seeded(po, {.buffer = 40, .seed = 17})));  // the same as naming it
    REQUIRE(from_plan != keys(seeded(po, {.buffer = 40, .seed = 0})));   // which it did not do before
    REQUIRE(from_plan != keys(seeded({.epochs = 2, .seed = 18, .rank = 0, .world = 1}, {.buffer = 40})));
    // Its own seed wins over plan's.
    REQUIRE(keys(seeded(po, {.buffer = 40, .seed = 3})) ==
            keys(seeded({.epochs = 2, .seed = 17, .rank = 0, .world = 1}, {.buffer = 40, .seed = 3})));
    // A plan without a seed, or no plan: 0, as before.
    REQUIRE(keys(seeded({.epochs = 2, .rank = 0, .world = 1}, {.buffer = 40})) ==
            keys(seeded({.epochs = 2, .rank = 0, .world = 1}, {.buffer = 40, .seed = 0})));
    REQUIRE(shuffled(500, {.buffer = 50}) == shuffled(500, {.buffer = 50, .seed = 0}));
    // The state names where the seed came from; plan's note holds the seed itself.
    sluice::pipeline p(seeded(po, {.buffer = 40}));
    REQUIRE(p.next_blocking());
    const auto state = p.state();
    REQUIRE(state.find("note shuffle buffer=40 max_bytes=0 seed=plan\n") != std::string::npos);
    REQUIRE(state.find("note plan seed=17 ") != std::string::npos);
}

TEST_CASE("a shuffle seeded by plan resumes exactly, with and without record counts", "[shuffle][plan]") {
    auto counts = std::make_shared<sluice::record_counts>();
    for (auto& n : shard_names(5)) (*counts)[n] = 30;
    for (bool with_counts : {true, false}) {
        for (std::size_t cut : {1u, 9u, 21u, 22u, 30u}) {
            INFO("counts " << with_counts << ", cut after batch " << cut);
            const sluice::plan_options po{
                .epochs = 2, .seed = 5, .rank = 0, .world = 1, .counts = with_counts ? counts : nullptr};
            sluice::pipeline whole(seeded(po, {.buffer = 25}));
            const auto all = keys_of(whole);
            sluice::pipeline first(seeded(po, {.buffer = 25}));
            auto got = keys_of(first, cut);
            const auto state = first.state();
            first.stop();
            sluice::pipeline rest(seeded(po, {.buffer = 25}), {.resume = state});
            for (auto& k : keys_of(rest)) got.push_back(k);
            REQUIRE(got == all);
            // Another plan seed is another sequence: the state refuses it.
            sluice::pipeline other(seeded({.epochs = 2, .seed = 6, .rank = 0, .world = 1, .counts = po.counts},
                                          {.buffer = 25}),
                                   {.resume = state});
            REQUIRE_THROWS_WITH(other.next_blocking(), Catch::Contains("seed=5") && Catch::Contains("seed=6"));
        }
    }
}

// A user's item types: one that says its epoch, one that does not.
struct shuffle_test_with_source {
    std::shared_ptr<const sluice::shard> source;
    std::uint64_t index = 0;
};
struct shuffle_test_no_source {
    std::uint64_t index = 0;
};

TEST_CASE("items that cannot say their epoch are refused at start when plan runs several", "[shuffle][plan]") {
    auto src = [](unsigned epochs) {
        return sluice::from(shard_names(3)) | sluice::plan({.epochs = epochs, .seed = 1, .rank = 0, .world = 1}) |
               decoder(10) | sluice::map([](sluice::record r) { return shuffle_test_no_source{r.index}; });
    };
    auto count = [](auto src) {
        std::size_t n = 0;
        for (auto& x : sluice::pipeline(std::move(src))) (void)x, ++n;
        return n;
    };
    // Shuffle: the start fails, naming the stage, the type and both ways out.
    sluice::pipeline p(src(2) | sluice::shuffle({.buffer = 4}));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("shuffle: plan runs 2 epochs") &&
                                               Catch::Contains("shuffle_test_no_source") &&
                                               Catch::Contains("std::shared_ptr<const sluice::shard> source") &&
                                               Catch::Contains(".epochs = sluice::epoch_policy::ignore"));
    // Batch (with a collate of the user's type) too.
    auto size = [](std::vector<shuffle_test_no_source>& v) { return v.size(); };
    sluice::pipeline q(src(3) | sluice::batch({.size = 4}, size));
    REQUIRE_THROWS_WITH(q.next_blocking(), Catch::Contains("batch: plan runs 3 epochs") &&
                                               Catch::Contains("shuffle_test_no_source"));
    // Explicitly one stream: runs, epochs mixing; state() still says it cannot save a position.
    REQUIRE(count(src(2) | sluice::shuffle({.buffer = 4, .epochs = sluice::epoch_policy::ignore})) == 60);
    sluice::pipeline r(src(2) | sluice::batch({.size = 4, .epochs = sluice::epoch_policy::ignore}, size));
    std::size_t n = 0;
    while (auto b = r.next_blocking()) n += *b;
    REQUIRE(n == 60);
    REQUIRE_THROWS_WITH(r.state(), Catch::Contains("do not say which epoch"));
    // One epoch cannot mix: no error.
    REQUIRE(count(src(1) | sluice::shuffle({.buffer = 4}) | sluice::batch({.size = 4}, size)) == 8);
    // A type that carries its source is fine with any number of epochs.
    auto tagged = sluice::from(shard_names(3)) | sluice::plan({.epochs = 2, .seed = 1, .rank = 0, .world = 1}) |
                  decoder(10) | sluice::map([](sluice::record r) { return shuffle_test_with_source{r.source, r.index}; }) |
                  sluice::shuffle({.buffer = 4});
    std::vector<std::uint32_t> epochs;
    for (auto& x : sluice::pipeline(std::move(tagged))) epochs.push_back(x.source->epoch);
    REQUIRE(epochs.size() == 60);
    REQUIRE(std::is_sorted(epochs.begin(), epochs.end()));  // never mixed
}
