#include <sluice/core/error.hpp>

#include "support/test_support.hpp"

TEST_CASE("a source error names the path, the offset and the cause", "[error]") {
    sluice::source_error e("data/shard-3.txt", "cannot read", std::make_error_code(std::errc::io_error), 4096);
    REQUIRE(std::string(e.what()) == "sluice: cannot read 'data/shard-3.txt' at byte 4096: " +
                                         std::make_error_code(std::errc::io_error).message());
    REQUIRE(e.url() == "data/shard-3.txt");
    REQUIRE(e.offset() == 4096);
    REQUIRE(e.code() == std::errc::io_error);
    sluice::source_error no_offset("x", "cannot open");
    REQUIRE(std::string(no_offset.what()) == "sluice: cannot open 'x'");
}
