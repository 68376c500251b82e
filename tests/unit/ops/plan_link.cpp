#include <sluice/ops/plan_link.hpp>

#include <catch2/catch.hpp>

#include <sluice/core/runtime.hpp>

TEST_CASE("plan's facts reach the listeners of its run once, and only that run's", "[plan]") {
    sluice::runtime rt({.cpu_threads = 1});
    sluice::detail::run_state run, other;
    sluice::stage_setup s{rt}, t{rt};
    s.internal.run = &run;
    t.internal.run = &other;
    int calls = 0;
    std::optional<std::uint64_t> seen;
    sluice::detail::listen_for_plan(s, [&](const sluice::detail::plan_facts& f, sluice::detail::run_state&) {
        ++calls;
        seen = f.seed;
    });
    sluice::detail::tell_plan(t, {.seed = 5, .epochs = 2});  // another run: not ours
    REQUIRE(calls == 0);
    sluice::detail::tell_plan(s, {.seed = 17, .epochs = 2});
    REQUIRE(calls == 1);
    REQUIRE(seen == 17u);
    sluice::detail::tell_plan(s, {.seed = 18, .epochs = 2});  // told once, then forgotten
    REQUIRE(calls == 1);
    REQUIRE(sluice::detail::type_name<int>() == "int");
}
