#pragma once
// sluice::crc32c: CRC-32C (Castagnoli), the checksum of TFRecord (and iSCSI, ext4...).
//
// Two implementations, chosen once at run time: the SSE4.2 `crc32` instruction where the
// CPU has it, else a portable table (slicing by 8, about 1-2 GB/s). The instruction has
// a latency of 3 cycles and a throughput of 1 per cycle, so one dependent chain reaches a
// third of what the unit can do: long inputs are cut into three interleaved blocks whose
// CRCs are computed at once and then joined. Joining needs "this CRC, followed by N zero
// bytes", a linear map on 32 bits that is tabulated once for each block length.
// Where the build found ISA-L (SLUICE_HAVE_ISAL), crc32c() leaves inputs of 512 bytes and
// more to its crc32_iscsi, which is faster still (see detail::crc32c_isal_min).
// crc32c_copy, which sums as it copies, keeps the code here.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#ifdef SLUICE_HAVE_ISAL
#include <isa-l/crc.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#include <nmmintrin.h>
#define SLUICE_CRC32C_X86 1
#endif

namespace sluice {

namespace detail {

inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;  // reflected 0x1EDC6F41

// tables[k][b]: the CRC register after byte b followed by k zero bytes.
inline constexpr auto crc32c_tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t c = b;
        for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? crc32c_poly : 0u);
        t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b)
        for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    return t;
}();

inline std::uint64_t load_le64(const unsigned char* p) noexcept {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
    return v;
}

