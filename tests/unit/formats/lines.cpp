#include <sluice/formats/lines.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/core/detail/random.hpp>
#include <sluice/ops/from.hpp>

namespace {
// Cut `text` into chunks of the given sizes (cycled) from one shard.
std::vector<sluice::chunk> cut_shared(const std::string& text, const std::vector<std::size_t>& sizes, const std::string& url = "f") {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{url, 0, 0});
    std::vector<sluice::chunk> out;
    std::size_t off = 0, k = 0;
    auto all = sluice::bytes::copy_of(text);
    do {
        const auto n = std::min(sizes[k++ % sizes.size()], text.size() - off);
        out.push_back({s, off, all.slice(off, n), off + n == text.size()});
        off += n;
    } while (off < text.size());
    return out;
}
std::vector<std::string> decode(std::vector<sluice::chunk> chunks) {
    std::vector<std::string> out;
    for (auto& r : sluice::pipeline(sluice::from(std::move(chunks)) | sluice::lines())) out.emplace_back(r.data.view());
    return out;
}
using V = std::vector<std::string>;
}  // namespace

TEST_CASE("one record per line, terminators dropped, last line without newline kept", "[lines]") {
    REQUIRE(decode(cut_shared("a\nbb\r\n\nccc", {100})) == V{"a", "bb", "", "ccc"});
    REQUIRE(decode(cut_shared("a\nb\n", {100})) == V{"a", "b"});
    REQUIRE(decode(cut_shared("", {100})) == V{});
}

TEST_CASE("lines cut by chunk boundaries are the same at every chunk size", "[lines][streaming]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    std::string text;
    V want;
    for (int i = 0; i < 500; ++i) {
        std::string line(r.below(300), 'a');
        for (auto& c : line) c = char('a' + r.below(26));
        want.push_back(line);
        text += line + (r.below(4) == 0 ? "\r\n" : "\n");
    }
    for (std::size_t size : {1, 2, 3, 7, 64, 1000, 100000}) {
        INFO("chunk size " << size);
        REQUIRE(decode(cut_shared(text, {size})) == want);
    }
    for (int t = 0; t < 20; ++t) {
        std::vector<std::size_t> sizes;
        for (int k = 0; k < 16; ++k) sizes.push_back(1 + r.below(500));
        REQUIRE(decode(cut_shared(text, sizes)) == want);
    }
}

TEST_CASE("records inside a chunk are slices of it, offsets and indices are exact", "[lines]") {
    auto chunks = cut_shared("alpha\nbeta\ngamma\n", {8});
    const auto* first_chunk = chunks[0].data.data();
    std::vector<sluice::record> rs;
    for (auto& r : sluice::pipeline(sluice::from(std::move(chunks)) | sluice::lines())) rs.push_back(r);
    REQUIRE(rs.size() == 3);
    REQUIRE(rs[0].data.data() == first_chunk);  // no copy
    REQUIRE(rs[1].offset == 6);                   // "beta" straddles two chunks: copied
    REQUIRE(rs[1].data.view() == "beta");
    REQUIRE(rs[2].offset == 11);
    REQUIRE(rs[2].index == 2);
    REQUIRE(rs[2].key() == "f#2");
}

TEST_CASE("chunks of several files may interleave", "[lines]") {
    auto a = cut_shared("a1\na2\na3\n", {4}, "A"), b = cut_shared("b1\nb2\n", {4}, "B");
    std::vector<sluice::chunk> mixed;
    for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        if (i < a.size()) mixed.push_back(a[i]);
        if (i < b.size()) mixed.push_back(b[i]);
    }
    auto got = decode(mixed);
    std::sort(got.begin(), got.end());
    REQUIRE(got == V{"a1", "a2", "a3", "b1", "b2"});
}

namespace {
struct limited {
    std::vector<std::string> lines;
    std::string error;
    std::uint64_t corrupt = 0, held_peak = 0, held_now = 0;
};
limited decode_limited(std::vector<sluice::chunk> chunks, sluice::decode_options o) {
    limited r;
    sluice::pipeline p(sluice::from(std::move(chunks)) | sluice::lines(std::move(o)));
    try {
        while (auto rec = p.next_blocking()) r.lines.emplace_back(rec->data.view());
    } catch (const sluice::source_error& e) {
        r.error = e.what();
    }
    for (auto& s : p.figures().stages)
        if (s.name == "lines")
            for (auto& [n, v] : s.counters) {
                if (n == "corrupt") r.corrupt = v;
                if (n == "held_bytes_peak") r.held_peak = v;
                if (n == "held_bytes") r.held_now = v;
            }
    return r;
}
}  // namespace

