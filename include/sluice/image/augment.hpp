#pragma once
// Augmentation: where to crop (torchvision's geometry), resizing, flipping.
//
// Every random choice comes from a generator seeded by (seed, epoch, sample key), so an
// image gets the same crop and flip in a rerun and after a resume, whichever worker
// decodes it and in whatever order.
//
// Resizing is OpenCV's (imgproc): bilinear, or area averaging when the image still shrinks
// by 2 or more in an axis (PNG, which has no DCT scaling, or a large crop of a large
// image), so downscaling does not alias. For JPEG the decoder has already shrunk by the
// largest power of two that keeps the crop at least the output size, so the resize left
// shrinks by less than 2 (bench/image_resize.cpp compares the candidates; figures in
// bench/RESULTS.md, "Image resize").

#include <sluice/core/detail/random.hpp>
#include <sluice/image/codec.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace sluice::imaging {

/// torchvision's RandomResizedCrop parameters (its defaults).
struct random_crop {
    double scale_min = 0.08, scale_max = 1.0;     // of the image's area
    double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;  // width / height
    unsigned tries = 10;
};

/// The generator for one image: a pure function of (seed, epoch, key).
inline sluice::detail::rng image_rng(std::uint64_t seed, std::uint32_t epoch, std::string_view key) {
    return sluice::detail::rng(sluice::detail::mix(sluice::detail::mix(seed, epoch), sluice::detail::fnv1a(sluice::detail::fnv_offset, key)));
}

/// A uniform double in [a, b).
inline double uniform(sluice::detail::rng& r, double a, double b) {
    return a + (b - a) * double(r.next() >> 11) * 0x1.0p-53;
}

/// torchvision's RandomResizedCrop.get_params: up to `tries` draws of an area share and a
/// log-uniform aspect ratio, the first that fits; else the centre crop of the image
/// clamped to the ratio range.
inline rect choose_random_crop(std::uint32_t width, std::uint32_t height, const random_crop& p, sluice::detail::rng& r) {
    const double area = double(width) * height;
    const double lr0 = std::log(p.ratio_min), lr1 = std::log(p.ratio_max);
    for (unsigned i = 0; i < p.tries; ++i) {
        const double target = area * uniform(r, p.scale_min, p.scale_max);
        const double ratio = std::exp(uniform(r, lr0, lr1));
        const long w = std::lround(std::sqrt(target * ratio));
        const long h = std::lround(std::sqrt(target / ratio));
        if (w > 0 && h > 0 && w <= long(width) && h <= long(height)) {
            const auto y = std::uint32_t(r.below(height - std::uint64_t(h) + 1));
            const auto x = std::uint32_t(r.below(width - std::uint64_t(w) + 1));
            return {x, y, std::uint32_t(w), std::uint32_t(h)};
        }
    }
    const double in_ratio = double(width) / height;
    std::uint32_t w = width, h = height;
    if (in_ratio < p.ratio_min) h = std::uint32_t(std::max(1L, std::lround(w / p.ratio_min)));
    else if (in_ratio > p.ratio_max) w = std::uint32_t(std::max(1L, std::lround(h * p.ratio_max)));
    return {(width - w) / 2, (height - h) / 2, w, h};
}

/// Evaluation geometry: resize the shorter side to `resize`, then take the centre
/// `out_w` x `out_h` (torchvision's Resize(256) + CenterCrop(224)), as the region of the
/// original image that becomes the output.
inline rect choose_center_crop(std::uint32_t width, std::uint32_t height, std::uint32_t resize, std::uint32_t out_w,
                               std::uint32_t out_h) {
    const double s = double(resize) / std::min(width, height);  // original -> resized
    auto along = [&](std::uint32_t extent, std::uint32_t out, std::uint32_t& at, std::uint32_t& len) {
        // torchvision: the resized side is int(extent * s) (the shorter side exactly
        // `resize`), the crop's offset round((resized - out) / 2) with Python's rounding
        // (half to even: std::nearbyint), both mapped back to the original.
        const double resized = extent == std::min(width, height) ? double(resize) : std::floor(extent * s);
        const double want = std::min<double>(out, resized);
        len = std::uint32_t(std::clamp<long>(std::lround(want / s), 1, long(extent)));
        at = std::uint32_t(std::clamp<long>(std::lround(std::nearbyint((resized - want) / 2) / s), 0, long(extent - len)));
    };
    rect r;
    along(width, out_w, r.x, r.w);
    along(height, out_h, r.y, r.h);
    return r;
}

/// Resizes `in` to out_w x out_h into `out` (rows of out_w * 3 bytes, contiguous).
inline void resize(const plane& in, std::uint32_t out_w, std::uint32_t out_h, std::uint8_t* out) {
    const cv::Mat src(int(in.h), int(in.w), CV_8UC3, const_cast<std::uint8_t*>(in.px.data()));
    cv::Mat dst(int(out_h), int(out_w), CV_8UC3, out);
    if (in.w == out_w && in.h == out_h) {
        src.copyTo(dst);
        return;
    }
    const bool shrinks_much = in.w >= 2 * out_w || in.h >= 2 * out_h;
    cv::resize(src, dst, dst.size(), 0, 0, shrinks_much ? cv::INTER_AREA : cv::INTER_LINEAR);
}

/// Mirrors w x h RGB pixels left to right, in place (OpenCV's flip: SIMD; a byte-wise
/// swap loop cost 4 % of an image's CPU time).
inline void flip_horizontal(std::uint8_t* px, std::uint32_t w, std::uint32_t h) {
    cv::Mat m(int(h), int(w), CV_8UC3, px);
    cv::flip(m, m, 1);
}

}  // namespace sluice::imaging
