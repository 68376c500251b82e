#include <sluice/image/augment.hpp>

#include <catch2/catch.hpp>

#include <tuple>
#include <vector>

using sluice::imaging::rect;

TEST_CASE("random-resized-crop keeps torchvision's ranges, falls back to the centre, and is a function of seed, epoch and key", "[image]") {
    sluice::imaging::random_crop p;
    for (std::uint32_t i = 0; i < 2000; ++i) {
        auto r = sluice::imaging::image_rng(17, i % 3, "shard#" + std::to_string(i));
        const rect c = sluice::imaging::choose_random_crop(500, 375, p, r);
        REQUIRE(c.x + c.w <= 500);
        REQUIRE(c.y + c.h <= 375);
        const double area = double(c.w) * c.h / (500.0 * 375);
        const double ratio = double(c.w) / c.h;
        REQUIRE(area >= 0.075);  // rounding of w and h
        REQUIRE(ratio >= 0.70);
        REQUIRE(ratio <= 1.42);
    }
    // A 1000x10 strip cannot hold a crop of ratio <= 4/3 and 8 % of its area: the centre
    // crop of ratio 4/3 (torchvision: h = 10, w = round(13.3) = 13).
    auto r = sluice::imaging::image_rng(1, 0, "strip");
    const rect c = sluice::imaging::choose_random_crop(1000, 10, p, r);
    CHECK(c.w == 13);
    CHECK(c.h == 10);
    CHECK(c.x == 493);
    CHECK(c.y == 0);
    // The same (seed, epoch, key) gives the same crop; another epoch or key another one.
    auto crop_for = [&](std::uint64_t seed, std::uint32_t epoch, const char* key) {
        auto g = sluice::imaging::image_rng(seed, epoch, key);
        const rect x = sluice::imaging::choose_random_crop(500, 375, p, g);
        return std::tuple{x.x, x.y, x.w, x.h};
    };
    CHECK(crop_for(5, 1, "k") == crop_for(5, 1, "k"));
    CHECK(crop_for(5, 1, "k") != crop_for(5, 2, "k"));
    CHECK(crop_for(5, 1, "k") != crop_for(5, 1, "j"));
    CHECK(crop_for(5, 1, "k") != crop_for(6, 1, "k"));
}


TEST_CASE("flip_horizontal mirrors each row and keeps the rows in place", "[image]") {
    // 3 x 2 RGB: pixel (x, y) holds (10y + x, 100 + x, 200 + y).
    std::vector<std::uint8_t> px;
    for (std::uint8_t y = 0; y < 2; ++y)
        for (std::uint8_t x = 0; x < 3; ++x) px.insert(px.end(), {std::uint8_t(10 * y + x), std::uint8_t(100 + x), std::uint8_t(200 + y)});
    sluice::imaging::flip_horizontal(px.data(), 3, 2);
    for (std::uint8_t y = 0; y < 2; ++y)
        for (std::uint8_t x = 0; x < 3; ++x) {
            const auto* p = &px[(y * 3 + x) * 3];
            CHECK(int(p[0]) == 10 * y + (2 - x));
            CHECK(int(p[1]) == 100 + (2 - x));
            CHECK(int(p[2]) == 200 + y);
        }
}

