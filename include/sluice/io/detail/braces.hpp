#pragma once
// Brace expansion as shells and WebDataset write it:
//   "shard-{000..127}.tar"   -> shard-000.tar ... shard-127.tar (zero padding kept)
//   "{train,val}/part-{0..2}" -> train/part-0 ... val/part-2 (alternatives, nested)
// A brace group without a comma or a ".." range is kept literally.

#include <sluice/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::detail {

// Position of the '}' matching the '{' at `open`, or npos.
inline std::size_t matching_brace(std::string_view s, std::size_t open) {
    int depth = 0;
    for (std::size_t i = open; i < s.size(); ++i) {
        if (s[i] == '{') ++depth;
        else if (s[i] == '}' && --depth == 0) return i;
    }
    return std::string_view::npos;
}

// Split the inside of a brace group at top-level commas.
inline std::vector<std::string_view> split_alternatives(std::string_view body) {
    std::vector<std::string_view> parts;
    int depth = 0;
    std::size_t start = 0;
    for (std::size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '{') ++depth;
        else if (body[i] == '}') --depth;
        else if (body[i] == ',' && depth == 0) {
            parts.push_back(body.substr(start, i - start));
            start = i + 1;
        }
    }
    parts.push_back(body.substr(start));
    return parts;
}

inline constexpr std::size_t max_expansion = 10'000'000;

struct range {
    std::uint64_t lo, hi;
    std::size_t width;  // zero padding, 0 for none
    std::size_t size() const noexcept { return static_cast<std::size_t>((hi > lo ? hi - lo : lo - hi) + 1); }
};

// "000..127" -> {0, 127, 3}; not a numeric range -> nullopt.
inline std::optional<range> numeric_range(std::string_view body) {
    const auto dots = body.find("..");
    if (dots == std::string_view::npos) return std::nullopt;
    const auto a = body.substr(0, dots), b = body.substr(dots + 2);
    auto is_num = [](std::string_view x) {
        if (x.empty() || x.size() > 18) return false;
        for (char c : x)
            if (c < '0' || c > '9') return false;
        return true;
    };
    if (!is_num(a) || !is_num(b)) return std::nullopt;
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    return range{std::stoull(std::string(a)), std::stoull(std::string(b)),
                 padded ? std::max(a.size(), b.size()) : 0};
}

inline std::vector<std::string> range_names(const range& r) {
    std::vector<std::string> out;
    out.reserve(r.size());
    const auto step = [&](std::uint64_t v) {
        auto s = std::to_string(v);
        if (s.size() < r.width) s.insert(0, r.width - s.size(), '0');
        out.push_back(std::move(s));
    };
    if (r.lo <= r.hi)
        for (auto v = r.lo; v <= r.hi; ++v) step(v);
    else
        for (auto v = r.lo + 1; v-- > r.hi;) step(v);
    return out;
}

/// How many names `pattern` expands to, saturating just above max_expansion, without
/// building them.
inline std::size_t expansion_count(std::string_view pattern) {
    constexpr std::size_t cap = max_expansion + 1;
    for (std::size_t open = pattern.find('{'); open != std::string_view::npos;
         open = pattern.find('{', open + 1)) {
        const auto close = matching_brace(pattern, open);
        if (close == std::string_view::npos) continue;
        const auto body = pattern.substr(open + 1, close - open - 1);
        const auto head = pattern.substr(0, open), tail = pattern.substr(close + 1);
        if (auto r = numeric_range(body)) {  // the names have no braces: each repeats the tail
            const std::size_t n = std::min(r->size(), cap), t = expansion_count(tail);
            return t != 0 && n > cap / t ? cap : n * t;
        }
        auto alts = split_alternatives(body);
        if (alts.size() < 2) continue;  // "{x}" stays literal
        std::size_t n = 0;
        for (auto a : alts) n = std::min(cap, n + expansion_count(std::string(head) + std::string(a) + std::string(tail)));
        return n;
    }
    return 1;
}

inline std::vector<std::string> expand_braces_unchecked(std::string_view pattern) {
    for (std::size_t open = pattern.find('{'); open != std::string_view::npos;
         open = pattern.find('{', open + 1)) {
        const auto close = matching_brace(pattern, open);
        if (close == std::string_view::npos) continue;  // an unmatched '{' is literal
        const auto body = pattern.substr(open + 1, close - open - 1);
        std::vector<std::string> choices;
        if (auto r = numeric_range(body)) {
            choices = range_names(*r);
        } else {
            auto alts = split_alternatives(body);
            if (alts.size() < 2) continue;  // "{x}" stays literal
            for (auto a : alts) choices.emplace_back(a);
        }
        std::vector<std::string> out;
        const auto head = pattern.substr(0, open), tail = pattern.substr(close + 1);
        for (auto& c : choices)  // alternatives may hold braces themselves, and so may the tail
            for (auto& e : expand_braces_unchecked(std::string(head) + c + std::string(tail)))
                out.push_back(std::move(e));
        return out;
    }
    return {std::string(pattern)};
}

/// Expand every brace group of `pattern`, left to right. More than 10 million names in
/// all is an error, raised before any is built.
inline std::vector<std::string> expand_braces(std::string_view pattern) {
    if (expansion_count(pattern) > max_expansion)
        throw error("sluice: brace pattern expands to more than 10 million names: " + std::string(pattern));
    return expand_braces_unchecked(pattern);
}

}  // namespace sluice::detail
