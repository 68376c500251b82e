#include <sluice/core/record.hpp>

#include "support/test_support.hpp"

TEST_CASE("a record names itself by source and index and compacts out of its chunk", "[record]") {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"data/a.txt", 1, 0});
    auto big = std::make_shared<sluice::buffer>(1 << 16);
    std::memset(big->data(), 'z', 1 << 16);
    sluice::record r{sluice::bytes(big, 1 << 16).slice(10, 5), s, 7, 10, {}};
    REQUIRE(r.key() == "data/a.txt#7");
    REQUIRE(r.byte_size() == 5);
    r.compact();
    REQUIRE(r.data.owner_capacity() == 5);
    REQUIRE(r.data.view() == "zzzzz");
}
