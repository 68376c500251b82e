// Determinism, equal rank shares, exact resume and the local cache, driven through
// sluice-probe against local files, nginx and the fault server, as a user runs them.
#include "support/servers.hpp"
#include "support/test_support.hpp"

#include <sluice/core/detail/random.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

using sluice_test::json_u64;
using sluice_test::probe;
using sluice_test::run;
using sluice_test::slurp_file;

namespace {
struct counted_dataset {
    sluice_test::temp_dir dir;
    std::string summary;  // sluice-gen's JSON
    std::string counts;   // its record counts file
    explicit counted_dataset(std::vector<std::string> args) {
        counts = dir / "counts.txt";
        std::vector<std::string> argv{SLUICE_GEN, dir / "data", "--counts", counts};
        argv.insert(argv.end(), args.begin(), args.end());
        auto r = run(argv);
        INFO(r.err);
        REQUIRE(r.status == 0);
        summary = r.out;
    }
    std::string glob(const std::string& ext = "txt") const { return dir / ("data/shard-*." + ext); }
    std::uint64_t files() const { return json_u64(summary, "files"); }
    std::string pattern(const std::string& ext = "txt") const {  // a brace range naming every file
        char last[16];
        std::snprintf(last, sizeof last, "%06llu", static_cast<unsigned long long>(files() - 1));
        return "shard-{000000.." + std::string(last) + "}." + ext;
    }
};

std::vector<std::string> lines_of(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}
}  // namespace

TEST_CASE("deterministic mode gives the same sequence whatever the threads, files in flight and chunk size", "[determinism]") {
    counted_dataset d({"--files", "9", "--records", "400", "--record-size", "40", "--vary", "--uneven", "--seed", "4"});
    sluice_test::temp_dir out;
    const std::vector<std::string> base{"--quiet", "--json", "--deterministic", "--seed", "11", "--shuffle", "300",
                                        "--epochs", "2", "--batch", "10", d.glob()};
    std::vector<std::vector<std::string>> configs{
        {"--threads", "1"},
        {"--threads", "4", "--files-in-flight", "3", "--chunk-size", "777"},
        {"--threads", "2", "--files-in-flight", "2", "--chunk-size", "65536", "--collate-threads", "2", "--mmap"},
    };
    std::vector<std::string> first;
    for (std::size_t i = 0; i < configs.size(); ++i) {
        const auto keys = out / ("keys" + std::to_string(i));
        auto r = probe(with(with(base, configs[i]), {"--emit-keys", keys}));
        INFO(r.err << r.out);
        REQUIRE(r.status == 0);
        auto got = lines_of(keys);
        REQUIRE(got.size() == 2 * json_u64(d.summary, "records"));
        if (i == 0) first = got;
        else REQUIRE(got == first);
    }
    // Each epoch is a permutation of the data, and the two epochs differ.
    const auto half = first.size() / 2;
    std::vector<std::string> e0(first.begin(), first.begin() + half), e1(first.begin() + half, first.end());
    REQUIRE(e0 != e1);
    std::sort(e0.begin(), e0.end());
    std::sort(e1.begin(), e1.end());
    REQUIRE(e0 == e1);
    REQUIRE(std::adjacent_find(e0.begin(), e0.end()) == e0.end());
    // Another seed, another order.
    const auto other = out / "other";
    auto r = probe(with(base, {"--seed", "12", "--emit-keys", other}));
    REQUIRE(r.status == 0);
    REQUIRE(lines_of(other) != first);
}

TEST_CASE("over HTTP, deterministic mode gives the same sequence whatever the requests in flight and chunk size", "[determinism][http]") {
    counted_dataset d({"--files", "8", "--records", "300", "--record-size", "30", "--vary", "--uneven", "--seed", "8"});
    sluice_test::nginx_server nginx(d.dir / "data");
    sluice_test::temp_dir out;
    const std::vector<std::string> base{"--quiet", "--json", "--deterministic", "--seed", "5", "--shuffle", "200",
                                        "--batch", "16", nginx.url(d.pattern())};
    std::vector<std::string> first;
    int i = 0;
    for (std::vector<std::string> cfg : {std::vector<std::string>{"--in-flight", "1"},
                                         {"--in-flight", "16", "--chunk-size", "1000", "--part-size", "3000"},
                                         {"--in-flight", "4", "--threads", "1"}}) {
        const auto keys = out / ("k" + std::to_string(i++));
        auto r = probe(with(with(base, cfg), {"--emit-keys", keys}));
        INFO(r.err << r.out);
        REQUIRE(r.status == 0);
        if (first.empty()) first = lines_of(keys);
        else REQUIRE(lines_of(keys) == first);
    }
    REQUIRE(first.size() == json_u64(d.summary, "records"));
}

