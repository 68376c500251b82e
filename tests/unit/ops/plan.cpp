#include <sluice/ops/plan.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>

#include <map>
#include <set>

namespace {
std::vector<std::string> urls(int n) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back("s" + std::to_string(i));
    return v;
}
std::vector<sluice::shard> run_plan(int n, sluice::plan_options o) {
    std::vector<sluice::shard> out;
    for (auto& s : sluice::pipeline(sluice::from(urls(n)) | sluice::plan(o))) out.push_back(s);
    return out;
}
}  // namespace

TEST_CASE("without a seed, every epoch reads in listed order", "[plan]") {
    auto got = run_plan(3, {.epochs = 2});
    REQUIRE(got.size() == 6);
    for (int i = 0; i < 6; ++i) {
        REQUIRE(got[i].url == "s" + std::to_string(i % 3));
        REQUIRE(got[i].epoch == unsigned(i / 3));
        REQUIRE(got[i].index == unsigned(i % 3));
    }
}

TEST_CASE("a seed shuffles each epoch differently, reproducibly", "[plan]") {
    auto a = run_plan(50, {.epochs = 3, .seed = 17});
    auto b = run_plan(50, {.epochs = 3, .seed = 17});
    auto c = run_plan(50, {.epochs = 3, .seed = 18});
    auto names = [](const std::vector<sluice::shard>& v, unsigned e) {
        std::vector<std::string> out;
        for (auto& s : v)
            if (s.epoch == e) out.push_back(s.url);
        return out;
    };
    REQUIRE(names(a, 0) == names(b, 0));
    REQUIRE(names(a, 0) != names(a, 1));
    REQUIRE(names(a, 0) != names(c, 0));
    auto sorted = names(a, 2);
    std::sort(sorted.begin(), sorted.end());
    auto all = urls(50);
    std::sort(all.begin(), all.end());
    REQUIRE(sorted == all);  // a permutation: nothing lost or repeated
}

TEST_CASE("by_shard: rank shares are whole shards, disjoint, covering every shard", "[plan]") {
    std::multiset<std::string> seen;
    for (unsigned r = 0; r < 4; ++r) {
        auto share = run_plan(10, {.seed = 5, .rank = r, .world = 4, .share = sluice::share::by_shard});
        REQUIRE(share.size() == (r < 2 ? 3u : 2u));
        for (auto& s : share) seen.insert(s.url);
    }
    REQUIRE(seen.size() == 10);
    REQUIRE(std::set<std::string>(seen.begin(), seen.end()).size() == 10);
}

TEST_CASE("a rank outside the world is a clear error", "[plan]") {
    sluice::pipeline p(sluice::from(urls(2)) | sluice::plan({.rank = 4, .world = 4}));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("rank 4 is not below world size 4"));
}

namespace {
// Shards s0..s(n-1) holding (37 i + 5) mod 19 records: 5, 4, 3, 2, 1, 0, 18, ... (different sizes, some empty).
std::shared_ptr<sluice::record_counts> uneven_counts(int n) {
    auto c = std::make_shared<sluice::record_counts>();
    for (int i = 0; i < n; ++i) (*c)["s" + std::to_string(i)] = (i * 37 + 5) % 19;
    return c;
}
// Every (shard, record) a plan's shards take.
std::vector<std::pair<std::string, std::uint64_t>> taken(const std::vector<sluice::shard>& shards) {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    for (auto& s : shards)
        for (std::uint64_t i = 0; i < s.records; ++i)
            if (s.takes(i)) out.emplace_back(s.url, i);
    return out;
}
}  // namespace

