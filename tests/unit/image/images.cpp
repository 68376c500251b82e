#include <sluice/image/images.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <sluice/core/pipeline.hpp>
#include <sluice/cuda/dlpack.hpp>
#include <sluice/cuda/to_device.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/formats/tar.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/io/list.hpp>
#include <sluice/io/local.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/plan.hpp>
#include <sluice/ops/shuffle.hpp>

#include <cmath>
#include <map>

namespace {

using sluice::imaging::rect;

/// A w x h RGB image, dark grey (20) or with `textured` a dark pattern (20-69, every
/// crop of it different), with a bright square at (x, y), side n, as PNG bytes
/// (lossless, so positions and colours survive exactly until the resize).
std::string png_with_square(std::uint32_t w, std::uint32_t h, std::uint32_t x, std::uint32_t y, std::uint32_t n,
                            bool textured = false) {
    std::vector<std::uint8_t> px(std::size_t(w) * h * 3, 20);
    if (textured)
        for (std::uint32_t j = 0; j < h; ++j)
            for (std::uint32_t i = 0; i < w * 3; ++i) px[std::size_t(j) * w * 3 + i] = std::uint8_t(20 + (i * 7 + j * 13 + i * j) % 50);
    for (std::uint32_t j = y; j < y + n; ++j)
        for (std::uint32_t i = x; i < x + n; ++i) {
            auto* p = &px[(std::size_t(j) * w + i) * 3];
            p[0] = 250, p[1] = 240, p[2] = 10;
        }
    spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    spng_ihdr ihdr{};
    ihdr.width = w, ihdr.height = h, ihdr.bit_depth = 8, ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
    spng_set_ihdr(ctx, &ihdr);
    sluice_test::must(spng_encode_image(ctx, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0, "encode");
    std::size_t n_out = 0;
    int rc = 0;
    auto* buf = static_cast<char*>(spng_get_png_buffer(ctx, &n_out, &rc));
    std::string out(buf, n_out);
    std::free(buf);
    spng_ctx_free(ctx);
    return out;
}

/// The centroid of the bright pixels of a w x h HWC image.
std::pair<double, double> centroid(const std::byte* p, std::uint32_t w, std::uint32_t h) {
    double sx = 0, sy = 0, n = 0;
    for (std::uint32_t y = 0; y < h; ++y)
        for (std::uint32_t x = 0; x < w; ++x)
            if (std::to_integer<int>(p[(std::size_t(y) * w + x) * 3]) > 135) sx += x, sy += y, ++n;
    return {sx / n, sy / n};
}

std::vector<sluice::image> decode_all(const std::vector<sluice::record>& recs, sluice::image_options o) {
    std::vector<sluice::image> out;
    for (auto& im : sluice::pipeline(sluice::from(recs) | sluice::decode_images(o))) out.push_back(im);
    return out;
}

std::shared_ptr<const sluice::shard> shard_of(const std::string& url, std::uint32_t epoch = 0) {
    auto s = std::make_shared<sluice::shard>();
    s->url = url;
    s->epoch = epoch;
    return s;
}

sluice::record rec(const std::string& data, std::shared_ptr<const sluice::shard> s, std::uint64_t index = 0) {
    return {sluice::bytes::copy_of(data), std::move(s), index, 0};
}

std::uint64_t hash_of(const sluice::bytes& b) { return sluice::detail::fnv1a(sluice::detail::fnv_offset, b.view()); }

}  // namespace

TEST_CASE("evaluation geometry is torchvision's Resize + CenterCrop, seen on where a square lands", "[image]") {
    // 500x375 with a 40 px square centred at (250, 187): the centre stays the centre.
    const auto png = png_with_square(500, 375, 230, 167, 40);
    const auto r = sluice::imaging::choose_center_crop(500, 375, 256, 224, 224);
    // Resize(256): 341x256; CenterCrop(224): left round(58.5) = 58, top 16; in the
    // original, scale 375/256: 85 and 23, 328 wide and high.
    CHECK(r.x == 85);
    CHECK(r.y == 23);
    CHECK(r.w == 328);
    CHECK(r.h == 328);
    auto out = decode_all({rec(png, shard_of("a.png"))}, {.mode = sluice::image_mode::eval, .size = 224});
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].width == 224);
    REQUIRE(out[0].pixels.size() == 224 * 224 * 3);
    auto [cx, cy] = centroid(out[0].pixels.data(), 224, 224);
    const double s = 224.0 / 328;  // crop -> output
    CHECK(std::abs(cx - ((249.5 - 85) * s - 0.5)) < 1.0);
    CHECK(std::abs(cy - ((186.5 - 23) * s - 0.5)) < 1.0);
}

