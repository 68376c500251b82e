// The libtorch trainer (examples/train_libtorch.cpp) run as a user runs it: on image
// shards sluice-gen makes (labels tied to hue, so the loss can fall), zero-copy batches,
// a checkpoint with the data position, and a resumed run that goes on exactly.
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using sluice_test::run;

namespace {

#if defined(SLUICE_TRAIN_LIBTORCH)
/// 4 shards of 250 photos of 4 classes, made once per test binary.
const sluice_test::temp_dir& shards() {
    static std::unique_ptr<sluice_test::temp_dir> d = [] {
        auto t = std::make_unique<sluice_test::temp_dir>();
        auto g = run({SLUICE_GEN, t->path().string(), "--images", "--jpeg-only", "--format", "tar", "--files", "4",
                      "--records", "250", "--classes", "4", "--seed", "3"});
        if (g.status != 0) throw std::runtime_error("sluice-gen failed: " + g.err);
        return t;
    }();
    return *d;
}

sluice_test::run_result train(std::vector<std::string> more) {
    std::vector<std::string> argv{SLUICE_TRAIN_LIBTORCH, shards() / "shard-*.tar", "--classes", "4"};
    argv.insert(argv.end(), more.begin(), more.end());
    return run(argv);
}

/// The "labels STEP HASH loss LOSS" lines of a run: (step and hash, loss).
std::vector<std::pair<std::string, double>> label_lines(const std::string& out) {
    std::istringstream in(out);
    std::string line;
    std::vector<std::pair<std::string, double>> got;
    while (std::getline(in, line))
        if (line.rfind("labels ", 0) == 0) {
            const auto at = line.find(" loss ");
            got.emplace_back(line.substr(0, at), at == std::string::npos ? -1.0 : std::stod(line.substr(at + 6)));
        }
    return got;
}
#endif

#define NEED_TRAINER()                                                                                          \
    do {                                                                                                        \
        if (!have_trainer()) {                                                                                  \
            WARN("[test skipped] train-libtorch is not in this build: only the plain build makes it (libtorch " \
                 "is not built with the sanitizers), with libtorch-dev (find_package(Torch)) and the image layer"); \
            return;                                                                                             \
        }                                                                                                       \
    } while (0)

bool have_trainer() {
#if defined(SLUICE_TRAIN_LIBTORCH)
    return true;
#else
    return false;
#endif
}

}  // namespace

TEST_CASE("train-libtorch learns from sluice's image batches, taken by torch without a copy", "[trainer]") {
    NEED_TRAINER();
#if defined(SLUICE_TRAIN_LIBTORCH)
    auto r = train({"--steps", "200"});
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("batch memory shared with torch: yes"));
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, std::regex(R"(steps 200 \(to step 200\): loss first 20 ([0-9.e+-]+), last 20 ([0-9.e+-]+))")));
    const double first = std::stod(m[1]), last = std::stod(m[2]);
    // 4 classes: chance is ln 4 = 1.39; the hue gives the label away.
    CHECK(first > 1.0);
    CHECK(last < 0.6 * first);
    CHECK_THAT(r.out, Catch::Contains("images/s") && Catch::Contains("decode_images") && Catch::Contains("bottleneck:"));
    auto missing = run({SLUICE_TRAIN_LIBTORCH, shards() / "nothing-*.tar"});
    CHECK(missing.status == 1);
    CHECK_THAT(missing.err, Catch::Contains("nothing-*.tar"));
#endif
}

TEST_CASE("train-libtorch saves its data position beside the model, and a resumed run takes exactly the batches that were left", "[trainer]") {
    NEED_TRAINER();
#if defined(SLUICE_TRAIN_LIBTORCH)
    sluice_test::temp_dir ck;
    auto whole = train({"--steps", "80", "--print-labels"});
    INFO(whole.err);
    REQUIRE(whole.status == 0);
    auto first = train({"--steps", "40", "--print-labels", "--checkpoint", ck.path().string()});
    INFO(first.err);
    REQUIRE(first.status == 0);
    for (auto f : {"model.pt", "optimizer.pt", "data.state", "step"}) REQUIRE(std::filesystem::exists(ck / f));
    auto rest = train({"--steps", "80", "--print-labels", "--checkpoint", ck.path().string(), "--resume"});
    INFO(rest.err);
    REQUIRE(rest.status == 0);
    CHECK_THAT(rest.out, Catch::Contains("steps 40 (to step 80)"));
    const auto want = label_lines(whole.out);
    REQUIRE(want.size() == 80);  // past the first epoch's 31 batches
    auto got = label_lines(first.out);
    const auto more = label_lines(rest.out);
    got.insert(got.end(), more.begin(), more.end());
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        INFO("step " << i);
        CHECK(got[i].first == want[i].first);  // the same batch
        // The same model and optimizer state: the same loss (torch's threads may sum in
        // another order, hence the tolerance; a model or momentum not restored is far off).
        CHECK(got[i].second == Approx(want[i].second).epsilon(1e-3));
    }
    // Asked for no more steps than it has: nothing to do, the checkpoint untouched.
    auto again = train({"--steps", "80", "--checkpoint", ck.path().string(), "--resume"});
    CHECK(again.status == 0);
    CHECK_THAT(again.out, Catch::Contains("at step 80 already"));
#endif
}
