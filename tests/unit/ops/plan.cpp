#include <sluice/ops/plan.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>

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

TEST_CASE("rank shares are disjoint and cover every shard", "[plan]") {
    std::multiset<std::string> seen;
    for (unsigned r = 0; r < 4; ++r) {
        auto share = run_plan(10, {.seed = 5, .rank = r, .world = 4});
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
