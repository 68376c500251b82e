// sluice-gen --images and sluice-probe --images, run as a user runs them; the generated
// photos decoded by sluice and by PIL.
#include "support/test_support.hpp"

#include <sluice/image/codec.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using sluice_test::json_u64;
using sluice_test::run;

namespace {
sluice_test::run_result gen(const std::string& dir, std::vector<std::string> args) {
    std::vector<std::string> argv{SLUICE_GEN, dir, "--images"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
}
sluice_test::run_result probe_json(std::vector<std::string> args) {
    args.insert(args.begin(), {"--json", "--quiet"});
    return sluice_test::probe(std::move(args));
}
bool have_pil() { return run({"/usr/bin/python3", "-c", "import PIL, numpy"}).status == 0; }
}  // namespace

TEST_CASE("sluice-gen's photos: JPEG variants and PNGs of realistic sizes, decoded by sluice exactly as by PIL", "[images]") {
    sluice_test::temp_dir d;
    auto g = gen(d.path().string(), {"--format", "raw", "--files", "40", "--classes", "5", "--seed", "4"});
    INFO(g.err);
    REQUIRE(g.status == 0);
    REQUIRE(json_u64(g.out, "records") == 40);
    std::vector<std::string> files;
    std::uint64_t bytes = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(d.path()))
        if (e.is_regular_file()) {
            files.push_back(e.path().string());
            bytes += e.file_size();
            const auto label = e.path().parent_path().filename().string();
            REQUIRE(label.rfind("class-", 0) == 0);  // ImageFolder's layout: the label is the directory
        }
    REQUIRE(files.size() == 40);
    REQUIRE(bytes == json_u64(g.out, "payload_bytes"));
    std::size_t png = 0, jpeg_in_range = 0;
    for (auto& f : files) {
        const auto data = sluice_test::slurp_file(f);
        const auto h = sluice::imaging::read_header({reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
        CHECK(h.width >= 300);
        CHECK(h.width <= 600);
        CHECK(h.height >= 300);
        CHECK(h.height <= 600);
        if (f.ends_with(".png")) ++png;
        else if (data.size() >= 25'000 && data.size() <= 200'000) ++jpeg_in_range;
    }
    CHECK(png == 2);                                  // images 16 and 33
    CHECK(jpeg_in_range >= (files.size() - png) * 8 / 10);  // photo-like sizes, most of them
    if (!have_pil()) {
        WARN("[test skipped] the comparison with PIL needs /usr/bin/python3 with python3-pil and python3-numpy");
        return;
    }
    std::vector<std::string> argv{"/usr/bin/python3", SLUICE_MAKE_IMAGES, "--reference"};
    argv.insert(argv.end(), files.begin(), files.end());
    auto r = run(argv);
    INFO(r.err);
    REQUIRE(r.status == 0);
    for (auto& f : files) {
        INFO(f);
        const auto data = sluice_test::slurp_file(f);
        const auto p = sluice::imaging::decode({reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
        const auto ref = sluice_test::slurp_file(f + ".rgb");
        REQUIRE(ref.size() == p.px.size());
        REQUIRE(std::memcmp(ref.data(), p.px.data(), ref.size()) == 0);
    }
}

TEST_CASE("sluice-probe --images reads loose files and WebDataset shards: every image once, labels, bad ones named or skipped", "[images]") {
    sluice_test::temp_dir d;
    REQUIRE(gen(d / "loose", {"--format", "raw", "--files", "30", "--seed", "2"}).status == 0);
    auto g = gen(d / "shards", {"--format", "tar", "--files", "3", "--records", "10", "--seed", "3"});
    REQUIRE(g.status == 0);
    REQUIRE(json_u64(g.out, "samples") == 30);
    for (std::vector<std::string> args : {std::vector<std::string>{"--images", "train", "--format", "raw", d / "loose"},
                                          {"--images", "eval", "--format", "webdataset", d / "shards", "--float",
                                           "--layout", "nhwc", "--image-size", "96"},
                                          {"--images", "train", "--format", "webdataset", d / "shards", "--epochs", "2",
                                           "--shuffle", "16", "--deterministic", "--decode-threads", "2"}}) {
        args.insert(args.end(), {"--batch", "8"});
        auto r = probe_json(args);
        INFO(r.err << r.out);
        REQUIRE(r.status == 0);
        const bool two = std::find(args.begin(), args.end(), "--epochs") != args.end();
        CHECK(json_u64(r.out, "records") == (two ? 60 : 30));
        CHECK(json_u64(r.out, "corrupt_skipped") == 0);
        CHECK(r.out.find("\"cpu_ms_per_record\"") != std::string::npos);
        CHECK(r.out.find("\"decode_images\"") != std::string::npos);
    }
    // A damaged image in a shard: the error names the shard and the sample; under skip,
    // it is counted and the other 29 arrive.
    const auto shard = d / "shards/shard-000001.tar";
    auto tar = sluice_test::slurp_file(shard);
    const auto at = tar.find("000004.jpg");
    REQUIRE(at != std::string::npos);
    const auto sof = tar.find("\xff\xc0", at + 512);  // its frame header (a baseline JPEG)
    REQUIRE(sof != std::string::npos);
    tar[sof + 4] = 7;  // sample precision 7 bits: libjpeg refuses it
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << tar;
    auto bad = probe_json({"--images", "train", "--format", "webdataset", d / "shards", "--batch", "8"});
    CHECK(bad.status == 1);
    CHECK_THAT(bad.err, Catch::Contains("shard-000001.tar") && Catch::Contains("000004") && Catch::Contains("corrupt JPEG"));
    auto skipped = probe_json({"--images", "train", "--format", "webdataset", d / "shards", "--batch", "8", "--on-corrupt", "skip"});
    INFO(skipped.err);
    REQUIRE(skipped.status == 0);
    CHECK(json_u64(skipped.out, "records") == 29);
    CHECK(json_u64(skipped.out, "corrupt_skipped") == 1);
}

TEST_CASE("the image-input example trains' input side: float32 NCHW batches with labels, through DLPack", "[images]") {
    sluice_test::temp_dir d;
    REQUIRE(gen(d.path().string(), {"--format", "tar", "--files", "2", "--records", "40", "--jpeg-only"}).status == 0);
    auto r = run({SLUICE_IMAGE_INPUT, d / "shard-*.tar", "2"});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("batch: images [64, 3, 224, 224] float32, labels [64]") &&
                          Catch::Contains("160 images in") && Catch::Contains("images/s"));
    auto missing = run({SLUICE_IMAGE_INPUT, d / "nothing-*.tar"});
    CHECK(missing.status == 1);
    CHECK_THAT(missing.err, Catch::Contains("nothing-*.tar"));
}

TEST_CASE("images resume exactly: a run cut after a batch and resumed gives the same images, pixel for pixel", "[images]") {
    sluice_test::temp_dir d;
    const auto counts = d / "counts";
    REQUIRE(gen(d / "shards", {"--format", "tar", "--files", "3", "--records", "12", "--jpeg-only", "--counts", counts})
                .status == 0);
    const std::vector<std::string> args{"--images", "train", "--format", "webdataset", d / "shards", "--batch", "5",
                                        "--epochs", "2", "--shuffle", "7", "--seed", "4", "--deterministic",
                                        "--counts", counts, "--image-size", "64"};
    auto with = [&](std::vector<std::string> more) {
        auto a = args;
        a.insert(a.end(), more.begin(), more.end());
        return a;
    };
    auto whole = probe_json(with({"--emit-keys", d / "whole.keys"}));
    INFO(whole.err);
    REQUIRE(whole.status == 0);
    REQUIRE(json_u64(whole.out, "records") == 72);
    for (std::string cut : {"3", "8"}) {
        INFO("cut after " << cut << " batches");
        auto a = probe_json(with({"--stop-after-batches", cut, "--save-state", d / "state", "--emit-keys", d / "a.keys"}));
        REQUIRE(a.status == 0);
        auto b = probe_json(with({"--resume", d / "state", "--emit-keys", d / "b.keys"}));
        INFO(b.err);
        REQUIRE(b.status == 0);
        // The same images (keys), and the same pixels: the crops and flips of the
        // resumed run are those the whole run drew (crc32 summed over every image).
        CHECK(sluice_test::slurp_file(d / "a.keys") + sluice_test::slurp_file(d / "b.keys") ==
              sluice_test::slurp_file(d / "whole.keys"));
        CHECK(json_u64(a.out, "crc_sum") + json_u64(b.out, "crc_sum") == json_u64(whole.out, "crc_sum"));
        CHECK(json_u64(a.out, "records") + json_u64(b.out, "records") == 72);
    }
}
