// Which library resizes image crops fastest, with antialiasing, on these cores (issue 15).
//
//   cmake --build --preset release --target image_resize && build-release/bench/image_resize [N]
//   (or: g++ -std=c++20 -O2 -DNDEBUG bench/image_resize.cpp -I/usr/include/opencv4 -lswscale
//        -lopencv_imgproc -lopencv_core)
//
// One synthetic 500x375 RGB photo-like image; N random-resized crops (torchvision's
// geometry: 8-100 % of the area, aspect 3/4-4/3), each resized to 224x224 by every
// candidate, single-threaded. Prints microseconds per resize and the mean absolute
// difference from stb's result (a check that each really resized the same crop).
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>

extern "C" {
#include <libswscale/swscale.h>
}
#if __has_include(<opencv2/imgproc.hpp>)
#include <opencv2/imgproc.hpp>
#define HAVE_OPENCV 1
#endif

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {
struct crop {
    int x, y, w, h;
};
constexpr int W = 500, H = 375, OUT = 224;

std::vector<std::uint8_t> photo() {
    std::vector<std::uint8_t> p(std::size_t(W) * H * 3);
    std::mt19937 r(1);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
            for (int c = 0; c < 3; ++c) {
                double v = 128 + 60 * std::sin(x * 0.05 * (c + 1)) * std::cos(y * 0.03) + (r() % 40) - 20;
                p[(std::size_t(y) * W + x) * 3 + c] = std::uint8_t(std::clamp(v, 0.0, 255.0));
            }
    return p;
}

std::vector<crop> crops(int n) {
    std::mt19937 r(7);
    std::uniform_real_distribution<double> scale(0.08, 1.0), logr(std::log(3.0 / 4), std::log(4.0 / 3));
    std::vector<crop> v;
    while (int(v.size()) < n) {
        double area = W * H * scale(r), ratio = std::exp(logr(r));
        int w = int(std::lround(std::sqrt(area * ratio))), h = int(std::lround(std::sqrt(area / ratio)));
        if (w < 1 || h < 1 || w > W || h > H) continue;
        v.push_back({int(r() % (W - w + 1)), int(r() % (H - h + 1)), w, h});
    }
    return v;
}
}  // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
    const auto img = photo();
    const auto cs = crops(n);
    std::vector<std::uint8_t> ref(OUT * OUT * 3 * std::size_t(n)), out(OUT * OUT * 3);
    auto at = [&](const crop& c) { return img.data() + (std::size_t(c.y) * W + c.x) * 3; };

    struct candidate {
        std::string name;
        std::function<void(const crop&, std::uint8_t*)> run;
    };
    SwsContext* sws = nullptr;
    std::vector<candidate> all = {
        {"stb_image_resize (default: Mitchell down, Catmull-Rom up)",
         [&](const crop& c, std::uint8_t* o) { stbir_resize_uint8(at(c), c.w, c.h, W * 3, o, OUT, OUT, 0, 3); }},
        {"stb_image_resize (triangle = bilinear, sRGB off)",
         [&](const crop& c, std::uint8_t* o) {
             stbir_resize_uint8_generic(at(c), c.w, c.h, W * 3, o, OUT, OUT, 0, 3, STBIR_ALPHA_CHANNEL_NONE, 0,
                                        STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr);
         }},
        {"swscale SWS_BILINEAR (context per crop size, cached)",
         [&](const crop& c, std::uint8_t* o) {
             sws = sws_getCachedContext(sws, c.w, c.h, AV_PIX_FMT_RGB24, OUT, OUT, AV_PIX_FMT_RGB24, SWS_BILINEAR,
                                        nullptr, nullptr, nullptr);
             const std::uint8_t* src[1] = {at(c)};
             int ss[1] = {W * 3}, ds[1] = {OUT * 3};
             std::uint8_t* dst[1] = {o};
             sws_scale(sws, src, ss, 0, c.h, dst, ds);
         }},
        {"swscale SWS_AREA",
         [&](const crop& c, std::uint8_t* o) {
             sws = sws_getCachedContext(sws, c.w, c.h, AV_PIX_FMT_RGB24, OUT, OUT, AV_PIX_FMT_RGB24, SWS_AREA, nullptr,
                                        nullptr, nullptr);
             const std::uint8_t* src[1] = {at(c)};
             int ss[1] = {W * 3}, ds[1] = {OUT * 3};
             std::uint8_t* dst[1] = {o};
             sws_scale(sws, src, ss, 0, c.h, dst, ds);
         }},
#if HAVE_OPENCV
        {"OpenCV INTER_LINEAR (no antialias when shrinking)",
         [&](const crop& c, std::uint8_t* o) {
             cv::Mat s(c.h, c.w, CV_8UC3, const_cast<std::uint8_t*>(at(c)), W * 3), d(OUT, OUT, CV_8UC3, o);
             cv::resize(s, d, d.size(), 0, 0, cv::INTER_LINEAR);
         }},
        {"OpenCV INTER_AREA (antialiased shrink, linear growth)",
         [&](const crop& c, std::uint8_t* o) {
             cv::Mat s(c.h, c.w, CV_8UC3, const_cast<std::uint8_t*>(at(c)), W * 3), d(OUT, OUT, CV_8UC3, o);
             cv::resize(s, d, d.size(), 0, 0, cv::INTER_AREA);
         }},
#endif
    };
#if HAVE_OPENCV
    cv::setNumThreads(1);
#endif
    for (int i = 0; i < n; ++i) all[0].run(cs[i], ref.data() + std::size_t(i) * OUT * OUT * 3);
    std::printf("%d crops of a %dx%d RGB image to %dx%d, one thread\n", n, W, H, OUT, OUT);
    for (auto& c : all) {
        double diff = 0;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) {
            c.run(cs[i], out.data());
            if (i % 50 == 0) {
                const std::uint8_t* r = ref.data() + std::size_t(i) * OUT * OUT * 3;
                for (std::size_t k = 0; k < out.size(); ++k) diff += std::abs(int(out[k]) - int(r[k]));
            }
        }
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
        std::printf("%8.1f us/resize  mean |diff| vs stb %5.2f  %s\n", us, diff / ((n + 49) / 50) / out.size(),
                    c.name.c_str());
    }
    sws_freeContext(sws);
}
