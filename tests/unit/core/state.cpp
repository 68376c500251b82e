#include <sluice/core/state.hpp>

#include "support/test_support.hpp"

TEST_CASE("a state is written as a few lines and read back", "[state]") {
    sluice::detail::run_state a;
    a.note("plan", "seed=1 rank=0 world=2");
    a.note("batch", "size=8 drop_last=0");
    a.set_epoch_records(3, 1000);
    const auto blob = a.serialize({3, 256});
    REQUIRE(blob.starts_with("sluice-state 1\n"));
    REQUIRE(blob.size() < 200);
    sluice::detail::run_state b(blob);
    REQUIRE(b.resume());
    REQUIRE(b.resume()->epoch == 3);
    REQUIRE(b.resume()->position == 256);
    REQUIRE(b.epoch_records(3) == 1000u);
    REQUIRE_FALSE(b.epoch_records(4));
    b.note("plan", "seed=1 rank=0 world=2");  // the same: fine
    REQUIRE_THROWS_WITH(b.note("batch", "size=16 drop_last=0"),
                        Catch::Contains("saved state was made with batch size=8 drop_last=0, this pipeline has batch size=16"));
    REQUIRE(b.serialize({3, 300}).find("note plan seed=1 rank=0 world=2") != std::string::npos);
}

TEST_CASE("a stage added or removed since the state was saved is named", "[state]") {
    const std::string saved = "sluice-state 1\nepoch 0\nposition 8\nnote batch size=8 drop_last=0\nnote shuffle buffer=10\n"
                              "note data 3 shards 0123\n";
    sluice::detail::run_state added(saved);
    added.note("batch", "size=8 drop_last=0");
    REQUIRE_THROWS_WITH(added.note("map", "x"), Catch::Contains("the saved state was made without map"));
    sluice::detail::run_state removed(saved);
    removed.note("batch", "size=8 drop_last=0");
    REQUIRE_THROWS_WITH(removed.check_noted(), Catch::Contains("made with shuffle buffer=10, this pipeline has no shuffle"));
    removed.note("shuffle", "buffer=10");
    removed.check_noted();  // "data" is noted later, by plan's worker
}

TEST_CASE("a malformed state is a clear error", "[state]") {
    REQUIRE_THROWS_WITH(sluice::detail::run_state("hello"), Catch::Contains("not a sluice state"));
    REQUIRE_THROWS_WITH(sluice::detail::run_state("sluice-state 1\nepoch 1\n"), Catch::Contains("no epoch or position"));
    REQUIRE_THROWS_WITH(sluice::detail::run_state("sluice-state 1\nepoch x\nposition 1\n"),
                        Catch::Contains("bad number in the state's line 'epoch x'"));
    REQUIRE_THROWS_WITH(sluice::detail::run_state("sluice-state 1\nepoch 1\nposition -1\n"), Catch::Contains("bad number"));
    REQUIRE_THROWS_WITH(sluice::detail::run_state("sluice-state 1\nepoch 1\nposition 1\nwhat 2\n"),
                        Catch::Contains("unknown line in the state: 'what 2'"));
}

TEST_CASE("a replay request stands until a stage says the epoch must be read again", "[state]") {
    sluice::detail::run_state s("sluice-state 1\nepoch 0\nposition 10\n");
    s.request({0, {}, 10});
    REQUIRE(s.requested());
    REQUIRE(s.requested()->from == 10);
    s.request_full_replay();
    REQUIRE_FALSE(s.requested());
    REQUIRE_FALSE(s.served());
    s.serve();
    REQUIRE(s.served());
}
