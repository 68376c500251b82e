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

TEST_CASE("source errors never show credentials of a URL", "[error]") {
    sluice::source_error e("https://user:s3cret@host.example/bucket/key.tar?X-Amz-Signature=abc&X-Amz-Credential=AKIA", "cannot fetch (HTTP 403)");
    const std::string m = e.what();
    REQUIRE(m == "sluice: cannot fetch (HTTP 403) 'https://host.example/bucket/key.tar?...'");
    REQUIRE(e.url() == "https://host.example/bucket/key.tar?...");
    REQUIRE(sluice::source_error("data/a@b.txt", "x").url() == "data/a@b.txt");  // local paths as they are
}
