// The figures exported for people and scrapers (issue 19): Prometheus text in a file and
// on a loopback port, and a Chrome trace of a run. Both are read back by independent
// readers (prometheus_client's parser, Python's json) in tests/support/read_metrics.py.
#include <sluice/core/pipeline.hpp>

#include "support/servers.hpp"
#include "support/test_support.hpp"

#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>

#include <cmath>
#include <map>
#include <regex>
#include <thread>

using sluice_test::run;
using sluice_test::temp_dir;

namespace {

// "" when the readers can run here, else why not.
std::string readers_unavailable() {
    if (run({"/usr/bin/python3", "-c", "import prometheus_client"}).status != 0)
        return "Debian's python3-prometheus-client is missing (scripts/deps.sh --test installs it)";
    return {};
}
#define SLUICE_SKIP_WITHOUT_READERS()                         \
    if (auto why = readers_unavailable(); !why.empty()) {     \
        WARN("[test skipped] " << why);                       \
        return;                                               \
    }

struct sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value;
};

// The samples of a Prometheus text, as prometheus_client's parser reads them.
std::vector<sample> read_prometheus(const std::string& where) {
    auto r = run({"/usr/bin/python3", SLUICE_READ_METRICS, "prom", where});
    INFO(r.err);
    REQUIRE(r.status == 0);
    std::vector<sample> out;
    // [["name", {"k": "v", ...}, value], ...] — values and label texts have no ']' here.
    const std::regex one(R"re(\["([a-z_]+)",\{([^}]*)\},([-0-9.e+]+)\])re");
    const std::regex kv(R"re("([a-z_]+)":"((?:[^"\\]|\\.)*)")re");
    auto unescape = [](const std::string& e) {  // JSON's \" and \\ (all a label here holds)
        std::string u;
        for (std::size_t i = 0; i < e.size(); ++i) u += e[i] == '\\' && i + 1 < e.size() ? e[++i] : e[i];
        return u;
    };
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), one), end; it != end; ++it) {
        sample s{(*it)[1].str(), {}, std::stod((*it)[3].str())};
        const std::string labels = (*it)[2].str();
        for (std::sregex_iterator k(labels.begin(), labels.end(), kv); k != end; ++k) s.labels[(*k)[1].str()] = unescape((*k)[2].str());
        out.push_back(std::move(s));
    }
    REQUIRE_FALSE(out.empty());
    return out;
}

const sample* find(const std::vector<sample>& ss, const std::string& name, const std::string& stage = {}) {
    for (auto& s : ss)
        if (s.name == name && (stage.empty() || (s.labels.count("stage") && s.labels.at("stage") == stage))) return &s;
    return nullptr;
}

std::string http_get(int port, const std::string& path) {
    auto r = run({"/usr/bin/env", "curl", "-s", "-i", "--max-time", "10", "http://127.0.0.1:" + std::to_string(port) + path});
    return r.out;
}

}  // namespace

TEST_CASE("the live figures are Prometheus text in a file and on a loopback port, read back by prometheus_client",
          "[metrics]") {
    SLUICE_SKIP_WITHOUT_READERS();
    temp_dir d;
    const std::string file = d / "sluice.prom";
    std::vector<int> v(200, 1);
    auto slow = sluice::map([](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // far above the consumer's own time
        return x;
    }, {.name = "slow \"map\""});  // a name that needs escaping in a label value
    sluice::pipeline p(sluice::from(v) | slow,
                       {.metrics = {.file = file, .port = 0, .interval = std::chrono::milliseconds(100)}});
    const int port = p.metrics_port();
    REQUIRE(port > 0);
    int taken = 0;
    std::vector<sample> live_file, live_port;
    std::string reply;
    for (int x : p) {
        taken += x;
        if (taken == 100) {  // halfway: both exports are live
            std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the file is rewritten every 100 ms
            live_file = read_prometheus(file);
            live_port = read_prometheus("http://127.0.0.1:" + std::to_string(port) + "/metrics");
            reply = http_get(port, "/nothing");
        }
    }
    REQUIRE(taken == 200);
    INFO(reply);
    CHECK(reply.starts_with("HTTP/1.1 404"));
    for (auto* live : {&live_file, &live_port}) {
        auto* recs = find(*live, "sluice_stage_items_out_total", "slow \"map\"");
        REQUIRE(recs);
        CHECK(recs->labels.at("index") == "1");
        CHECK(recs->value >= 75);  // about halfway (what the map gave runs ahead of what was taken)
        CHECK(recs->value < 200);
        REQUIRE(find(*live, "sluice_seconds"));
        CHECK(find(*live, "sluice_seconds")->value > 0.3);
        REQUIRE(find(*live, "sluice_bottleneck"));
    }
    p.stop();
    REQUIRE_FALSE(sluice_test::accepts(port));  // the port closes with the pipeline
    // The file's last writing holds the final figures, the same as figures().
    const auto fin = read_prometheus(file);
    const auto f = p.figures();
    auto* out = find(fin, "sluice_stage_items_out_total", "slow \"map\"");
    REQUIRE(out);
    CHECK(out->value == 200);
    auto* busy = find(fin, "sluice_stage_busy_seconds_total", "slow \"map\"");
    REQUIRE(busy);
    CHECK(busy->value == Approx(f.stages[1].busy_s).epsilon(1e-6));
    auto* bottleneck = find(fin, "sluice_bottleneck");
    REQUIRE(bottleneck);
    CHECK(bottleneck->labels.at("stage") == f.bottleneck());
    CHECK(bottleneck->labels.at("stage") == "slow \"map\"");
    auto* waited = find(fin, "sluice_consumer_wait_ratio");
    REQUIRE(waited);
    CHECK(waited->value == Approx(f.consumer_wait_share()).margin(1e-6));
    CHECK(waited->value > 0.5);  // the consumer waited on the slow map most of the time
    CHECK(f.held_back_by() == "slow \"map\"");
    CHECK(f.table().find("the consumer waited") != std::string::npos);
    CHECK(f.json().find("\"held_back_by\":\"slow \\\"map\\\"\"") != std::string::npos);
    REQUIRE_FALSE(std::filesystem::exists(file + ".tmp"));
}

