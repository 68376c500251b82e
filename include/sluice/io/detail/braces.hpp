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

inline std::optional<std::vector<std::string>> numeric_range(std::string_view body) {
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
    const auto lo = std::stoull(std::string(a)), hi = std::stoull(std::string(b));
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const std::size_t width = padded ? std::max(a.size(), b.size()) : 0;
    if ((hi > lo ? hi - lo : lo - hi) >= max_expansion)
        throw error("sluice: brace range too large: {" + std::string(body) + "}");
    std::vector<std::string> out;
    const auto step = [&](std::uint64_t v) {
        auto s = std::to_string(v);
        if (s.size() < width) s.insert(0, width - s.size(), '0');
        out.push_back(std::move(s));
    };
    if (lo <= hi)
        for (auto v = lo; v <= hi; ++v) step(v);
    else
        for (auto v = lo + 1; v-- > hi;) step(v);
    return out;
}

/// Expand every brace group of `pattern`, left to right (at most 10 million names in all).
inline std::vector<std::string> expand_braces(std::string_view pattern) {
    for (std::size_t open = pattern.find('{'); open != std::string_view::npos;
         open = pattern.find('{', open + 1)) {
        const auto close = matching_brace(pattern, open);
        if (close == std::string_view::npos) continue;  // an unmatched '{' is literal
        const auto body = pattern.substr(open + 1, close - open - 1);
        std::vector<std::string> choices;
        if (auto r = numeric_range(body)) {
            choices = std::move(*r);
        } else {
            auto alts = split_alternatives(body);
            if (alts.size() < 2) continue;  // "{x}" stays literal
            for (auto a : alts) choices.emplace_back(a);
        }
        std::vector<std::string> out;
        const auto head = pattern.substr(0, open), tail = pattern.substr(close + 1);
        for (auto& c : choices) {
            // Alternatives may contain braces themselves, and so may the tail.
            for (auto& e : expand_braces(std::string(head) + c + std::string(tail))) {
                if (out.size() == max_expansion)
                    throw error("sluice: brace pattern expands to more than 10 million names: " +
                                std::string(pattern));
                out.push_back(std::move(e));
            }
        }
        return out;
    }
    return {std::string(pattern)};
}

}  // namespace sluice::detail