TEST_CASE("ranks from RANK and WORLD_SIZE take disjoint, equal shares that cover the data", "[ranks]") {
    // Shards of different sizes: 11 files of 60..126 records.
    counted_dataset d({"--files", "11", "--records", "90", "--uneven", "--seed", "2"});
    const std::uint64_t total = json_u64(d.summary, "records");
    sluice_test::temp_dir out;
    for (std::string share : {"drop", "pad"}) {
        INFO("share " << share);
        std::vector<std::string> all;
        std::set<std::uint64_t> batches;
        for (int rank = 0; rank < 4; ++rank) {
            const auto keys = out / (share + std::to_string(rank));
            auto r = run({"/usr/bin/env", "RANK=" + std::to_string(rank), "WORLD_SIZE=4", SLUICE_PROBE, "--quiet", "--json",
                          "--seed", "6", "--shuffle", "50", "--batch", "8", "--counts", d.counts, "--share", share,
                          "--emit-keys", keys, d.glob()});
            INFO(r.err << r.out);
            REQUIRE(r.status == 0);
            batches.insert(json_u64(r.out, "batches"));
            auto k = lines_of(keys);
            all.insert(all.end(), k.begin(), k.end());
        }
        REQUIRE(batches.size() == 1);  // every rank steps the same number of times
        std::set<std::string> distinct(all.begin(), all.end());
        if (share == "drop") {
            REQUIRE(all.size() == total / 4 * 4);
            REQUIRE(distinct.size() == all.size());  // disjoint
            REQUIRE(total - distinct.size() < 4);    // fewer than world records left out
        } else {
            REQUIRE(all.size() == (total + 3) / 4 * 4);
            REQUIRE(distinct.size() == total);  // every record, a few twice
        }
    }
    SECTION("the launcher's variables are read in order, and bad ones named") {
        auto r = run({"/usr/bin/env", "-u", "RANK", "-u", "WORLD_SIZE", "SLURM_PROCID=1", "SLURM_NTASKS=2", SLUICE_PROBE,
                      "--quiet", "--json", "--counts", d.counts, d.glob()});
        REQUIRE(r.status == 0);
        REQUIRE(json_u64(r.out, "records") == total / 2);
        r = run({"/usr/bin/env", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2", SLUICE_PROBE, "--quiet",
                 "--counts", d.counts, d.glob()});
        REQUIRE(r.status == 1);
        REQUIRE(r.err.find("OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2") != std::string::npos);
        // Without a counts file the probe counts the records itself, keeping them where
        // the cache directories are ($XDG_CACHE_HOME/sluice), and a second rank reuses them.
        const std::string cache = d.dir / "xdg-cache";
        for (const char* rank : {"RANK=1", "RANK=0"}) {
            r = run({"/usr/bin/env", rank, "WORLD_SIZE=2", "XDG_CACHE_HOME=" + cache, SLUICE_PROBE, "--quiet", "--json",
                     d.glob()});
            INFO(r.err);
            REQUIRE(r.status == 0);
            REQUIRE(json_u64(r.out, "records") == total / 2);
            REQUIRE(r.out.find(std::string("\"shards_counted\":") + (rank[5] == '1' ? std::to_string(d.files()) : "0")) !=
                    std::string::npos);
        }
        REQUIRE(std::filesystem::exists(cache + "/sluice/record-counts"));
    }
}

