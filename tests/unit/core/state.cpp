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

TEST_CASE("the states of every rank merge into one a world of another size resumes from", "[state][ranks]") {
    auto saved = [](unsigned rank, std::uint64_t position, std::uint32_t epoch = 2, std::string seed = "1") {
        sluice::detail::run_state s;
        s.note("plan", "seed=" + seed + " rank=" + std::to_string(rank) + " world=3 share=0");
        s.note("batch", "size=8 drop_last=0");
        s.set_epoch_records(epoch, 500);
        return s.serialize({epoch, position});
    };
    const auto merged = sluice::merge_states({saved(2, 24), saved(0, 16), saved(1, 24)});
    REQUIRE(merged.find("reshard 2 3 500 16 24 24\n") != std::string::npos);  // by rank, whatever the order given
    REQUIRE(merged.find("reshard_plan seed=1 share=0\n") != std::string::npos);
    REQUIRE(merged.find("note plan") == std::string::npos);  // the ranks' plans differ: kept less rank and world
    sluice::detail::run_state m(merged);
    REQUIRE(m.resume()->epoch == 2);
    REQUIRE(m.resume()->position == 0);
    REQUIRE(m.resharded());
    REQUIRE(m.resharded()->positions == std::vector<std::uint64_t>{16, 24, 24});
    REQUIRE(m.resharded()->records == 500);
    REQUIRE_FALSE(m.saved_note("plan"));
    // A state saved in that epoch carries the reshard on; one saved after it does not.
    m.note("plan", "seed=1 rank=0 world=2 share=0", /*late=*/true);
    m.set_epoch_records(2, 700);
    sluice::detail::run_state again(m.serialize({2, 40}));
    REQUIRE(again.resharded());
    REQUIRE(again.saved_note("plan"));
    REQUIRE(again.epoch_records(2) == 700u);
    REQUIRE(sluice::detail::run_state(m.serialize({3, 8})).resharded() == std::nullopt);

    REQUIRE_THROWS_WITH(sluice::merge_states({}), Catch::Contains("no states given"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 8)}),
                        Catch::Contains("was saved by rank 0 of 3, but 2 states were given"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 8), saved(1, 8)}),
                        Catch::Contains("rank 1 is given twice (states 1 and 2)"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 8, 3), saved(2, 8)}),
                        Catch::Contains("different epochs (state 1: epoch 3, state 0: epoch 2)"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 8), saved(2, 8, 2, "5")}),
                        Catch::Contains("state 2 was made with plan seed=5 share=0, state 0 with plan seed=1 share=0"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), "hello", saved(2, 8)}), Catch::Contains("merge_states: state 1: not a sluice state"));
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 501), saved(2, 8)}),
                        Catch::Contains("state 1's position 501 is past the 500 records"));
    const std::string of_two = "sluice-state 1\nepoch 2\nposition 8\nepoch_records 500\nnote plan seed=1 rank=1 world=2 share=0\n";
    REQUIRE_THROWS_WITH(sluice::merge_states({saved(0, 8), saved(1, 8), of_two}),
                        Catch::Contains("state 2 was saved in a world of 2 ranks, the states before it in one of 3"));
    // Nothing delivered yet: a plain state once the new rank saves.
    sluice::detail::run_state fresh(sluice::merge_states({saved(0, 0), saved(1, 0), saved(2, 0)}));
    REQUIRE(fresh.resharded());
    fresh.note("plan", "seed=1 rank=0 world=2 share=0", /*late=*/true);
    REQUIRE(fresh.serialize({2, 8}).find("reshard") == std::string::npos);
    REQUIRE_THROWS_WITH(sluice::merge_states({merged, merged, merged}), Catch::Contains("which a change of world size resumed into"));
    const std::string no_plan = "sluice-state 1\nepoch 0\nposition 8\nnote batch size=8 drop_last=0\n";
    REQUIRE_THROWS_WITH(sluice::merge_states({no_plan}), Catch::Contains("state 0 has no plan"));
    const std::string no_counts = "sluice-state 1\nepoch 0\nposition 8\nnote plan seed=1 rank=0 world=1 share=0\n";
    REQUIRE_THROWS_WITH(sluice::merge_states({no_counts}), Catch::Contains("saved without record counts"));
    const std::string by_shard = "sluice-state 1\nepoch 0\nposition 0\nnote plan seed=1 rank=0 world=1 share=2\n";
    REQUIRE_THROWS_WITH(sluice::merge_states({by_shard}), Catch::Contains("share::by_shard"));
    REQUIRE_THROWS_WITH(sluice::detail::run_state("sluice-state 1\nepoch 1\nposition 0\nreshard 1 2 10 4\n"),
                        Catch::Contains("is not 'reshard EPOCH WORLD RECORDS' and a position for each rank"));
}