TEST_CASE("training images are the same in every run, ordered or not, and differ by epoch and seed", "[image]") {
    std::vector<sluice::record> recs;
    for (std::uint32_t e = 0; e < 2; ++e) {
        auto s = shard_of("images.tar", e);
        for (std::uint32_t i = 0; i < 12; ++i) recs.push_back(rec(png_with_square(160, 120, 10 * i, 5 * i, 30, true), s, i));
    }
    auto digest = [&](sluice::image_options o) {
        std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> by_key;
        for (auto& im : decode_all(recs, o)) by_key[{im.source->epoch, im.index}] = hash_of(im.pixels);
        return by_key;
    };
    const sluice::image_options base{.size = 64, .seed = 9};
    const auto a = digest(base);
    REQUIRE(a.size() == 24);
    auto unordered = base;
    unordered.concurrency = 3;
    unordered.order = sluice::ordering::unordered;
    REQUIRE(digest(unordered) == a);  // which worker, and when, does not matter
    auto reseeded = base;
    reseeded.seed = 10;
    const auto b = digest(reseeded);
    int same = 0, across_epochs = 0;
    for (auto& [k, v] : a) {
        same += b.at(k) == v;
        if (k.first == 0) across_epochs += a.at({1, k.second}) == v;
    }
    CHECK(same == 0);           // another seed, other crops
    CHECK(across_epochs == 0);  // the same image in another epoch: another crop
}

TEST_CASE("flip mirrors the image: a square left of centre lands right of it", "[image]") {
    const auto png = png_with_square(200, 200, 20, 90, 20);
    // Full-image crops (scale 1, ratio 1) so only the flip varies; some keys flip, some not.
    sluice::image_options o{.size = 100, .crop = {.scale_min = 1.0, .scale_max = 1.0, .ratio_min = 1.0, .ratio_max = 1.0}};
    o.seed = 3;
    int left = 0, right = 0;
    std::vector<sluice::record> recs;
    for (std::uint64_t i = 0; i < 16; ++i) recs.push_back(rec(png, shard_of("f"), i));
    for (auto& im : decode_all(recs, o)) {
        auto [cx, cy] = centroid(im.pixels.data(), 100, 100);
        CHECK(std::abs(cy - 49.5) < 1.0);
        if (std::abs(cx - 14.5) < 1.0) ++left;
        else if (std::abs(cx - 84.5) < 1.0) ++right;
        else FAIL("square at x " << cx);
    }
    CHECK(left > 0);
    CHECK(right > 0);
    o.flip = false;
    for (auto& im : decode_all(recs, o)) CHECK(std::abs(centroid(im.pixels.data(), 100, 100).first - 14.5) < 1.0);
}

TEST_CASE("a bad image names the shard, the key and the reason, or is skipped and counted", "[image]") {
    const auto good = png_with_square(64, 64, 0, 0, 8);
    auto s = shard_of("/data/train-0003.tar");
    std::vector<sluice::record> recs = {rec(good, s, 0), rec("GIF89a....", s, 1), rec(good.substr(0, 60), s, 2),
                                        rec(good, s, 3)};
    sluice::image_options o{.size = 32};
    REQUIRE_THROWS_WITH(decode_all(recs, o), Catch::Contains("/data/train-0003.tar") && Catch::Contains("#1") &&
                                                 Catch::Contains("GIF, which is not supported"));
    o.on_corrupt = sluice::on_corrupt::skip;
    std::vector<std::string> skipped;
    o.on_skip = [&](const sluice::source_error& e) { skipped.push_back(e.what()); };
    sluice::pipeline p(sluice::from(recs) | sluice::decode_images(o));
    std::vector<std::uint64_t> got;
    for (auto& im : p) got.push_back(im.index);
    CHECK(got == std::vector<std::uint64_t>{0, 3});
    REQUIRE(skipped.size() == 2);
    CHECK_THAT(skipped[1], Catch::Contains("#2") && Catch::Contains("corrupt PNG"));
    CHECK(sluice_test::counter(p.figures(), "decode_images", "corrupt") == 2);
    // An output of no pixels is the caller's mistake, refused where the stage is made.
    REQUIRE_THROWS_WITH(sluice::decode_images({.size = 0}), Catch::Contains(".size must be at least 1"));
}

