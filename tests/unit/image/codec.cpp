#include <sluice/image/codec.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace {

using sluice::imaging::plane;
using sluice::imaging::rect;

/// The images of tests/support/make_images.py with PIL's decoding of each, made once per
/// test binary; null when Debian's python3-pil (with numpy) is missing.
const sluice_test::temp_dir* images() {
    static std::unique_ptr<sluice_test::temp_dir> dir = [] {
        auto d = std::make_unique<sluice_test::temp_dir>();
        auto r = sluice_test::run({"/usr/bin/python3", SLUICE_MAKE_IMAGES, d->path().string()});
        if (r.status != 0) {
            UNSCOPED_INFO("make_images.py: " << r.err);
            return std::unique_ptr<sluice_test::temp_dir>();
        }
        return d;
    }();
    return dir.get();
}

#define NEED_IMAGES()                                                                                 \
    if (!images()) {                                                                                  \
        WARN("[test skipped] needs /usr/bin/python3 with PIL and numpy (python3-pil python3-numpy)"); \
        return;                                                                                       \
    }

std::vector<std::uint8_t> file(const std::string& name) {
    auto s = sluice_test::slurp_file(*images() / name);
    return {s.begin(), s.end()};
}
std::pair<std::uint32_t, std::uint32_t> size_of(const std::string& name) {
    std::istringstream in(sluice_test::slurp_file(*images() / name));
    std::uint32_t w = 0, h = 0;
    in >> w >> h;
    return {w, h};
}
std::span<const std::uint8_t> span(const std::vector<std::uint8_t>& v) { return {v.data(), v.size()}; }

/// The largest difference between `got` and region r of the w-wide reference.
int max_diff(const plane& got, const std::vector<std::uint8_t>& ref, std::uint32_t ref_w, rect r) {
    int m = 0;
    for (std::uint32_t y = 0; y < r.h; ++y)
        for (std::uint32_t x = 0; x < r.w * 3; ++x)
            m = std::max(m, std::abs(int(got.px[std::size_t(y) * got.w * 3 + x]) -
                                     int(ref[(std::size_t(r.y + y) * ref_w + r.x) * 3 + x])));
    return m;
}

const std::vector<std::string> good = {
    "baseline.jpg", "yuv444.jpg", "progressive.jpg", "gray.jpg",    "cmyk.jpg",    "tiny.jpg",   "restart.jpg",
    "progressive-restart.jpg",   "rgb.png",         "palette.png", "rgba.png",    "gray.png",   "gray16.png",
    "exif2.jpg",    "exif3.jpg", "exif5.jpg",       "exif6.jpg",   "exif8.jpg",  "exif3.png",  "exif6.png"};

}  // namespace

TEST_CASE("decoded pixels equal PIL's for every kind of JPEG and PNG, EXIF orientation applied", "[image]") {
    NEED_IMAGES();
    for (auto& name : good) {
        INFO(name);
        if (!std::filesystem::exists(*images() / name)) {
            WARN("[test skipped] " << name << " was not made (restart markers need cjpeg: libjpeg-turbo-progs)");
            continue;
        }
        const auto data = file(name);
        const auto [w, h] = size_of(name + ".size");
        const auto h0 = sluice::imaging::read_header(span(data));
        CHECK(h0.width == w);
        CHECK(h0.height == h);
        const plane p = sluice::imaging::decode(span(data));
        REQUIRE(p.w == w);
        REQUIRE(p.h == h);
        REQUIRE(p.px.size() == std::size_t(w) * h * 3);
        // Bit for bit: the same libjpeg-turbo (ISLOW, fancy upsampling) and, for PNG, a
        // lossless format read by two decoders. CMYK goes through one rounding of ours.
        REQUIRE(max_diff(p, file(name + ".rgb"), w, {0, 0, w, h}) <= (name == "cmyk.jpg" ? 1 : 0));
    }
}

TEST_CASE("a crop decodes only its region, and equals the same region of the whole image", "[image]") {
    NEED_IMAGES();
    for (auto& name : good) {
        INFO(name);
        if (!std::filesystem::exists(*images() / name)) continue;
        const auto data = file(name);
        const auto ref = file(name + ".rgb");
        const auto [w, h] = size_of(name + ".size");
        sluice::imaging::scratch s;
        for (rect r : {rect{0, 0, w, h}, rect{w / 3, h / 4, w / 2, h / 2}, rect{w - 9, h - 7, 9, 7}, rect{1, 2, 1, 1},
                       rect{w / 5, 0, 3 * w / 5, h}}) {
            INFO("crop " << r.x << "," << r.y << " " << r.w << "x" << r.h);
            plane p;
            sluice::imaging::decode(span(data), r, r.w, r.h, p, s);  // no scaling: min size is the crop's
            REQUIRE(p.w == r.w);
            REQUIRE(p.h == r.h);
            REQUIRE(max_diff(p, ref, w, r) <= (name == "cmyk.jpg" ? 1 : 0));
        }
    }
}

