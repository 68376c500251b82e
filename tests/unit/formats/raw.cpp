#include <sluice/formats/raw.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/io/local.hpp>
#include <sluice/ops/from.hpp>

TEST_CASE("one record per file: whole in one chunk without a copy, assembled otherwise", "[raw]") {
    sluice_test::temp_dir d;
    const std::string big(10'000, 'b');
    const auto small = d.write("small", "tiny"), large = d.write("large", big), empty = d.write("empty", "");
    std::vector<sluice::shard> shards{{small, 0, 0}, {large, 0, 1}, {empty, 0, 2}};
    std::vector<sluice::record> got;
    for (auto& r : sluice::pipeline(sluice::from(shards) | sluice::read({.chunk_size = 4096}) | sluice::raw()))
        got.push_back(r);
    REQUIRE(got.size() == 3);
    REQUIRE(got[0].data.view() == "tiny");
    // The chunk itself (no copy), and the chunk is sized to the file: a 4-byte file does
    // not pin a 4096-byte buffer.
    REQUIRE(got[0].data.owner_capacity() == 4);
    REQUIRE(got[0].data.owner_use_count() == 1);
    REQUIRE(got[1].data.view() == big);
    REQUIRE(got[1].source->url == large);
    REQUIRE(got[2].data.empty());
}
