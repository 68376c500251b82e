#include <sluice/sluice.hpp>

#include "support/test_support.hpp"
#include <set>

TEST_CASE("the umbrella header composes a whole local pipeline", "[sluice]") {
    sluice_test::temp_dir d;
    d.write("shard-0.txt", "a\nb\nc\n");
    d.write("shard-1.txt", "d\ne\n");
    auto src = sluice::list(d / "shard-{0..1}.txt") | sluice::plan({.epochs = 2, .seed = 1}) | sluice::read() |
               sluice::lines() | sluice::shuffle({.buffer = 3, .seed = 1}) | sluice::batch({.size = 4});
    std::multiset<std::string> seen;
    for (auto& b : sluice::pipeline(src))
        for (std::size_t i = 0; i < b.size(); ++i)
            seen.insert(std::string(reinterpret_cast<const char*>(b[i].data()), b[i].size()));
    REQUIRE(seen == std::multiset<std::string>{"a", "a", "b", "b", "c", "c", "d", "d", "e", "e"});
}