/// The raw register update (no pre/post inversion), portable.
inline std::uint32_t crc32c_sw_raw(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
    const auto& t = crc32c_tables;
    while (n && (reinterpret_cast<std::uintptr_t>(p) & 7u)) {
        crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
        --n;
    }
    while (n >= 8) {
        const std::uint64_t v = load_le64(p) ^ crc;
        crc = t[7][v & 0xffu] ^ t[6][(v >> 8) & 0xffu] ^ t[5][(v >> 16) & 0xffu] ^
              t[4][(v >> 24) & 0xffu] ^ t[3][(v >> 32) & 0xffu] ^ t[2][(v >> 40) & 0xffu] ^
              t[1][(v >> 48) & 0xffu] ^ t[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
    return crc;
}

#ifdef SLUICE_CRC32C_X86
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_chain(std::uint32_t crc, const unsigned char* p,
                                                                       std::size_t n) noexcept {
#if defined(__x86_64__)
    std::uint64_t c = crc;
    while (n >= 8) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    crc = static_cast<std::uint32_t>(c);
#endif
    while (n >= 4) {
        std::uint32_t v;
        std::memcpy(&v, p, 4);
        crc = _mm_crc32_u32(crc, v);
        p += 4;
        n -= 4;
    }
    while (n--) crc = _mm_crc32_u8(crc, *p++);
    return crc;
}

/// "Append `len` zero bytes to this register", tabulated per input byte: the map is
/// linear, so its value on any register is the XOR of its values on the register's bytes.
struct crc32c_shift {
    std::array<std::array<std::uint32_t, 256>, 4> t{};
    explicit crc32c_shift(std::size_t len) noexcept {
        std::array<std::uint32_t, 32> basis{};  // image of each single bit
        static constexpr unsigned char zeros[64] = {};
        for (int bit = 0; bit < 32; ++bit) {
            std::uint32_t c = 1u << bit;
            for (std::size_t left = len; left;) {
                const std::size_t step = left < sizeof zeros ? left : sizeof zeros;
                c = crc32c_hw_chain(c, zeros, step);
                left -= step;
            }
            basis[static_cast<std::size_t>(bit)] = c;
        }
        for (std::size_t k = 0; k < 4; ++k)
            for (std::uint32_t b = 0; b < 256; ++b) {
                std::uint32_t v = 0;
                for (int i = 0; i < 8; ++i)
                    if (b & (1u << i)) v ^= basis[k * 8 + static_cast<std::size_t>(i)];
                t[k][b] = v;
            }
    }
    std::uint32_t operator()(std::uint32_t crc) const noexcept {
        return t[0][crc & 0xffu] ^ t[1][(crc >> 8) & 0xffu] ^ t[2][(crc >> 16) & 0xffu] ^ t[3][crc >> 24];
    }
};

#if defined(__x86_64__)
// Three chains over three adjacent blocks, then crc(A B C) = shift(shift(a, |B|) ^ b, |C|) ^ c
// where b and c start from a zero register. (A function, not a lambda: a lambda would
// not inherit the target attribute.)
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_three(std::uint32_t crc, const unsigned char*& p,
                                                                       std::size_t& n, std::size_t block,
                                                                       const crc32c_shift& shift) noexcept {
    while (n >= 3 * block) {
        std::uint64_t c0 = crc, c1 = 0, c2 = 0;
        const unsigned char* end = p + block;
        for (; p < end; p += 8) {
            std::uint64_t v0, v1, v2;
            std::memcpy(&v0, p, 8);
            std::memcpy(&v1, p + block, 8);
            std::memcpy(&v2, p + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, v0);
            c1 = _mm_crc32_u64(c1, v1);
            c2 = _mm_crc32_u64(c2, v2);
        }
        crc = shift(shift(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1)) ^
              static_cast<std::uint32_t>(c2);
        p += 2 * block;
        n -= 3 * block;
    }
    return crc;
}
#endif

__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_raw(std::uint32_t crc, const unsigned char* p,
                                                                     std::size_t n) noexcept {
#if defined(__x86_64__)
    constexpr std::size_t long_block = 8192, short_block = 256;
    static const crc32c_shift shift_long(long_block), shift_short(short_block);
    crc = crc32c_hw_three(crc, p, n, long_block, shift_long);
    crc = crc32c_hw_three(crc, p, n, short_block, shift_short);
#endif
    return crc32c_hw_chain(crc, p, n);
}

#if defined(__x86_64__)
// One cache line of a block: each 16 bytes loaded once, summed into `c` and stored
// (streaming stores when Stream, which needs `d` 16-byte aligned).
template <bool Stream>
__attribute__((target("sse4.2"))) inline void crc32c_copy_line(std::uint64_t& c, unsigned char* d,
                                                               const unsigned char* s) noexcept {
    for (int i = 0; i < 64; i += 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
        c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
        c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v))));
        if constexpr (Stream) _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), v);
        else _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), v);
    }
}
// Copies while it sums: three chains over three adjacent blocks of `block` bytes (a
// multiple of 64), a line of each in turn. Advances d, s and n past what it did.
template <bool Stream>
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_copy_three(std::uint32_t crc, unsigned char*& d,
                                                                         const unsigned char*& s, std::size_t& n,
                                                                         std::size_t block,
                                                                         const crc32c_shift& shift) noexcept {
    while (n >= 3 * block) {
        std::uint64_t c0 = crc, c1 = 0, c2 = 0;
        for (std::size_t i = 0; i < block; i += 64) {
            crc32c_copy_line<Stream>(c0, d + i, s + i);
            crc32c_copy_line<Stream>(c1, d + block + i, s + block + i);
            crc32c_copy_line<Stream>(c2, d + 2 * block + i, s + 2 * block + i);
        }
        crc = shift(shift(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1)) ^
              static_cast<std::uint32_t>(c2);
        d += 3 * block;
        s += 3 * block;
        n -= 3 * block;
    }
    return crc;
}

__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_copy_hw_raw(std::uint32_t crc, unsigned char* d,
                                                                          const unsigned char* s, std::size_t n,
                                                                          bool stream) noexcept {
    // Blocks of 256 bytes, not crc32c_hw_raw's 8 KiB: three chains 8 KiB apart read and
    // write six streams at once and copied at 6-8 GB/s instead of 11-12 (100 KiB records
    // out of 1.6 GB into a batch, measured while choosing), while 768 bytes a round is one
    // stream.
    constexpr std::size_t block = 256;
    static const crc32c_shift shift(block);
    if (stream) {  // streaming stores need an aligned destination: the head goes plainly
        const std::size_t head = std::min<std::size_t>(n, (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15);
        std::memcpy(d, s, head);
        crc = crc32c_hw_chain(crc, s, head);
        d += head, s += head, n -= head;
        crc = crc32c_copy_three<true>(crc, d, s, n, block, shift);
    } else {
        crc = crc32c_copy_three<false>(crc, d, s, n, block, shift);
    }
    std::memcpy(d, s, n);
    return crc32c_hw_chain(crc, s, n);
}
#endif

inline bool crc32c_has_hw() noexcept {
    static const bool hw = __builtin_cpu_supports("sse4.2");
    return hw;
}
#else
inline bool crc32c_has_hw() noexcept { return false; }
#endif

/// Portable CRC-32C, for tests and CPUs without SSE4.2.
inline std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
    return ~crc32c_sw_raw(~crc, static_cast<const unsigned char*>(data), n);
}

}  // namespace detail

