#include <sluice/image.hpp>

#include <catch2/catch.hpp>

// The umbrella header alone gives the whole image layer: codec, augmentation, stages.
TEST_CASE("sluice/image.hpp stands alone and names what a file is when it is not an image", "[image]") {
    const std::uint8_t gif[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
    REQUIRE_THROWS_WITH(sluice::imaging::read_header({gif, sizeof gif}), Catch::Contains("a GIF, which is not supported"));
    const sluice::image_options o;
    CHECK(o.size == 224);
    CHECK(o.mode == sluice::image_mode::train);
    CHECK(o.fields == std::vector<std::string>{"jpg", "jpeg", "png"});
    auto r = sluice::imaging::image_rng(1, 0, "k");
    const auto c = sluice::imaging::choose_random_crop(100, 80, {}, r);
    CHECK(c.x + c.w <= 100);
    CHECK(c.y + c.h <= 80);
}