TEST_CASE("JPEG crops at least twice the output decode at 1/2, 1/4 or 1/8 scale, as PIL's draft does", "[image]") {
    NEED_IMAGES();
    for (std::string name : {"baseline.jpg", "yuv444.jpg", "progressive.jpg", "gray.jpg", "restart.jpg"}) {
        INFO(name);
        if (!std::filesystem::exists(*images() / name)) continue;
        const auto data = file(name);
        const auto [w, h] = size_of(name + ".size");
        const auto [qw, qh] = size_of(name + ".q4.size");
        sluice::imaging::scratch s;
        plane p;
        // The whole 500x375 image, wanted at 110x80: 1/4 keeps 125x94, 1/8 would not.
        sluice::imaging::decode(span(data), {0, 0, w, h}, 110, 80, p, s);
        REQUIRE(p.w == qw);
        REQUIRE(p.h == qh);
        REQUIRE(max_diff(p, file(name + ".q4.rgb"), qw, {0, 0, qw, qh}) == 0);
        // A crop at 1/2: its region of the half-scale image (rounded out to whole pixels).
        sluice::imaging::decode(span(data), {100, 60, 300, 200}, 150, 100, p, s);
        REQUIRE(p.w == 150);
        REQUIRE(p.h == 100);
        // A PNG never scales: it has no DCT.
        if (name == "baseline.jpg") {
            const auto png = file("rgb.png");
            sluice::imaging::decode(span(png), {0, 0, w, h}, 110, 80, p, s);
            REQUIRE(p.w == w);
        }
    }
}

TEST_CASE("bad images are errors that say why, never a crash or a huge allocation", "[image]") {
    NEED_IMAGES();
    struct bad_case {
        std::string file, says;
    };
    for (auto& c : std::vector<bad_case>{{"bad-truncated.jpg", "corrupt JPEG"},
                                         {"bad-corrupt.jpg", "corrupt JPEG"},
                                         {"bad-header.jpg", "corrupt JPEG"},
                                         {"bad-empty.jpg", "empty (0 bytes)"},
                                         {"bad-animated.gif", "a GIF, which is not supported"},
                                         {"bad-truncated.png", "corrupt PNG"},
                                         {"bad-bomb.jpg", "60000x60000 pixels is over max_pixels"},
                                         {"bad-bomb.png", "60000x60000 pixels is over max_pixels"}}) {
        INFO(c.file);
        const auto data = file(c.file);
        REQUIRE_THROWS_AS(sluice::imaging::decode(span(data)), sluice::imaging::bad_image);
        REQUIRE_THROWS_WITH(sluice::imaging::decode(span(data)), Catch::Contains(c.says));
    }
    // A limit of the user's: the good 500x375 image over 100,000 pixels.
    const auto data = file("baseline.jpg");
    REQUIRE_THROWS_WITH(sluice::imaging::decode(span(data), 100'000), Catch::Contains("over max_pixels (100000)"));
    sluice::imaging::scratch s;
    plane p;
    REQUIRE_THROWS_WITH(sluice::imaging::decode(span(data), {400, 300, 200, 100}, 1, 1, p, s),
                        Catch::Contains("crop outside the image"));
}

TEST_CASE("JPEG warnings about metadata are ignored, damaged data and too many scans are errors", "[image]") {
    NEED_IMAGES();
    const auto base = file("baseline.jpg");
    const plane want = sluice::imaging::decode(span(base));
    // PIL's JPEG starts with SOI and a JFIF APP0 segment: FF D8 FF E0 len 'JFIF' 0 major minor.
    REQUIRE(base.size() > 20);
    REQUIRE(base[2] == 0xFF);
    REQUIRE(base[3] == 0xE0);
    REQUIRE(std::string(base.begin() + 6, base.begin() + 10) == "JFIF");
    // An unknown JFIF revision (libjpeg warns, decodes the same pixels).
    auto revised = base;
    revised[11] = 3;
    // Stray bytes between the APP0 segment and the next marker (libjpeg warns "extraneous
    // bytes before marker", skips them, decodes the same pixels).
    auto stray = base;
    const std::size_t after_app0 = 4 + (std::size_t(base[4]) << 8 | base[5]);
    stray.insert(stray.begin() + std::ptrdiff_t(after_app0), {0x00, 0x17, 0x2A});
    for (auto* v : {&revised, &stray}) {
        const plane got = sluice::imaging::decode(span(*v));
        REQUIRE(got.w == want.w);
        REQUIRE(got.h == want.h);
        CHECK(got.px == want.px);
    }
    // Damaged entropy-coded data still fails (bad-corrupt.jpg in the test above); so does a
    // progressive JPEG with more scans than the limit (PIL's has about ten).
    const auto prog = file("progressive.jpg");
    sluice::imaging::scratch s;
    plane p;
    const auto [w, h] = size_of("progressive.jpg.size");
    sluice::imaging::decode(span(prog), {0, 0, w, h}, w, h, p, s);
    CHECK(p.w == w);
    s.max_scans = 2;
    REQUIRE_THROWS_WITH(sluice::imaging::decode(span(prog), {0, 0, w, h}, w, h, p, s),
                        Catch::Contains("corrupt JPEG: more than 2 scans"));
}

TEST_CASE("EXIF orientation is read from the APP1 block, and a malformed one is ignored", "[image]") {
    // Big-endian TIFF header, IFD0 with one entry: orientation (0x0112), SHORT, 1, value 6.
    const std::uint8_t exif[] = {'E', 'x', 'i', 'f', 0, 0, 'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1,
                                 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0};
    REQUIRE(sluice::imaging::detail::exif_orientation(exif, sizeof exif) == 6);
    REQUIRE(sluice::imaging::detail::exif_orientation(exif, 20) == 1);  // cut inside the entry
    std::uint8_t bad[sizeof exif];
    std::memcpy(bad, exif, sizeof exif);
    bad[13] = 0xF0;  // IFD offset past the end
    REQUIRE(sluice::imaging::detail::exif_orientation(bad, sizeof bad) == 1);
    bad[13] = 8;
    bad[25] = 9;  // not an orientation
    REQUIRE(sluice::imaging::detail::exif_orientation(bad, sizeof bad) == 1);
}
