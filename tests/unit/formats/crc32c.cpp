#include <sluice/formats/crc32c.hpp>

#include "support/test_support.hpp"

#include <sluice/core/detail/random.hpp>

#include <algorithm>
#include <string>
#include <vector>

TEST_CASE("crc32c matches the published check values", "[crc32c]") {
    REQUIRE(sluice::crc32c("123456789", 9) == 0xE3069283u);
    REQUIRE(sluice::crc32c("", 0) == 0u);
    // RFC 3720 (iSCSI) B.4: 32 zero bytes, 32 0xff bytes, 0..31 ascending.
    std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), up(32);
    for (int i = 0; i < 32; ++i) up[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    REQUIRE(sluice::crc32c(zeros.data(), 32) == 0x8A9136AAu);
    REQUIRE(sluice::crc32c(ones.data(), 32) == 0x62A8AB43u);
    REQUIRE(sluice::crc32c(up.data(), 32) == 0x46DD794Eu);
    REQUIRE(sluice::detail::crc32c_portable("123456789", 9) == 0xE3069283u);
}

TEST_CASE("crc32c: the instruction path equals the portable one at every length and alignment", "[crc32c]") {
    if (!sluice::detail::crc32c_has_hw()) WARN("[skipped] this CPU has no SSE4.2: only the portable path runs");
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    std::vector<unsigned char> buf(200000 + 16);
    for (auto& b : buf) b = static_cast<unsigned char>(r.next());
    std::vector<std::size_t> lengths = {0,     1,     7,     8,     9,      255,   256,   511, 512,
                                        513,   767,   768,   769,   24575,  24576, 24577, 100000, 200000};
    for (int i = 0; i < 200; ++i) lengths.push_back(r.below(200000));
    for (std::size_t n : lengths) {
        const std::size_t align = r.below(16);
        INFO("length " << n << " at alignment " << align);
        const auto* p = buf.data() + align;
        const auto want = sluice::detail::crc32c_portable(p, n);
        REQUIRE(sluice::crc32c(p, n) == want);
#ifdef SLUICE_CRC32C_X86
        // sluice's own instruction path, called directly: a build with ISA-L leaves long
        // inputs of crc32c() to ISA-L, and this code still sums the rest (and all of them
        // without ISA-L).
        if (sluice::detail::crc32c_has_hw())
            REQUIRE(~sluice::detail::crc32c_hw_raw(~0u, p, n) == want);
#endif
        // Incremental: any split gives the same CRC.
        const std::size_t cut = n ? r.below(n) : 0;
        REQUIRE(sluice::crc32c(p + cut, n - cut, sluice::crc32c(p, cut)) == want);
    }
}

TEST_CASE("crc32c: where the build found ISA-L, records of 512 bytes and more are summed by it, equal to the portable "
          "sum from any start",
          "[crc32c]") {
#ifndef SLUICE_HAVE_ISAL
    WARN("[skipped] built without ISA-L (libisal-dev): crc32c is sluice's own code only");
#else
    REQUIRE(sluice::detail::crc32c_isal_min == 512);
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    std::vector<unsigned char> buf(300000);
    for (auto& b : buf) b = static_cast<unsigned char>(r.next());
    for (std::size_t n : {std::size_t{512}, std::size_t{4096}, std::size_t{102400}, std::size_t{300000}}) {
        INFO("length " << n);
        // ISA-L itself, from the inverted start sluice's crc32c gives it, and back.
        REQUIRE(~crc32_iscsi(buf.data(), static_cast<int>(n), 0xFFFFFFFFu) == sluice::detail::crc32c_portable(buf.data(), n));
        REQUIRE(sluice::crc32c(buf.data(), n) == sluice::detail::crc32c_portable(buf.data(), n));
        // Continued from a CRC of either kind of piece (below and above 512 bytes).
        for (std::size_t cut : {std::size_t{100}, std::size_t{511}, n / 2}) {
            const auto first = sluice::crc32c(buf.data(), cut);
            REQUIRE(sluice::crc32c(buf.data() + cut, n - cut, first) == sluice::detail::crc32c_portable(buf.data(), n));
            REQUIRE(sluice::detail::crc32c_portable(buf.data() + cut, n - cut, first) ==
                    sluice::detail::crc32c_portable(buf.data(), n));
        }
    }
#endif
}

TEST_CASE("TFRecord's mask rotates and offsets the CRC", "[crc32c]") {
    // masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8
    REQUIRE(sluice::crc32c_mask(0) == 0xa282ead8u);
    REQUIRE(sluice::crc32c_mask(0x00008000u) == 0xa282ead9u);
    REQUIRE(sluice::crc32c_mask(1) == 0xa282ead8u + (1u << 17));
}

TEST_CASE("crc32c_copy copies and sums as crc32c does, at every length, alignment and store kind", "[crc32c]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    std::vector<unsigned char> src(200000 + 16), dst(200000 + 64);
    for (auto& b : src) b = static_cast<unsigned char>(r.next());
    std::vector<std::size_t> lengths = {0, 1, 15, 16, 17, 63, 64, 767, 768, 769, 1536, 4096, 102400, 200000};
    for (int i = 0; i < 100; ++i) lengths.push_back(r.below(200000));
    for (std::size_t n : lengths)
        for (bool stream : {false, true}) {
            const std::size_t from = r.below(16), to = r.below(16);
            INFO("length " << n << " from alignment " << from << " to " << to << (stream ? ", streaming" : ""));
            std::fill(dst.begin(), dst.end(), 0xa5);
            const auto* s = src.data() + from;
            const std::uint32_t start = n % 3 ? static_cast<std::uint32_t>(r.next()) : 0;  // continuing a sum
            REQUIRE(sluice::crc32c_copy(dst.data() + to, s, n, start, stream) == sluice::crc32c(s, n, start));
            REQUIRE(std::equal(s, s + n, dst.data() + to));
            REQUIRE(dst[to + n] == 0xa5);  // nothing written past the end
            if (to) REQUIRE(dst[to - 1] == 0xa5);
        }
}
