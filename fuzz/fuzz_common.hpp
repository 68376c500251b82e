#pragma once
// Shared by the libFuzzer targets: the input's first bytes choose how the rest is cut
// into chunks; each target parses the same bytes whole and cut, under both corruption
// policies, and aborts when the two disagree. Crashes, leaks, undefined behaviour and
// hangs are what libFuzzer and the sanitizers find; the comparison finds parsers whose
// result depends on where chunk boundaries fall.

#include <sluice/formats/detail/cursor.hpp>
#include <sluice/formats/detail/gzip_inflater.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace fuzz {

inline std::vector<sluice::chunk> cut(const std::uint8_t* data, std::size_t size, const std::uint8_t* sizes,
                                      std::size_t n_sizes, const char* url) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{url, 0, 0});
    auto all = sluice::bytes::copy_of(std::span(reinterpret_cast<const std::byte*>(data), size));
    std::vector<sluice::chunk> out;
    std::size_t off = 0, k = 0;
    do {
        const std::size_t want = n_sizes ? 1 + sizes[k % n_sizes] * (sizes[(k + 3) % n_sizes] & 7) : size;
        ++k;
        const std::size_t n = std::min(want, size - off);
        sluice::chunk c{s, off, all.slice(off, n), off + n == size, false};
        out.push_back(std::move(c));
        off += n;
    } while (off < size);
    return out;
}

struct result {
    std::string text;  // every output's bytes and offset, then the error if any
    bool failed = false;
    std::uint64_t skipped = 0;
};

/// Parsers must agree exactly, errors included: offsets do not depend on chunking.
inline bool exactly(const result& a, const result& b) { return a.text == b.text; }
/// zlib may notice a broken stream a few bytes sooner or later depending on how much
/// input it was given at once, so for gzip: identical when the stream was sound, and
/// both broken otherwise.
inline bool same_when_sound(const result& a, const result& b) {
    const bool a_bad = a.failed || a.skipped, b_bad = b.failed || b.skipped;
    return a_bad || b_bad ? a_bad == b_bad : a.text == b.text;
}

template <class Describe, class Parse>
result outcome(std::vector<sluice::chunk> chunks, sluice::on_corrupt policy, Parse parse, Describe describe) {
    std::atomic<std::uint64_t> skipped{0}, ignored{0};
    auto pol = std::make_shared<sluice::detail::parse_policy>();
    pol->corrupt = policy;
    // The default max_record_bytes (1 GiB): a corrupt length must not allocate before the
    // bytes arrive, and libFuzzer's -malloc_limit_mb catches one that does.
    pol->skipped = &skipped;
    pol->ignored = &ignored;
    result r;
    try {
        parse(pol, std::move(chunks), [&](const auto& out) { r.text += describe(out); });
    } catch (const sluice::source_error& e) {
        r.text += std::string("error: ") + e.what();
        r.failed = true;
    }
    r.skipped = skipped.load();
    r.text += " skipped " + std::to_string(r.skipped);
    return r;
}

inline std::string describe_record(const sluice::record& r) {
    return r.name + "@" + std::to_string(r.offset) + "#" + std::to_string(r.index) + "=" + std::string(r.data.view()) + "\n";
}

/// Runs `parse` on the input whole and cut, under both policies; aborts on disagreement.
template <class Parse, class Describe, class Same = decltype(&exactly)>
int check(const std::uint8_t* data, std::size_t size, Parse parse, Describe describe, Same same = &exactly) {
    if (size < 4) return 0;
    const std::uint8_t* sizes = data;
    const std::size_t n_sizes = 4;
    data += n_sizes;
    size -= n_sizes;
    for (auto policy : {sluice::on_corrupt::error, sluice::on_corrupt::skip}) {
        const auto whole = outcome(cut(data, size, nullptr, 0, "fuzz"), policy, parse, describe);
        const auto pieces = outcome(cut(data, size, sizes, n_sizes, "fuzz"), policy, parse, describe);
        if (!same(whole, pieces)) {
            std::fprintf(stderr, "whole and cut parses differ:\n--- whole\n%s\n--- cut\n%s\n", whole.text.c_str(),
                         pieces.text.c_str());
            std::abort();
        }
    }
    return 0;
}

/// Feeds the chunks to the decoder `make(policy)` builds (a shard_parsers or the
/// gunzip_decoder: `void operator()(chunk&&, std::vector<Out>&)`).
template <class Out, class Make>
auto drive(Make make) {
    return [make](std::shared_ptr<sluice::detail::parse_policy> pol, std::vector<sluice::chunk> chunks, auto emit) {
        auto d = make(pol);
        std::vector<Out> out;
        for (auto& c : chunks) {
            out.clear();
            try {
                d(std::move(c), out);
            } catch (...) {
                for (auto& o : out) emit(o);
                throw;
            }
            for (auto& o : out) emit(o);
        }
    };
}

/// drive() for a format parser.
template <class Parser, class Out>
auto drive_parser() {
    return drive<Out>([](auto pol) { return sluice::detail::shard_parsers<Parser, Out>(pol); });
}

}  // namespace fuzz