TEST_CASE("with record counts, ranks take equal, disjoint shares of records that cover the data", "[plan]") {
    auto counts = uneven_counts(13);
    std::uint64_t total = 0;
    for (auto& [k, v] : *counts) total += v;
    for (unsigned world : {1u, 2u, 3u, 4u, 7u}) {
        for (auto share : {sluice::share::drop, sluice::share::pad}) {
            INFO("world " << world << " share " << int(share));
            std::map<std::pair<std::string, std::uint64_t>, int> seen;
            std::vector<std::size_t> sizes;
            for (unsigned r = 0; r < world; ++r) {
                auto got = taken(run_plan(13, {.seed = 8, .rank = r, .world = world, .share = share, .counts = counts}));
                sizes.push_back(got.size());
                for (auto& k : got) ++seen[k];
            }
            REQUIRE(std::set<std::size_t>(sizes.begin(), sizes.end()).size() == 1);  // equal shares
            if (share == sluice::share::drop) {
                REQUIRE(sizes[0] == total / world);
                for (auto& [k, n] : seen) REQUIRE(n == 1);  // disjoint
                REQUIRE(total - seen.size() < world);       // all but the remainder
            } else {
                REQUIRE(sizes[0] == (total + world - 1) / world);
                REQUIRE(seen.size() == total);  // everything, a few twice
                for (auto& [k, n] : seen) REQUIRE(n <= 2);
            }
        }
    }
}

TEST_CASE("the records left out by drop differ from epoch to epoch with a seed", "[plan]") {
    auto counts = uneven_counts(9);
    std::set<std::vector<std::pair<std::string, std::uint64_t>>> shares;
    std::vector<sluice::shard> all = run_plan(9, {.epochs = 4, .seed = 3, .rank = 0, .world = 4, .counts = counts});
    for (std::uint32_t e = 0; e < 4; ++e) {
        std::vector<sluice::shard> epoch;
        for (auto& s : all)
            if (s.epoch == e) epoch.push_back(s);
        shares.insert(taken(epoch));
    }
    REQUIRE(shares.size() > 1);
}

TEST_CASE("world above 1 without record counts is refused unless by_shard is asked for", "[plan]") {
    sluice::pipeline p(sluice::from(urls(4)) | sluice::plan({.rank = 1, .world = 2}));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("needs record counts") && Catch::Contains("by_shard"));
    sluice::pipeline q(sluice::from(urls(4)) |
                       sluice::plan({.rank = 0, .world = 2, .counts = std::make_shared<sluice::record_counts>()}));
    REQUIRE_THROWS_WITH(q.next_blocking(), Catch::Contains("no record count for 's0'"));
}