TEST_CASE("4 processes with RANK and WORLD_SIZE read one dataset from nginx: union is the dataset, no overlap, equal batches", "[ranks][http]") {
    counted_dataset d({"--files", "13", "--records", "200", "--uneven", "--vary", "--seed", "9"});
    sluice_test::nginx_server nginx(d.dir / "data");
    const std::uint64_t total = json_u64(d.summary, "records");
    // 13 shards of 120..280 records, 2,480 in all: divisible by 4, so share::drop leaves
    // nothing out and the union must be the dataset itself, as one process reads it.
    REQUIRE(total % 4 == 0);
    sluice_test::temp_dir out;
    auto r = run({"/usr/bin/env", "-u", "RANK", "-u", "WORLD_SIZE", SLUICE_PROBE, "--quiet", "--emit-keys",
                  out / "all", nginx.url(d.pattern())});
    REQUIRE(r.status == 0);
    const auto all = lines_of(out / "all");
    const std::set<std::string> dataset(all.begin(), all.end());
    REQUIRE(dataset.size() == total);
    // Deterministic: each rank's keys split exactly into its two epochs. Default (fetch
    // unordered, objects as they complete): an epoch's last records may reach a rank
    // after the next epoch's first, so only the two epochs together are checked there.
    for (bool deterministic : {true, false}) {
        INFO((deterministic ? "deterministic" : "unordered fetch"));
        std::vector<std::unique_ptr<sluice_test::child>> procs;
        for (int rank = 0; rank < 4; ++rank) {
            std::vector<std::string> argv{"/usr/bin/env", "RANK=" + std::to_string(rank), "WORLD_SIZE=4", SLUICE_PROBE,
                                          "--quiet", "--json", "--seed", "3", "--shuffle", "100", "--epochs", "2",
                                          "--batch", "16", "--counts", d.counts, "--emit-keys",
                                          out / ("keys" + std::to_string(rank)), nginx.url(d.pattern())};
            if (deterministic) argv.push_back("--deterministic");
            procs.push_back(std::make_unique<sluice_test::child>(argv, out / ("out" + std::to_string(rank)),
                                                                 out / ("err" + std::to_string(rank))));
        }
        std::set<std::uint64_t> batches;
        std::multiset<std::string> epoch0, epoch1, both;
        for (int rank = 0; rank < 4; ++rank) {
            INFO(slurp_file(out / ("err" + std::to_string(rank))));
            REQUIRE(procs[rank]->wait() == 0);
            batches.insert(json_u64(slurp_file(out / ("out" + std::to_string(rank))), "batches"));
            auto k = lines_of(out / ("keys" + std::to_string(rank)));
            REQUIRE(k.size() == 2 * (total / 4));
            epoch0.insert(k.begin(), k.begin() + k.size() / 2);
            epoch1.insert(k.begin() + k.size() / 2, k.end());
            both.insert(k.begin(), k.end());
        }
        REQUIRE(batches.size() == 1);  // every rank steps the same number of times
        for (auto& key : dataset) REQUIRE(both.count(key) == 2);  // every record once an epoch
        if (!deterministic) continue;
        for (auto* e : {&epoch0, &epoch1}) {
            std::set<std::string> distinct(e->begin(), e->end());
            REQUIRE(distinct.size() == e->size());  // no record on two ranks
            REQUIRE(distinct == dataset);           // together, every record
        }
    }
}

namespace {
// Runs `args` whole, then cut after each of `cuts` batches and resumed: the cut run's keys
// followed by the resumed run's must be the whole run's, for every cut.
void check_resume(const std::vector<std::string>& args, const std::vector<std::uint64_t>& cuts) {
    sluice_test::temp_dir out;
    auto whole = probe(with(args, {"--emit-keys", out / "whole"}));
    INFO(whole.err);
    REQUIRE(whole.status == 0);
    const auto expected = lines_of(out / "whole");
    REQUIRE(!expected.empty());
    for (auto cut : cuts) {
        INFO("cut after batch " << cut);
        auto a = probe(with(args, {"--stop-after-batches", std::to_string(cut), "--save-state", out / "state",
                                   "--emit-keys", out / "a"}));
        INFO(a.err);
        REQUIRE(a.status == 0);
        const auto state = slurp_file(out / "state");
        INFO(state);
        REQUIRE(state.size() < 1024);  // small: epoch, position and settings
        auto b = probe(with(args, {"--resume", out / "state", "--emit-keys", out / "b"}));
        INFO(b.err);
        REQUIRE(b.status == 0);
        auto got = lines_of(out / "a");
        auto rest = lines_of(out / "b");
        got.insert(got.end(), rest.begin(), rest.end());
        REQUIRE(got == expected);
    }
}

std::vector<std::uint64_t> random_cuts(std::uint64_t batches, int n) {
    sluice::detail::rng r(sluice_test::test_seed());
    std::vector<std::uint64_t> cuts{0, 1, batches - 1, batches};
    for (int i = 0; i < n; ++i) cuts.push_back(r.below(batches + 1));
    return cuts;
}
}  // namespace