namespace detail {
/// From this many bytes, a build with ISA-L (SLUICE_HAVE_ISAL: Debian's libisal-dev, found
/// by CMake) sums with its crc32_iscsi, which folds with carry-less multiplies (PCLMULQDQ)
/// beside the crc32 instruction, and dispatches on the CPU itself: bench/crc32c's 100 KiB
/// records 13.4 -> 37.8 GB/s (2.8 x), and 22 -> 39 GB/s (1.7 x) for records already in
/// the cache (bench/RESULTS.md, issue 17, twenty-first session). Headers (8 bytes) keep
/// the code above, and so does crc32c_copy.
/// Every translation unit of a program must see the same SLUICE_HAVE_ISAL (crc32c is
/// inline): build them all through sluice's CMake targets, which define it.
inline constexpr std::size_t crc32c_isal_min = 512;
}  // namespace detail

/// CRC-32C of `n` bytes, continuing from `crc` (0 to start): crc32c("123456789") ==
/// 0xE3069283. Uses ISA-L where the build has it, else the SSE4.2 instruction when the
/// CPU has it.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
#ifdef SLUICE_HAVE_ISAL
    if (n >= detail::crc32c_isal_min) {
        // crc32_iscsi keeps the register uninverted: it starts from ~crc and returns what
        // the next piece continues from. Its length is an int.
        constexpr std::size_t piece = std::size_t{1} << 30;
        std::uint32_t c = ~crc;
        for (; n; ) {
            const std::size_t k = std::min(n, piece);
            c = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(k), c);
            p += k;
            n -= k;
        }
        return ~c;
    }
#endif
#ifdef SLUICE_CRC32C_X86
    if (detail::crc32c_has_hw()) return ~detail::crc32c_hw_raw(~crc, p, n);
#endif
    return ~detail::crc32c_sw_raw(~crc, p, n);
}

/// Copies `n` bytes from `src` to `dst` (which must not overlap) and returns their CRC-32C,
/// continuing from `crc`, reading each source byte once: a record checked as it is
/// collated costs its copy and about a fifth more, where summing it first cost half as
/// much again (bench/RESULTS.md, "TFRecord's checksum"). `stream`: streaming stores,
/// for a destination far larger than the cache (see detail::stream_copy); the caller
/// orders them with an sfence before another thread reads them.
inline std::uint32_t crc32c_copy(void* dst, const void* src, std::size_t n, std::uint32_t crc = 0,
                                 bool stream = false) noexcept {
    if (!n) return crc;  // nothing to copy (either pointer may be null)
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
#if defined(__x86_64__)
    if (detail::crc32c_has_hw()) return ~detail::crc32c_copy_hw_raw(~crc, d, s, n, stream);
#endif
    (void)stream;
    std::memcpy(d, s, n);
    return crc32c(s, n, crc);
}

/// TFRecord's masked CRC: rotated and offset so that a CRC stored inside data that is
/// itself checksummed does not cancel out.
inline std::uint32_t crc32c_mask(std::uint32_t crc) noexcept {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace detail {
/// What a TFRecord record whose data checksum fails is called, by the parser and by
/// batch when the check was left to it (one text, so that both say the same).
inline std::string bad_tfrecord_data(std::uint64_t index) {
    return "bad TFRecord data checksum (record " + std::to_string(index) + ")";
}
}  // namespace detail

}  // namespace sluice