TEST_CASE("lines: a line over max_record_bytes is an error naming shard, offset and limit", "[lines][corrupt][limit]") {
    const std::string text = "ok\n" + std::string(5000, 'x') + "\nafter\n" + std::string(20, 'y') + "\nlast";
    for (std::size_t size : {1, 7, 300, 100000}) {
        INFO("chunk size " << size);
        auto e = decode_limited(cut_shared(text, {size}, "long.jsonl"), {.gzip = sluice::compression::none, .max_record_bytes = 1000});
        REQUIRE(e.lines == V{"ok"});
        REQUIRE(e.error ==
                "sluice: line over the limit of 1000 bytes (raise it with max_record_bytes) in 'long.jsonl' at byte 3");
        // The bytes held for a cut line never pass the limit.
        REQUIRE(e.held_peak <= 1000);
    }
}

TEST_CASE("lines: under skip a line over max_record_bytes is counted and the next lines arrive", "[lines][corrupt][limit]") {
    const std::string text = "ok\n" + std::string(5000, 'x') + "\nafter\n" + std::string(2000, 'z') + "\r\nlast";
    std::vector<sluice::source_error> seen;
    for (std::size_t size : {1, 7, 300, 100000}) {
        INFO("chunk size " << size);
        auto s = decode_limited(cut_shared(text, {size}, "long.jsonl"), {.on_corrupt = sluice::on_corrupt::skip,
                                                                  .max_record_bytes = 1000,
                                                                  .on_skip = [&](const sluice::source_error& e) { seen.push_back(e); }});
        REQUIRE(s.error.empty());
        REQUIRE(s.lines == V{"ok", "after", "last"});
        REQUIRE(s.corrupt == 2);
        REQUIRE(s.held_peak <= 1000);
        REQUIRE(s.held_now == 0);
    }
    REQUIRE(seen.size() == 8);
    REQUIRE(seen[0].offset() == 3);
    REQUIRE(seen[1].offset() == 5010);
    REQUIRE(seen[0].url() == "long.jsonl");
    // Skipped lines keep their index: the next lines keep their line numbers.
    std::vector<sluice::record> rs;
    for (auto& r : sluice::pipeline(sluice::from(cut_shared(text, {64})) |
                                    sluice::lines({.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000})))
        rs.push_back(r);
    REQUIRE(rs.size() == 3);
    REQUIRE(rs[1].index == 2);
    REQUIRE(rs[1].offset == 5004);
    REQUIRE(rs[2].index == 4);
}

TEST_CASE("lines: a line cut by chunk boundaries is held once and shows in held_bytes", "[lines][limit]") {
    const std::string line(10'000, 'q');
    auto r = decode_limited(cut_shared(line + "\nz\n", {1000}), {});
    REQUIRE(r.error.empty());
    REQUIRE(r.lines == V{line, "z"});
    REQUIRE(r.held_peak == 10'000);
    REQUIRE(r.held_now == 0);
}

TEST_CASE("lines: gzip'd lines over the limit count uncompressed offsets", "[lines][gzip][limit]") {
    const std::string text = "a\n" + std::string(3000, 'x') + "\nb\n";
    auto e = decode_limited(cut_shared(sluice_test::gzip(text), {100}, "t.jsonl.gz"), {.max_record_bytes = 100});
    REQUIRE(e.lines == V{"a"});
    REQUIRE(e.error == "sluice: line over the limit of 100 bytes (raise it with max_record_bytes) in 't.jsonl.gz' at "
                       "byte 2 of the uncompressed stream");
    auto s = decode_limited(cut_shared(sluice_test::gzip(text), {100}, "t.jsonl.gz"),
                            {.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 100});
    REQUIRE(s.lines == V{"a", "b"});
    REQUIRE(s.corrupt == 1);
}