TEST_CASE("a pipeline cut after any batch resumes with exactly the rest, local files", "[resume]") {
    counted_dataset d({"--files", "7", "--records", "250", "--record-size", "30", "--vary", "--uneven", "--seed", "12"});
    const std::uint64_t records = json_u64(d.summary, "records");
    const std::uint64_t per_epoch = (records + 15) / 16;  // batches of 16, the last one partial
    const std::vector<std::string> args{"--quiet", "--json", "--deterministic", "--seed", "21", "--shuffle", "120",
                                        "--epochs", "3", "--batch", "16", "--chunk-size", "3000", d.glob()};
    SECTION("with record counts: only what is needed is read again") {
        auto cuts = random_cuts(3 * per_epoch, 6);
        cuts.push_back(per_epoch);      // at an epoch's end
        cuts.push_back(per_epoch + 3);  // early in the second epoch
        check_resume(with(args, {"--counts", d.counts}), cuts);
    }
    SECTION("without record counts: the epoch is read again and what was delivered dropped") {
        check_resume(args, random_cuts(3 * per_epoch, 4));
    }
    SECTION("three ranks padded to equal shares, shuffled") {
        auto three = with(args, {"--counts", d.counts, "--rank", "2", "--world", "3", "--share", "pad"});
        check_resume(three, random_cuts(3 * ((records + 2) / 3 / 16 + 1), 4));
    }
    SECTION("saved without record counts, resumed with them, at an epoch's end and in its final drain") {
        sluice_test::temp_dir out;
        auto whole = probe(with(args, {"--emit-keys", out / "whole"}));
        REQUIRE(whole.status == 0);
        for (std::uint64_t cut : {per_epoch, per_epoch - 2, 2 * per_epoch - 1}) {
            INFO("cut " << cut);
            REQUIRE(probe(with(args, {"--stop-after-batches", std::to_string(cut), "--save-state", out / "s",
                                      "--emit-keys", out / "a"}))
                        .status == 0);
            auto b = probe(with(args, {"--counts", d.counts, "--resume", out / "s", "--emit-keys", out / "b"}));
            INFO(b.err);
            REQUIRE(b.status == 0);
            auto got = lines_of(out / "a");
            auto rest = lines_of(out / "b");
            got.insert(got.end(), rest.begin(), rest.end());
            REQUIRE(got == lines_of(out / "whole"));
        }
    }
    SECTION("two ranks, no shuffle, the last partial batch dropped") {
        auto two = with(args, {"--counts", d.counts, "--rank", "1", "--world", "2", "--shuffle", "0", "--drop-last"});
        check_resume(two, random_cuts(3 * (records / 2 / 16), 4));
    }
}

