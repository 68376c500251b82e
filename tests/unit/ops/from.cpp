#include <sluice/ops/from.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>

TEST_CASE("from sends a vector's items and can feed several pipelines", "[from]") {
    auto src = sluice::from<std::string>({"x", "y"});
    for (int run = 0; run < 2; ++run) {
        std::vector<std::string> got;
        for (auto& s : sluice::pipeline(src)) got.push_back(s);
        REQUIRE(got == std::vector<std::string>{"x", "y"});
    }
}