TEST_CASE("webdataset samples: the image field decoded, the cls field is the label, batches are tensors", "[image]") {
    sluice_test::temp_dir d;
    std::string tar;
    for (int i = 0; i < 10; ++i) {
        const std::string key = "sample" + std::to_string(i);
        sluice::append_tar_file(tar, key + ".png", png_with_square(80, 60, 5 * i, 3 * i, 16));
        sluice::append_tar_file(tar, key + ".cls", std::to_string(100 + i) + "\n");
    }
    sluice::end_tar(tar);
    const auto path = d.write("shard-0.tar", tar);
    for (auto layout : {sluice::tensor_layout_kind::nchw, sluice::tensor_layout_kind::nhwc}) {
        const sluice::image_batch_options bo{.size = 4, .layout = layout, .dtype = sluice::pixel_type::float32,
                                             .mean = {0.5f, 0.25f, 0.f}, .std = {0.5f, 0.25f, 2.f}};
        sluice::pipeline p(sluice::list(path) | sluice::plan() | sluice::read() | sluice::webdataset() |
                           sluice::decode_images({.mode = sluice::image_mode::eval, .size = 48, .resize = 48}) |
                           sluice::batch_images(bo));
        std::vector<std::int64_t> labels;
        std::size_t batches = 0;
        for (auto& b : p) {
            ++batches;
            labels.insert(labels.end(), b.labels.begin(), b.labels.end());
            const auto n = std::int64_t(b.size());
            REQUIRE(b.data.size() == std::size_t(n) * 48 * 48 * 3 * sizeof(float));
            auto t = sluice::to_dlpack(b);
            REQUIRE(t->dl_tensor.ndim == 4);
            REQUIRE(t->dl_tensor.dtype.code == kDLFloat);
            REQUIRE(t->dl_tensor.dtype.bits == 32);
            const std::vector<std::int64_t> want = layout == sluice::tensor_layout_kind::nchw
                                                       ? std::vector<std::int64_t>{n, 3, 48, 48}
                                                       : std::vector<std::int64_t>{n, 48, 48, 3};
            REQUIRE(std::vector<std::int64_t>(t->dl_tensor.shape, t->dl_tensor.shape + 4) == want);
            // The background (20, 20, 20) normalised per channel: (20/255 - mean) / std.
            const float* f = reinterpret_cast<const float*>(b.data.data());
            const std::size_t last = 48 * 48 - 1;  // bottom-right pixel: background in every image
            for (int c = 0; c < 3; ++c) {
                const float want_v = (20.f / 255 - bo.mean[c]) / bo.std[c];
                const float got = layout == sluice::tensor_layout_kind::nchw ? f[c * 48 * 48 + last] : f[last * 3 + c];
                CHECK(std::abs(got - want_v) < 1e-5f);
            }
            auto l = sluice::labels_to_dlpack(b);
            REQUIRE(l->dl_tensor.ndim == 1);
            REQUIRE(l->dl_tensor.shape[0] == n);
            REQUIRE(static_cast<const std::int64_t*>(l->dl_tensor.data)[0] == b.labels[0]);
        }
        CHECK(batches == 3);  // 4 + 4 + 2
        CHECK(labels == std::vector<std::int64_t>{100, 101, 102, 103, 104, 105, 106, 107, 108, 109});
    }
}

