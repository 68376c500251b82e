#include <sluice/core/stats.hpp>

#include "support/test_support.hpp"

TEST_CASE("utilization is the share of time spent working", "[stats]") {
    sluice::stage_stats s("decode", 2, true);
    for (int i = 0; i < 2; ++i) {
        auto& w = s.worker(i);
        w.start_ns = 1'000'000'000;
        w.end_ns = 2'000'000'000;  // 1 s each
        w.wait_in_ns = 250'000'000;
        w.wait_out_ns = 250'000'000;
        w.items_out = 10;
        w.bytes_out = 1000;
    }
    s.counter("skipped") += 3;
    auto f = sluice::snapshot(s, 3'000'000'000);
    REQUIRE(f.items_out == 20);
    REQUIRE(f.bytes_out == 2000);
    REQUIRE(f.busy_s == Approx(1.0));
    REQUIRE(f.wait_input_s == Approx(0.5));
    REQUIRE(f.utilization() == Approx(0.5));
    REQUIRE(f.counters == std::vector<std::pair<std::string, std::uint64_t>>{{"skipped", 3}});
}

TEST_CASE("the bottleneck is the busiest stage, records come from the decoder", "[stats]") {
    sluice::pipeline_figures p;
    p.seconds = 2;
    sluice::stage_figures read{.name = "read", .items_out = 5, .bytes_out = 500, .busy_s = 0.2, .wait_output_s = 1.8, .counters = {}, .notes = {}};
    sluice::stage_figures decode{.name = "lines", .items_out = 100, .bytes_out = 400, .busy_s = 1.9, .wait_input_s = 0.1,
                                 .counts_records = true, .counters = {}, .notes = {}};
    sluice::stage_figures consumer{.name = "consumer", .items_in = 4, .busy_s = 0.1, .wait_input_s = 1.9, .counters = {}, .notes = {}};
    p.stages = {read, decode, consumer};
    REQUIRE(p.bottleneck() == "lines");
    REQUIRE(p.records_and_bytes() == std::pair<std::uint64_t, std::uint64_t>{100, 400});
    REQUIRE(p.progress_line().find("50 records/s") != std::string::npos);
    REQUIRE(p.table().find("bottleneck: lines") != std::string::npos);
}

TEST_CASE("JSON output escapes strings and writes every stage", "[stats]") {
    sluice::pipeline_figures p;
    p.stages.push_back({.name = "a\"b\\c\n", .items_in = 1, .counters = {}, .notes = {}});
    const auto j = p.json();
    REQUIRE(j.find(R"("name":"a\"b\\c\n")") != std::string::npos);
    REQUIRE(j.find(R"("items_in":1)") != std::string::npos);
    REQUIRE(j.front() == '{');
    REQUIRE(j.back() == '}');
}
