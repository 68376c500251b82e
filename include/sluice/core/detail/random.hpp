#pragma once
// A small, fast, portable random generator (xoshiro256**, seeded by splitmix64) with an
// unbiased bounded draw. std::uniform_int_distribution is implementation-defined, so the
// standard library would not give the same shuffle on every platform; this does.

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::detail {

inline std::uint64_t splitmix64(std::uint64_t& x) noexcept {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

class rng {
public:
    explicit rng(std::uint64_t seed) noexcept {
        for (auto& w : s_) w = splitmix64(seed);
    }
    std::uint64_t next() noexcept {
        const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    /// Uniform in [0, n), n > 0 (Lemire's multiply-shift with rejection).
    std::uint64_t below(std::uint64_t n) noexcept {
        unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
        auto low = static_cast<std::uint64_t>(m);
        if (low < n) {
            const std::uint64_t threshold = -n % n;
            while (low < threshold) {
                m = static_cast<unsigned __int128>(next()) * n;
                low = static_cast<std::uint64_t>(m);
            }
        }
        return static_cast<std::uint64_t>(m >> 64);
    }

private:
    static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
    std::uint64_t s_[4];
};

/// Fisher-Yates shuffle with our generator.
template <class T>
void shuffle(std::vector<T>& v, rng& r) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

/// Mix two seeds into one (e.g. the user's seed and the epoch).
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t x = a ^ (b * 0x9e3779b97f4a7c15ULL);
    return splitmix64(x);
}

/// FNV-1a of `s` continuing from `h` (start from fnv_offset), with a separator so that
/// hashing "ab","c" and "a","bc" in turn differ: names in file names and state notes.
inline constexpr std::uint64_t fnv_offset = 0xcbf29ce484222325ULL;
inline std::uint64_t fnv1a(std::uint64_t h, std::string_view s) noexcept {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return (h ^ 0xff) * 0x100000001b3ULL;
}

}  // namespace sluice::detail