TEST_CASE("a WebDataset .json field gives the label through .label_key, and a bad one names the field, the key and why", "[image]") {
    sluice_test::temp_dir d;
    std::string tar;
    const std::vector<std::string> meta = {
        R"({"label": 7, "caption": "a \"red\" square"})",
        R"({"source": {"label": 99, "tags": [1, {"label": 98}]}, "label": -3})",  // nested members are not the label
        R"(  {"cls": 1, "label":12345678901}  )",
    };
    for (std::size_t i = 0; i < meta.size(); ++i) {
        const std::string key = "s" + std::to_string(i);
        sluice::append_tar_file(tar, key + ".png", png_with_square(40, 30, 2, 2, 8));
        sluice::append_tar_file(tar, key + ".json", meta[i]);
    }
    sluice::end_tar(tar);
    const auto path = d.write("meta.tar", tar);
    auto labels_of = [](const std::string& shard, sluice::image_options o) {
        std::vector<std::int64_t> labels;
        sluice::pipeline p(sluice::list(shard) | sluice::plan() | sluice::read() | sluice::webdataset() |
                           sluice::decode_images(std::move(o)));
        for (auto& im : p) labels.push_back(im.label);
        return labels;
    };
    CHECK(labels_of(path, {.size = 16, .label_field = "json"}) == std::vector<std::int64_t>{7, -3, 12345678901});

    std::string bad;
    sluice::append_tar_file(bad, "a.png", png_with_square(40, 30, 2, 2, 8));
    sluice::append_tar_file(bad, "a.json", R"({"caption": "no label here"})");
    sluice::end_tar(bad);
    const auto missing = d.write("missing.tar", bad);
    REQUIRE_THROWS_WITH(labels_of(missing, {.size = 16, .label_field = "json"}),
                        Catch::Contains("missing.tar#a") && Catch::Contains("'json'") && Catch::Contains("no member \"label\""));
    bad.clear();
    sluice::append_tar_file(bad, "b.png", png_with_square(40, 30, 2, 2, 8));
    sluice::append_tar_file(bad, "b.json", R"({"label": 3, "x": [1, 2)");
    sluice::end_tar(bad);
    const auto broken = d.write("broken.tar", bad);
    // The label comes before the damage: the reader stops at the member it needs.
    CHECK(labels_of(broken, {.size = 16, .label_field = "json"}) == std::vector<std::int64_t>{3});
    REQUIRE_THROWS_WITH(labels_of(broken, {.size = 16, .label_field = "json", .label_key = "y"}),
                        Catch::Contains("broken.tar#b") && Catch::Contains("not valid JSON") && Catch::Contains("at byte"));
    bad.clear();
    sluice::append_tar_file(bad, "c.png", png_with_square(40, 30, 2, 2, 8));
    sluice::append_tar_file(bad, "c.json", R"({"label": "seven"})");
    sluice::end_tar(bad);
    const auto text = d.write("text.tar", bad);
    REQUIRE_THROWS_WITH(labels_of(text, {.size = 16, .label_field = "json"}),
                        Catch::Contains("text.tar#c") && Catch::Contains("member \"label\" is not an integer"));
}

TEST_CASE("image batches are collated straight into to_device's staging memory, and keep their tensor shape there", "[image]") {
    auto eng = std::make_shared<sluice::host_engine>();
    std::vector<sluice::record> recs;
    auto s = shard_of("staged.tar");
    for (std::uint64_t i = 0; i < 12; ++i) recs.push_back(rec(png_with_square(90, 70, i, i, 10), s, i));
    for (unsigned workers : {1u, 3u}) {
        sluice::pipeline p(sluice::from(recs) | sluice::decode_images({.size = 32, .concurrency = 2}) |
                           sluice::batch_images({.size = 5, .concurrency = workers}) | sluice::to_device({}, eng));
        std::size_t images = 0;
        for (auto& b : p) {
            b.synchronize();
            auto t = b.dlpack();
            REQUIRE(t->dl_tensor.ndim == 4);
            REQUIRE(t->dl_tensor.shape[0] == std::int64_t(b.size()));
            REQUIRE(t->dl_tensor.shape[1] == 3);
            REQUIRE(t->dl_tensor.dtype.code == kDLUInt);
            REQUIRE(b.host().labels.size() == b.size());
            images += b.size();
        }
        CHECK(images == 12);
        // No batch needed the slower copy from pageable memory: every one was made in
        // the engine's staging memory (pinned, with CUDA).
        bool counted = false;  // the stage counts them (0 here is a count, not an absence)
        for (auto& st : p.figures().stages)
            for (auto& [name, v] : st.counters) counted |= st.name == "to_device" && name == "unstaged";
        REQUIRE(counted);
        CHECK(sluice_test::counter(p.figures(), "to_device", "unstaged") == 0);
    }
}