TEST_CASE("rank and world come from torchrun, mpirun or srun variables, named when wrong", "[plan]") {
    using sluice_test::scoped_env;
    const std::vector<std::string> all{"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "SLURM_PROCID", "SLURM_NTASKS"};
    std::vector<std::pair<std::string, std::optional<std::string>>> none;
    for (auto& v : all) none.emplace_back(v, std::nullopt);
    scoped_env clear(none);
    REQUIRE(sluice::rank_from_env().world == 1);
    {
        scoped_env e({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}});
        auto r = sluice::rank_from_env();
        REQUIRE((r.rank == 3 && r.world == 8 && r.from == "SLURM_PROCID/SLURM_NTASKS"));
        scoped_env t({{"RANK", "1"}, {"WORLD_SIZE", "2"}});  // torchrun's come first
        REQUIRE(sluice::rank_from_env().rank == 1);
    }
    {
        scoped_env e({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
        REQUIRE(sluice::rank_from_env().rank == 2);
        // And plan uses them when rank and world are not set.
        auto share = run_plan(8, {.share = sluice::share::by_shard});
        REQUIRE(share.size() == 2);
        REQUIRE(share[0].url == "s2");
    }
    {
        scoped_env e({{"RANK", "x1"}, {"WORLD_SIZE", "2"}});
        REQUIRE_THROWS_WITH(sluice::rank_from_env(), Catch::Contains("RANK='x1' is not a number"));
    }
    {
        scoped_env e({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
        REQUIRE_THROWS_WITH(sluice::rank_from_env(), Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
    }
    {
        scoped_env e({{"RANK", std::nullopt}, {"WORLD_SIZE", "2"}});
        REQUIRE_THROWS_WITH(sluice::rank_from_env(), Catch::Contains("RANK is not set but WORLD_SIZE is"));
    }
}

TEST_CASE("record counts files are read back as written, and bad lines named", "[plan]") {
    sluice_test::temp_dir d;
    sluice::record_counts c{{"a/shard-0.tar", 10}, {"https://h/b c.tar", 0}};
    sluice::write_record_counts(d / "counts", c);
    REQUIRE(*sluice::read_record_counts(d / "counts") == c);
    d.write("bad", "# comment\n\n12 ok\nseven x\n");
    REQUIRE_THROWS_WITH(sluice::read_record_counts(d / "bad"), Catch::Contains("line 4 is not 'COUNT NAME'") &&
                                                                    Catch::Contains(d / "bad"));
    REQUIRE_THROWS_WITH(sluice::read_record_counts(d / "missing"), Catch::Contains("cannot read the record counts"));
}

TEST_CASE("a replay takes only the positions asked for, across shard boundaries", "[plan]") {
    auto counts = uneven_counts(6);  // 15 records in all
    auto shards = run_plan(6, {.counts = counts});
    std::vector<std::pair<std::string, std::uint64_t>> order = taken(shards);  // position -> record
    sluice::detail::run_state::replay want{0, {1, 4, 9}, 12};
    auto part = sluice::detail::replay_part(shards, want);
    auto got = taken(part);
    std::vector<std::pair<std::string, std::uint64_t>> expected{order[1], order[4], order[9]};
    for (std::size_t p = 12; p < order.size(); ++p) expected.push_back(order[p]);
    REQUIRE(got == expected);
}

TEST_CASE("a replay of a shard taking scattered records keeps their order", "[plan]") {
    sluice::shard t{"s0", 0, 0};
    t.records = 15;
    t.first = 9;
    t.end = 12;
    t.extra = std::make_shared<const std::vector<std::uint64_t>>(std::vector<std::uint64_t>{1, 4, 5});
    const std::vector<std::uint64_t> want{1, 4, 5, 9, 10, 11};
    auto ordinals = [](const std::vector<sluice::shard>& v) {
        std::vector<std::uint64_t> out;
        for (auto& [url, i] : taken(v)) out.push_back(i);
        return out;
    };
    REQUIRE(ordinals({t}) == want);
    // Positions 0..5 are records 1, 4, 5, 9, 10, 11: keep 1 and 3, then all from 4.
    REQUIRE(ordinals(sluice::detail::replay_part({t}, {0, {1, 3}, 4})) == std::vector<std::uint64_t>{4, 9, 10, 11});
    // From inside the extra records: the rest of them, then the whole run.
    REQUIRE(ordinals(sluice::detail::replay_part({t}, {0, {0}, 2})) == std::vector<std::uint64_t>{1, 5, 9, 10, 11});
    REQUIRE(sluice::detail::replay_part({t}, {0, {}, 6}).empty());
}

TEST_CASE("a change of world size shares what no old rank delivered equally, once, among the new ranks", "[plan][resume]") {
    auto counts = uneven_counts(13);
    std::vector<std::uint64_t> c;
    for (auto& u : urls(13)) c.push_back(counts->at(u));
    for (auto share : {sluice::share::drop, sluice::share::pad}) {
        for (unsigned from : {1u, 3u, 4u}) {
            for (unsigned to : {1u, 2u, 3u, 5u}) {
                INFO("share " << int(share) << ", " << from << " -> " << to);
                const sluice::plan_options o{.seed = 3, .share = share};
                sluice::detail::run_state::reshard rs{.epoch = 1, .world = from, .records = 0, .positions = {}, .plan = {}};
                std::vector<sluice::detail::run_state::replay> undelivered;
                std::set<std::pair<std::string, std::uint64_t>> delivered, covered;
                for (unsigned r = 0; r < from; ++r) {
                    std::optional<std::uint64_t> q;
                    auto mine = taken(sluice::detail::plan_epoch(urls(13), &c, o, {r, from, ""}, 1, &q));
                    rs.records = *q;
                    // Old rank r delivered its first 3 r + 2 positions but those in keep.
                    const std::uint64_t upto = std::min<std::uint64_t>(3 * r + 2, *q);
                    std::vector<std::uint64_t> keep;
                    if (upto > 1) keep.push_back(upto / 2);
                    for (std::uint64_t k = 0; k < mine.size(); ++k) {
                        covered.insert(mine[k]);
                        if (k < upto && std::find(keep.begin(), keep.end(), k) == keep.end()) delivered.insert(mine[k]);
                    }
                    rs.positions.push_back(upto - keep.size());
                    undelivered.push_back({1, keep, upto});
                }
                std::multiset<std::pair<std::string, std::uint64_t>> rest;
                std::set<std::uint64_t> sizes;
                for (unsigned r = 0; r < to; ++r) {
                    std::uint64_t n = 0;
                    const auto items = sluice::detail::reshard_epoch(urls(13), c, o, {r, to, ""}, rs, undelivered, n);
                    for (auto& s : items) {  // well formed: a run, and sorted extras below it
                        REQUIRE(s.first < s.end);
                        REQUIRE(s.end <= s.records);
                        if (s.extra) {
                            REQUIRE(std::is_sorted(s.extra->begin(), s.extra->end()));
                            REQUIRE(std::adjacent_find(s.extra->begin(), s.extra->end()) == s.extra->end());
                            REQUIRE(s.extra->back() < s.first);
                        }
                    }
                    auto got = taken(items);
                    REQUIRE(got.size() == n);
                    sizes.insert(n);
                    rest.insert(got.begin(), got.end());
                }
                REQUIRE(sizes.size() == 1);  // equal steps
                const std::uint64_t left = covered.size() - delivered.size();
                std::set<std::pair<std::string, std::uint64_t>> distinct(rest.begin(), rest.end());
                for (auto& k : distinct) {
                    REQUIRE(covered.count(k) == 1);
                    REQUIRE(delivered.count(k) == 0);
                }
                if (share == sluice::share::drop) {
                    REQUIRE(distinct.size() == rest.size());
                    REQUIRE(left - rest.size() < to);
                } else {
                    REQUIRE(distinct.size() == left);
                    REQUIRE(rest.size() - left < to);
                }
            }
        }
    }
    sluice::detail::run_state::reshard wrong{.epoch = 0, .world = 2, .records = 5, .positions = {1, 1}, .plan = {}};
    std::uint64_t n = 0;
    REQUIRE_THROWS_WITH(sluice::detail::reshard_epoch(urls(13), c, {}, {0, 1, ""}, wrong, {{0, {}, 1}, {0, {}, 1}}, n),
                        Catch::Contains("the record counts now give"));
}

TEST_CASE("count_records counts each shard's records, empty shards as 0", "[plan]") {
    auto a = std::make_shared<const sluice::shard>(sluice::shard{"d/a", 0, 0});
    auto b = std::make_shared<const sluice::shard>(sluice::shard{"d/b", 0, 1});
    std::vector<sluice::record> rs;
    for (int i = 0; i < 3; ++i) rs.push_back({sluice::bytes::copy_of("x"), a, std::uint64_t(i), 0});
    rs.push_back({sluice::bytes::copy_of("y"), b, 0, 0});
    auto n = sluice::count_records(sluice::from(std::move(rs)), {"d/a", "d/b", "d/empty"});
    REQUIRE(n == sluice::record_counts{{"d/a", 3}, {"d/b", 1}, {"d/empty", 0}});
}