TEST_CASE("states saved by 4 ranks resume on 2, and by 2 on 3: what no rank delivered comes once, in equal steps", "[resume][ranks]") {
    counted_dataset d({"--files", "7", "--records", "250", "--record-size", "30", "--vary", "--uneven", "--seed", "23"});
    sluice_test::temp_dir out;
    const std::vector<std::string> base{"--quiet", "--json", "--deterministic", "--seed", "9", "--shuffle", "60",
                                        "--batch", "8", "--epochs", "2", d.glob()};
    REQUIRE(probe(with(base, {"--epochs", "1", "--shuffle", "0", "--emit-keys", out / "all"})).status == 0);
    const auto all_keys = lines_of(out / "all");
    const std::set<std::string> dataset(all_keys.begin(), all_keys.end());
    const std::uint64_t n = dataset.size();
    REQUIRE(n == json_u64(d.summary, "records"));
    struct change {
        unsigned from, to;
        std::string share;
        std::uint64_t cut;  // batches each old rank took
        bool counts;        // a counts file, or plan counts them itself
    };
    for (const change& c : {change{4, 2, "drop", 13, true}, change{2, 3, "pad", 40, false}, change{3, 1, "drop", 1, true}}) {
        INFO(c.from << " ranks -> " << c.to << ", share " << c.share << ", cut after " << c.cut);
        sluice_test::temp_dir run;
        const auto args = with(base, {"--share", c.share, "--counts-dir", run / "counts"});
        auto counted = [&](std::vector<std::string> a) { return c.counts ? with(a, {"--counts", d.counts}) : a; };
        std::multiset<std::string> old_keys;
        std::vector<std::string> resume;
        for (unsigned r = 0; r < c.from; ++r) {
            const std::string tag = std::to_string(r);
            auto a = probe(counted(with(args, {"--rank", tag, "--world", std::to_string(c.from), "--stop-after-batches",
                                               std::to_string(c.cut), "--save-state", run / ("s" + tag), "--emit-keys",
                                               run / ("a" + tag)})));
            INFO(a.err);
            REQUIRE(a.status == 0);
            auto k = lines_of(run / ("a" + tag));
            REQUIRE(k.size() == c.cut * 8);
            old_keys.insert(k.begin(), k.end());
            resume.insert(resume.end(), {"--resume", run / ("s" + tag)});
        }
        const std::set<std::string> delivered(old_keys.begin(), old_keys.end());
        // Every old rank took q records of the epoch; what none of them delivered is left.
        const std::uint64_t q = c.share == "pad" ? (n + c.from - 1) / c.from : n / c.from;
        const std::uint64_t covered = c.share == "pad" ? n : c.from * q;
        const std::uint64_t left = covered - delivered.size();
        const std::uint64_t q2 = c.share == "pad" ? (left + c.to - 1) / c.to : left / c.to;
        const std::uint64_t next = c.share == "pad" ? (n + c.to - 1) / c.to : n / c.to;  // epoch 1, new world
        std::multiset<std::string> rest, epoch1;
        std::set<std::uint64_t> batches;
        std::vector<std::vector<std::string>> got(c.to);
        for (unsigned r = 0; r < c.to; ++r) {
            const std::string tag = std::to_string(r);
            auto b = probe(counted(with(with(args, {"--rank", tag, "--world", std::to_string(c.to), "--emit-keys",
                                                    run / ("b" + tag)}),
                                        resume)));
            INFO(b.err);
            REQUIRE(b.status == 0);
            batches.insert(json_u64(b.out, "batches"));
            got[r] = lines_of(run / ("b" + tag));
            REQUIRE(got[r].size() == q2 + next);  // this rank's equal share of what was left, then epoch 1
            rest.insert(got[r].begin(), got[r].begin() + static_cast<std::ptrdiff_t>(q2));
            epoch1.insert(got[r].begin() + static_cast<std::ptrdiff_t>(q2), got[r].end());
        }
        REQUIRE(batches.size() == 1);  // the new ranks step together
        for (auto& k : rest) REQUIRE(delivered.count(k) == 0);  // nothing delivered comes again
        std::set<std::string> union_(delivered.begin(), delivered.end());
        union_.insert(rest.begin(), rest.end());
        for (auto& k : union_) REQUIRE(dataset.count(k) == 1);
        const std::set<std::string> distinct_rest(rest.begin(), rest.end());
        if (c.share == "drop") {
            REQUIRE(distinct_rest.size() == rest.size());          // none twice
            REQUIRE(union_.size() == covered - (left - c.to * q2));  // all but the fewer than `to` dropped
            REQUIRE(left - c.to * q2 < c.to);
            REQUIRE(std::set<std::string>(epoch1.begin(), epoch1.end()).size() == epoch1.size());
        } else {
            REQUIRE(union_ == dataset);  // every record of the epoch, a few twice
            REQUIRE(rest.size() - distinct_rest.size() == c.to * q2 - left);
            REQUIRE(std::set<std::string>(epoch1.begin(), epoch1.end()) == dataset);
        }
        if (c.from != 4) continue;
        // A new rank cut inside the epoch it resumed into saves a state that resumes at its
        // own world size with exactly the rest, and that is refused by a merge.
        const std::vector<std::string> mine = counted(with(args, {"--rank", "1", "--world", std::to_string(c.to)}));
        REQUIRE(q2 > 3 * 8);  // the cuts below fall inside the epoch
        for (std::uint64_t cut : {std::uint64_t{2}, q2 / 8 - 1}) {
            INFO("new rank 1 cut after " << cut);
            REQUIRE(probe(with(with(mine, resume), {"--stop-after-batches", std::to_string(cut), "--save-state",
                                                    run / "t", "--emit-keys", run / "c"}))
                        .status == 0);
            auto again = probe(with(mine, {"--resume", run / "t", "--emit-keys", run / "e"}));
            INFO(again.err << slurp_file(run / "t"));
            REQUIRE(again.status == 0);
            auto both = lines_of(run / "c");
            auto more = lines_of(run / "e");
            both.insert(both.end(), more.begin(), more.end());
            REQUIRE(both == got[1]);
        }
        auto refused = probe(with(mine, {"--resume", run / "t", "--resume", run / "t"}));
        REQUIRE(refused.status == 1);
        REQUIRE(refused.err.find("which a change of world size resumed into") != std::string::npos);
    }
}

