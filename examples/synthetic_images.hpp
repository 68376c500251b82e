#pragma once
// Synthetic photos for sluice-gen --images: pictures with the detail of real ones (smooth
// colour fields, shapes with edges, grain), so JPEG sizes and decode costs are those of
// photos: 300-600 px a side, 40-150 KB at quality 85-95. Image i of a dataset is a pure
// function of (seed, i). Its label c (of C classes) sets the background's hue, so a
// model can learn labels from colour (the trainer examples' "learnable" data).
// Variants, by index: every 10th progressive, every 7th 4:4:4, every 13th grayscale,
// every 17th a PNG instead of a JPEG.

#include <sluice/core/detail/random.hpp>
#include <sluice/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <spng.h>

namespace sluice_gen {

struct synthetic_image {
    std::string bytes;       // the encoded file
    std::string ext;         // "jpg" or "png"
    std::uint64_t label = 0;
    std::uint32_t width = 0, height = 0;
};

inline void hue_to_rgb(double h, double& r, double& g, double& b) {  // h in [0, 1), full saturation
    const double x = h * 6;
    r = std::clamp(std::abs(x - 3) - 1, 0.0, 1.0);
    g = std::clamp(2 - std::abs(x - 2), 0.0, 1.0);
    b = std::clamp(2 - std::abs(x - 4), 0.0, 1.0);
}

inline std::string encode_jpeg(const std::vector<std::uint8_t>& px, std::uint32_t w, std::uint32_t h, bool gray,
                               int quality, bool progressive, bool yuv444) {
    jpeg_compress_struct c{};
    jpeg_error_mgr err{};
    c.err = jpeg_std_error(&err);  // our own pixels: an error here is a bug, exit() is fine
    jpeg_create_compress(&c);
    unsigned char* out = nullptr;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = w;
    c.image_height = h;
    c.input_components = gray ? 1 : 3;
    c.in_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (yuv444 && !gray) c.comp_info[0].h_samp_factor = c.comp_info[0].v_samp_factor = 1;
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    std::vector<std::uint8_t> row(std::size_t(w) * 3);
    while (c.next_scanline < h) {
        const std::uint8_t* src = px.data() + std::size_t(c.next_scanline) * w * 3;
        if (gray)
            for (std::uint32_t x = 0; x < w; ++x)
                row[x] = std::uint8_t((src[x * 3] * 77 + src[x * 3 + 1] * 150 + src[x * 3 + 2] * 29) >> 8);
        else
            std::copy(src, src + std::size_t(w) * 3, row.begin());
        JSAMPROW r[1] = {row.data()};
        jpeg_write_scanlines(&c, r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    std::string s(reinterpret_cast<char*>(out), n);
    std::free(out);
    return s;
}

inline std::string encode_png(const std::vector<std::uint8_t>& px, std::uint32_t w, std::uint32_t h) {
    spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    spng_ihdr ihdr{};
    ihdr.width = w;
    ihdr.height = h;
    ihdr.bit_depth = 8;
    ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
    spng_set_ihdr(ctx, &ihdr);
    int rc = spng_encode_image(ctx, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    std::size_t n = 0;
    void* buf = rc == 0 ? spng_get_png_buffer(ctx, &n, &rc) : nullptr;
    spng_ctx_free(ctx);
    if (!buf) throw sluice::error(std::string("sluice-gen: PNG encoding failed: ") + spng_strerror(rc));
    std::string s(static_cast<char*>(buf), n);
    std::free(buf);
    return s;
}

/// Image `i` of a dataset made with `seed`, labelled among `classes`; with jpeg_only, the
/// PNG variant is a JPEG too (benchmarks against peers that read JPEG only).
inline synthetic_image make_image(std::uint64_t seed, std::uint64_t i, std::uint64_t classes, bool jpeg_only = false) {
    sluice::detail::rng r(sluice::detail::mix(seed, i));
    synthetic_image img;
    img.label = r.below(classes);
    const std::uint32_t w = 300 + std::uint32_t(r.below(301)), h = 300 + std::uint32_t(r.below(301));
    img.width = w, img.height = h;
    // Background: the label's hue, shaded by two slow waves.
    double br, bg, bb;
    hue_to_rgb((double(img.label) + 0.5) / double(classes), br, bg, bb);
    const double fx = 0.005 + double(r.below(1000)) * 2e-5, fy = 0.005 + double(r.below(1000)) * 2e-5;
    std::vector<std::uint8_t> px(std::size_t(w) * h * 3);
    for (std::uint32_t y = 0; y < h; ++y)
        for (std::uint32_t x = 0; x < w; ++x) {
            const double shade = 0.55 + 0.25 * std::sin(x * fx * 6.28) * std::cos(y * fy * 6.28);
            auto* p = &px[(std::size_t(y) * w + x) * 3];
            p[0] = std::uint8_t(40 + 180 * br * shade);
            p[1] = std::uint8_t(40 + 180 * bg * shade);
            p[2] = std::uint8_t(40 + 180 * bb * shade);
        }
    // Shapes: discs and boxes of other colours, with hard edges.
    const unsigned shapes = 6 + unsigned(r.below(10));
    for (unsigned s = 0; s < shapes; ++s) {
        const std::uint32_t cx = std::uint32_t(r.below(w)), cy = std::uint32_t(r.below(h));
        const std::uint32_t rad = 10 + std::uint32_t(r.below(std::min(w, h) / 4));
        const std::uint8_t col[3] = {std::uint8_t(r.below(256)), std::uint8_t(r.below(256)), std::uint8_t(r.below(256))};
        const bool disc = r.below(2) == 0;
        for (std::uint32_t y = cy > rad ? cy - rad : 0; y < std::min(h, cy + rad); ++y)
            for (std::uint32_t x = cx > rad ? cx - rad : 0; x < std::min(w, cx + rad); ++x) {
                const double dx = double(x) - cx, dy = double(y) - cy;
                if (disc && dx * dx + dy * dy > double(rad) * rad) continue;
                auto* p = &px[(std::size_t(y) * w + x) * 3];
                for (int k = 0; k < 3; ++k) p[k] = std::uint8_t((p[k] + 3 * col[k]) / 4);
            }
    }
    // Grain: what makes a photo's JPEG 40-150 KB rather than 10.
    const int grain = 6 + int(r.below(10));
    for (auto& v : px) v = std::uint8_t(std::clamp(int(v) + int(r.below(2 * grain + 1)) - grain, 0, 255));
    if (i % 17 == 16 && !jpeg_only) {
        img.ext = "png";
        img.bytes = encode_png(px, w, h);
    } else {
        img.ext = "jpg";
        img.bytes = encode_jpeg(px, w, h, i % 13 == 12, 85 + int(r.below(11)), i % 10 == 9, i % 7 == 6);
    }
    return img;
}

}  // namespace sluice_gen