TEST_CASE("metrics that cannot be exported fail the start, naming the file or the port", "[metrics]") {
    temp_dir d;
    std::vector<int> v(10, 1);
    {
        sluice::pipeline p(sluice::from(v), {.metrics = {.file = d / "no-such-dir/m.prom"}});
        REQUIRE_THROWS_WITH(p.start(), Catch::Contains("metrics file") && Catch::Contains("no-such-dir/m.prom.tmp") &&
                                           Catch::Contains("No such file or directory"));
    }
    {
        sluice_test::silent_listener busy;  // a port already taken
        sluice::pipeline p(sluice::from(v), {.metrics = {.port = busy.port()}});
        REQUIRE_THROWS_WITH(p.start(), Catch::Contains("metrics port 127.0.0.1:" + std::to_string(busy.port())) &&
                                           Catch::Contains("in use"));
    }
    {
        sluice::pipeline p(sluice::from(v), {.trace = d / "no-such-dir/t.json"});
        REQUIRE_THROWS_WITH(p.start(), Catch::Contains("trace file") && Catch::Contains("no-such-dir/t.json"));
    }
}

TEST_CASE("a Chrome trace shows each worker's busy and waiting spans, and they add up to the figures", "[metrics]") {
    SLUICE_SKIP_WITHOUT_READERS();
    temp_dir d;
    const std::string trace = d / "run.trace.json";
    std::vector<int> v(300, 1);
    auto slow = sluice::map([](int x) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return x;
    }, {.concurrency = 2, .name = "decode"});
    {
        sluice::pipeline p(sluice::from(v) | slow | sluice::map([](int x) { return x; }, {.name = "light"}), {.trace = trace});
        int n = 0;
        for (int x : p) {
            n += x;
            if (n % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the consumer busy at times
        }
        REQUIRE(n == 300);
        p.stop();
        const auto f = p.figures();
        auto r = run({"/usr/bin/python3", SLUICE_READ_METRICS, "trace", trace});
        INFO(r.err << r.out);
        REQUIRE(r.status == 0);
        CHECK(sluice_test::json_field(r.out, "overlaps") == "0");
        CHECK(sluice_test::json_field(r.out, "dropped_spans") == "0");
        // One track per worker and one for the consumer, named "stage #i".
        for (const char* track : {"from #0", "decode #0", "decode #1", "light #0", "consumer #0"})
            CHECK(r.out.find(std::string("\"") + track + "\"") != std::string::npos);
        // Each stage's spans add up to its figures (the trace and the counters are one
        // measurement): busy and waits per worker, summed.
        auto total = [&](const std::string& track, const std::string& what) {
            const std::regex re("\"" + track + "\":\\{[^}]*\"" + what + "\":([-0-9.e]+)");
            std::smatch m;
            REQUIRE(std::regex_search(r.out, m, re));
            return std::stod(m[1].str());
        };
        const double decode_busy = total("decode #0", "busy") + total("decode #1", "busy");
        const double decode_wait_out = total("decode #0", "waiting for room") + total("decode #1", "waiting for room");
        CHECK(decode_busy == Approx(f.stages[1].busy_s).margin(0.01));
        CHECK(decode_wait_out == Approx(f.stages[1].wait_output_s).margin(0.01));
        CHECK(decode_busy > 0.25);  // 300 x 2 ms over two workers, at least
        CHECK(total("light #0", "waiting for input") == Approx(f.stages[2].wait_input_s).margin(0.01));
        CHECK(total("light #0", "waiting for input") > 0.1);  // it starves behind decode
        CHECK(total("consumer #0", "waiting for input") == Approx(f.stages.back().wait_input_s).margin(0.01));
        CHECK(total("consumer #0", "busy") > 0.1);  // its six 20 ms pauses
    }
    REQUIRE_FALSE(std::filesystem::exists(trace + ".tmp"));
}