TEST_CASE("NCHW and NHWC batches hold the same pixels, transposed", "[image]") {
    std::vector<sluice::record> recs;
    auto s = shard_of("layouts.tar");
    for (std::uint64_t i = 0; i < 6; ++i) recs.push_back(rec(png_with_square(70 + i, 50, i, 2 * i, 12, true), s, i));
    auto batch_of = [&](sluice::tensor_layout_kind layout) {
        std::vector<sluice::host_batch> out;
        for (auto& b : sluice::pipeline(sluice::from(recs) |
                                        sluice::decode_images({.mode = sluice::image_mode::eval, .size = 40, .resize = 46}) |
                                        sluice::batch_images({.size = 6, .layout = layout})))
            out.push_back(b);
        REQUIRE(out.size() == 1);
        return out[0];
    };
    const auto nchw = batch_of(sluice::tensor_layout_kind::nchw), nhwc = batch_of(sluice::tensor_layout_kind::nhwc);
    REQUIRE(nchw.data.size() == 6 * 40 * 40 * 3);
    REQUIRE(nhwc.data.size() == nchw.data.size());
    const auto* a = reinterpret_cast<const std::uint8_t*>(nchw.data.data());
    const auto* b = reinterpret_cast<const std::uint8_t*>(nhwc.data.data());
    const std::size_t px = 40 * 40;
    std::size_t differ = 0;
    for (std::size_t n = 0; n < 6; ++n)
        for (std::size_t p = 0; p < px; ++p)
            for (std::size_t c = 0; c < 3; ++c) differ += a[n * 3 * px + c * px + p] != b[n * 3 * px + p * 3 + c];
    CHECK(differ == 0);
    CHECK(std::memcmp(a, b, nchw.data.size()) != 0);  // a transposition, not the same bytes
}

TEST_CASE("float32 collation is (pixel / 255 - mean) / std for every element, in both layouts and odd sizes", "[image]") {
    auto pool = sluice::buffer_pool::create();
    for (std::uint32_t side : {37u, 224u}) {  // 37 x 37 x 3 is no multiple of the 48-value blocks
        std::vector<sluice::image> g;
        for (int i = 0; i < 3; ++i) {
            sluice::image im;
            im.width = im.height = side;
            std::string px(std::size_t(side) * side * 3, '\0');
            for (std::size_t k = 0; k < px.size(); ++k) px[k] = char((k * 131 + std::size_t(i) * 17) % 256);
            im.pixels = sluice::bytes::copy_of(px);
            im.label = i;
            g.push_back(std::move(im));
        }
        for (auto layout : {sluice::tensor_layout_kind::nchw, sluice::tensor_layout_kind::nhwc}) {
            INFO("side " << side << (layout == sluice::tensor_layout_kind::nchw ? " nchw" : " nhwc"));
            const sluice::image_batch_options o{.size = 3, .layout = layout, .dtype = sluice::pixel_type::float32,
                                                .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};
            auto b = sluice::detail::collate_images(g, *pool, o);
            const std::size_t px = std::size_t(side) * side;
            REQUIRE(b.data.size() == 3 * px * 3 * sizeof(float));
            const float* f = reinterpret_cast<const float*>(b.data.data());
            float worst = 0;
            for (std::size_t i = 0; i < 3; ++i) {
                const auto* src = reinterpret_cast<const std::uint8_t*>(g[i].pixels.data());
                for (std::size_t p = 0; p < px; ++p)
                    for (int c = 0; c < 3; ++c) {
                        const float want = (src[p * 3 + c] / 255.f - o.mean[c]) / o.std[c];
                        const float got = layout == sluice::tensor_layout_kind::nchw ? f[i * px * 3 + c * px + p]
                                                                                     : f[i * px * 3 + p * 3 + c];
                        worst = std::max(worst, std::abs(got - want));
                    }
            }
            CHECK(worst < 1e-5f);
            CHECK(b.labels == std::vector<std::int64_t>{0, 1, 2});
        }
    }
}