TEST_CASE("merging states that do not make one world is refused, naming the state at fault", "[resume][ranks][errors]") {
    counted_dataset d({"--files", "3", "--records", "100"});
    sluice_test::temp_dir out;
    const std::vector<std::string> args{"--quiet", "--deterministic", "--seed", "1", "--shuffle", "50", "--batch", "8",
                                        "--counts", d.counts, d.glob()};
    for (std::string r : {"0", "1", "2"})
        REQUIRE(probe(with(args, {"--rank", r, "--world", "3", "--stop-after-batches", "2", "--save-state", out / r})).status ==
                0);
    REQUIRE(probe(with(args, {"--rank", "1", "--world", "2", "--stop-after-batches", "2", "--save-state", out / "w2"})).status ==
            0);
    auto r = probe(with(args, {"--resume", out / "0", "--resume", out / "1"}));  // rank 2's missing
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("was saved by rank 0 of 3, but 2 states were given") != std::string::npos);
    r = probe(with(args, {"--resume", out / "0", "--resume", out / "1", "--resume", out / "1"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("rank 1 is given twice") != std::string::npos);
    r = probe(with(args, {"--resume", out / "0", "--resume", out / "w2"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("state 1 was saved in a world of 2 ranks, the states before it in one of 3") != std::string::npos);
    // Merged, then resumed by a pipeline with another share or seed: named like any resume.
    r = probe(with(args, {"--share", "pad", "--resume", out / "0", "--resume", out / "1", "--resume", out / "2"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("the saved states were made with plan seed=1 share=0, this pipeline has plan seed=1 share=1") !=
            std::string::npos);
    r = probe({"--quiet", "--deterministic", "--seed", "2", "--shuffle", "50", "--batch", "8", "--counts", d.counts,
               "--resume", out / "0", "--resume", out / "1", "--resume", out / "2", d.glob()});
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("the saved state was made with shuffle buffer=50 max_bytes=0 seed=1, this pipeline has") !=
            std::string::npos);
}

// What a stage took in, from sluice-probe's JSON.
std::uint64_t stage_in(const std::string& json, const std::string& stage) {
    const auto at = json.find("{\"name\":\"" + stage + "\"");
    REQUIRE(at != std::string::npos);
    return json_u64(json.substr(at), "items_in");
}

TEST_CASE("with record counts a resumed pipeline reads only what its shuffle held, not the epoch again", "[resume]") {
    counted_dataset d({"--files", "20", "--records", "200", "--record-size", "30", "--seed", "18"});
    sluice_test::temp_dir out;
    const std::vector<std::string> args{"--quiet", "--json", "--deterministic", "--seed", "4", "--shuffle", "100",
                                        "--batch", "10", d.glob()};
    // A cut late in the epoch: 350 of 400 batches delivered.
    REQUIRE(probe(with(args, {"--counts", d.counts, "--stop-after-batches", "350", "--save-state", out / "s"})).status == 0);
    REQUIRE(probe(with(args, {"--stop-after-batches", "350", "--save-state", out / "s0"})).status == 0);
    auto with_counts = probe(with(args, {"--counts", d.counts, "--resume", out / "s"}));
    auto without = probe(with(args, {"--resume", out / "s0"}));
    REQUIRE(with_counts.status == 0);
    REQUIRE(without.status == 0);
    REQUIRE(json_u64(with_counts.out, "records") == 500);
    REQUIRE(json_u64(without.out, "records") == 500);
    REQUIRE(stage_in(without.out, "lines") == 20);      // every file read again
    REQUIRE(stage_in(with_counts.out, "lines") <= 10);  // the last few, and those the buffer held
    REQUIRE(stage_in(with_counts.out, "shuffle") < 1000);
}

TEST_CASE("a pipeline cut after any batch resumes with exactly the rest, over HTTP", "[resume][http]") {
    counted_dataset d({"--files", "6", "--records", "300", "--record-size", "20", "--vary", "--uneven", "--seed", "13"});
    sluice_test::nginx_server nginx(d.dir / "data");
    const std::uint64_t per_epoch = (json_u64(d.summary, "records") + 9) / 10;
    check_resume({"--quiet", "--json", "--deterministic", "--seed", "2", "--shuffle", "250", "--epochs", "2", "--batch",
                  "10", "--in-flight", "8", "--counts", d.counts, nginx.url(d.pattern())},
                 random_cuts(2 * per_epoch, 5));
}

TEST_CASE("state is refused for a pipeline whose order depends on timing", "[resume][errors]") {
    counted_dataset d({"--files", "4", "--records", "100"});
    sluice_test::nginx_server nginx(d.dir / "data");
    sluice_test::temp_dir out;
    // fetch is unordered by default: objects as they complete.
    auto r = probe({"--quiet", "--batch", "8", "--stop-after-batches", "3", "--save-state", out / "s",
                    nginx.url(d.pattern())});
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("cannot save a position: stage 'fetch' is unordered") != std::string::npos);
    REQUIRE(r.err.find("sluice-probe --deterministic") != std::string::npos);
    r = probe({"--quiet", "--batch", "8", "--files-in-flight", "2", "--stop-after-batches", "3", "--save-state",
               out / "s", d.glob()});
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("stage 'read' is unordered") != std::string::npos);
}

TEST_CASE("a saved state is refused by a pipeline that would give another sequence", "[resume][errors]") {
    counted_dataset d({"--files", "3", "--records", "100"});
    sluice_test::temp_dir out;
    const std::vector<std::string> args{"--quiet", "--seed", "1", "--shuffle", "50", "--batch", "8", d.glob()};
    REQUIRE(probe(with(args, {"--stop-after-batches", "5", "--save-state", out / "s"})).status == 0);
    auto r = probe({"--quiet", "--seed", "2", "--shuffle", "50", "--batch", "8", "--resume", out / "s", d.glob()});
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("cannot resume: the saved state was made with") != std::string::npos);
    REQUIRE(r.err.find("seed=1, this pipeline has") != std::string::npos);
    r = probe(with(args, {"--batch", "9", "--resume", out / "s"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("batch size=8") != std::string::npos);
    std::ofstream(out / "bad") << "not a state\n";
    r = probe(with(args, {"--resume", out / "bad"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("not a sluice state") != std::string::npos);
    // Counts that do not describe the data: named, not silently wrong.
    std::ofstream(out / "counts") << "99 shard-000000.txt\n100 shard-000001.txt\n100 shard-000002.txt\n";
    r = probe(with(args, {"--counts", out / "counts"}));
    REQUIRE(r.status == 1);
    REQUIRE(r.err.find("yields 100 records but the record counts say 99") != std::string::npos);
}

namespace {
std::uint64_t dir_bytes(const std::string& dir, int* files = nullptr, int* temps = nullptr) {
    std::uint64_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) {
        const auto name = e.path().filename().string();
        if (name == ".lock") continue;
        if (name.starts_with(".tmp-")) {
            if (temps) ++*temps;
            continue;
        }
        n += e.file_size();
        if (files) ++*files;
    }
    return n;
}
}  // namespace

TEST_CASE("the cache: epoch 1 from the server, later epochs and runs from local disk, the same records", "[cache][http]") {
    counted_dataset d({"--files", "6", "--records", "500", "--record-size", "100", "--vary", "--seed", "14"});
    sluice_test::nginx_server nginx(d.dir / "data");
    sluice_test::temp_dir cache;
    // One request at a time: an object is in the cache once its download completes, and
    // with more in flight the second epoch's requests could start before that.
    const std::vector<std::string> args{"--quiet", "--json", "--in-flight", "1", "--cache", cache / "c",
                                        nginx.url(d.pattern())};
    auto first = probe(with(args, {"--epochs", "2"}));
    INFO(first.err << first.out);
    REQUIRE(first.status == 0);
    REQUIRE(json_u64(first.out, "crc_sum") == 2 * json_u64(d.summary, "crc_sum"));
    REQUIRE(json_u64(first.out, "cache_misses") == 6);
    REQUIRE(json_u64(first.out, "cache_hits") == 6);  // the second epoch
    REQUIRE(json_u64(first.out, "requests") == 6);
    int files = 0;
    dir_bytes(cache / "c", &files);
    REQUIRE(files == 6);
    auto second = probe(args);
    REQUIRE(second.status == 0);
    REQUIRE(json_u64(second.out, "crc_sum") == json_u64(d.summary, "crc_sum"));
    REQUIRE(json_u64(second.out, "cache_hits") == 6);
    REQUIRE(json_u64(second.out, "requests") == 0);
    SECTION("a bounded cache evicts the least recently used and stays under its limit") {
        sluice_test::temp_dir small;
        const std::uint64_t shard_bytes = std::filesystem::file_size(d.dir / "data/shard-000000.txt");
        const std::uint64_t limit = 3 * shard_bytes + shard_bytes / 2;  // about three shards
        auto r = probe({"--quiet", "--json", "--epochs", "2", "--cache", small / "c", "--cache-bytes",
                        std::to_string(limit), nginx.url(d.pattern())});
        INFO(r.err);
        REQUIRE(r.status == 0);
        REQUIRE(json_u64(r.out, "crc_sum") == 2 * json_u64(d.summary, "crc_sum"));
        REQUIRE(json_u64(r.out, "cache_evictions") > 0);
        REQUIRE(dir_bytes(small / "c") <= limit);
    }
    SECTION("a copy cut short is discarded, not served") {
        for (auto& e : std::filesystem::directory_iterator(cache / "c"))
            if (!e.path().filename().string().starts_with(".")) {
                std::filesystem::resize_file(e.path(), e.file_size() / 2);
                break;
            }
        auto r = probe(args);
        REQUIRE(r.status == 0);
        REQUIRE(json_u64(r.out, "crc_sum") == json_u64(d.summary, "crc_sum"));
        REQUIRE(json_u64(r.out, "cache_hits") == 5);
        REQUIRE(json_u64(r.out, "cache_misses") == 1);
    }
}

TEST_CASE("processes of one node share one cache safely", "[cache][http]") {
    counted_dataset d({"--files", "10", "--records", "400", "--record-size", "200", "--vary", "--seed", "15"});
    sluice_test::nginx_server nginx(d.dir / "data");
    sluice_test::temp_dir cache, out;
    const std::uint64_t shard_bytes = std::filesystem::file_size(d.dir / "data/shard-000000.txt");
    const std::uint64_t limit = 6 * shard_bytes;  // less than the dataset: evictions race with reads
    std::vector<std::unique_ptr<sluice_test::child>> procs;
    for (int i = 0; i < 4; ++i)
        procs.push_back(std::make_unique<sluice_test::child>(
            std::vector<std::string>{SLUICE_PROBE, "--quiet", "--json", "--epochs", "3", "--seed", std::to_string(i),
                                     "--in-flight", "3", "--cache", cache / "c", "--cache-bytes", std::to_string(limit),
                                     nginx.url(d.pattern())},
            out / ("out" + std::to_string(i)), out / ("err" + std::to_string(i))));
    for (int i = 0; i < 4; ++i) {
        INFO(slurp_file(out / ("err" + std::to_string(i))));
        REQUIRE(procs[i]->wait() == 0);
        const auto json = slurp_file(out / ("out" + std::to_string(i)));
        REQUIRE(json_u64(json, "crc_sum") == 3 * json_u64(d.summary, "crc_sum"));
        REQUIRE(json_u64(json, "cache_write_failures") == 0);
    }
    int temps = 0;
    REQUIRE(dir_bytes(cache / "c", nullptr, &temps) <= limit);
    REQUIRE(temps == 0);
    // Whatever is left is whole: a run reading only from it gets every record right.
    auto r = probe({"--quiet", "--json", "--cache", cache / "c", nginx.url(d.pattern())});
    REQUIRE(r.status == 0);
    REQUIRE(json_u64(r.out, "crc_sum") == json_u64(d.summary, "crc_sum"));
    REQUIRE(json_u64(r.out, "cache_hits") > 0);
}

TEST_CASE("a full disk for the cache falls back to the source with a warning and loses nothing", "[cache][http][errors]") {
    // A 64 KiB file system of our own, in a user and mount namespace (no root needed).
    auto can = run({"unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"});
    if (can.status != 0) {
        WARN("[test skipped] cannot mount a small tmpfs in a user namespace here: " << can.err);
        return;
    }
    counted_dataset d({"--files", "5", "--records", "400", "--record-size", "100", "--seed", "16"});  // ~40 KB each
    sluice_test::nginx_server nginx(d.dir / "data");
    sluice_test::temp_dir mnt;
    const std::string script = "mount -t tmpfs -o size=64k none " + mnt.path().string() + " && exec \"$@\"";
    auto r = run({"unshare", "-rm", "sh", "-c", script, "sh", SLUICE_PROBE, "--quiet", "--json", "--epochs", "2",
                  "--in-flight", "2", "--cache", mnt / "c", nginx.url(d.pattern())});
    INFO(r.err << r.out);
    REQUIRE(r.status == 0);
    REQUIRE(json_u64(r.out, "crc_sum") == 2 * json_u64(d.summary, "crc_sum"));
    REQUIRE(json_u64(r.out, "records") == 2 * json_u64(d.summary, "records"));
    REQUIRE(json_u64(r.out, "cache_write_failures") > 0);
    REQUIRE(r.err.find("sluice: cache: cannot write") != std::string::npos);
    REQUIRE(r.err.find("No space left on device") != std::string::npos);
    REQUIRE(r.err.find("is read from its source and not cached") != std::string::npos);
}

TEST_CASE("a process killed while caching leaves no copy that is later served", "[cache][http][errors]") {
    // The fault server answers slowly, so the kill lands mid-download.
    counted_dataset d({"--files", "4", "--records", "2000", "--record-size", "100", "--seed", "17"});
    sluice_test::fault_server slow(d.dir / "data", {"--ttfb-ms", "300"});
    sluice_test::temp_dir cache, out;
    {
        sluice_test::child p({SLUICE_PROBE, "--quiet", "--json", "--in-flight", "4", "--cache", cache / "c",
                              slow.url(d.pattern())},
                             out / "o", out / "e");
        for (int i = 0; i < 500; ++i) {
            int temps = 0;
            if (std::filesystem::exists(cache / "c")) dir_bytes(cache / "c", nullptr, &temps);
            if (temps > 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ::kill(p.pid(), SIGKILL);
        p.wait();
    }
    int files = 0, temps = 0;
    dir_bytes(cache / "c", &files, &temps);
    REQUIRE(temps > 0);  // it was killed mid-copy
    auto r = probe({"--quiet", "--json", "--cache", cache / "c", slow.url(d.pattern())});
    INFO(r.err);
    REQUIRE(r.status == 0);
    REQUIRE(json_u64(r.out, "crc_sum") == json_u64(d.summary, "crc_sum"));
    REQUIRE(json_u64(r.out, "cache_misses") == 4 - static_cast<std::uint64_t>(files));
}
