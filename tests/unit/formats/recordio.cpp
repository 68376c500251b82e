#include <sluice/formats/recordio.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/ops/from.hpp>

using sluice_test::cut;
using sluice_test::strings;
using recordio_p = sluice::detail::recordio_parser;

namespace {
const std::string magic("\x0a\x23\xd7\xce", 4);

std::string file_of(const std::vector<std::string>& rs) {
    std::string f;
    for (auto& s : rs) sluice::append_recordio(f, s);
    return f;
}
// Records of random sizes, some holding the magic word at 4-byte boundaries (split by the
// writer) and some off the boundaries (not split).
std::vector<std::string> records(sluice::detail::rng& r, int n, std::size_t max) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) {
        std::string s(r.below(max + 1), '\0');
        for (auto& c : s) c = static_cast<char>('a' + r.below(26));
        const auto k = r.below(4);
        for (std::uint64_t m = 0; m < k && s.size() >= 8; ++m) {
            std::size_t at = r.below(s.size() - 4);
            if (i % 2) at &= ~std::size_t{3};
            s.replace(at, 4, magic);
        }
        if (i % 7 == 0) s = magic + s + magic;  // parts that are empty
        v.push_back(std::move(s));
    }
    return v;
}
}  // namespace

TEST_CASE("recordio: the writer splits records at the magic word and the parser joins them", "[recordio]") {
    const std::string rec = "abcd" + magic + "efgh";
    std::string file;
    sluice::append_recordio(file, rec);
    // Two parts: cflag 1 with "abcd", cflag 3 with "efgh".
    REQUIRE(file.size() == 2 * (8 + 4));
    REQUIRE(sluice::detail::le32(reinterpret_cast<const std::byte*>(file.data() + 4)) == ((1u << 29) | 4));
    REQUIRE(sluice::detail::le32(reinterpret_cast<const std::byte*>(file.data() + 16)) == ((3u << 29) | 4));
    auto p = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(file, {5}));
    REQUIRE(p.error.empty());
    REQUIRE(strings(p.out) == std::vector<std::string>{rec});
}

TEST_CASE("recordio: the same records at every chunk size, unsplit records are slices", "[recordio][streaming]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    auto want = records(r, 60, 200 << 10);
    for (auto& s : records(r, 300, 40)) want.push_back(s);
    const std::string file = file_of(want);
    for (int t = 0; t < 12; ++t) {
        auto p = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(file, sluice_test::random_sizes(r, 4u << 20)));
        REQUIRE(p.error.empty());
        REQUIRE(strings(p.out) == want);
        for (std::size_t i = 0; i < p.out.size(); ++i) REQUIRE(p.out[i].index == i);
    }
    std::vector<std::string> small(want.end() - 150, want.end());
    auto p = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(file_of(small), {1}));
    REQUIRE(strings(p.out) == small);
    // Without magic words inside, every record lying in one chunk is a slice of it.
    std::vector<std::string> plain = {"x", "yy", "zzz", std::string(5000, 'q'), "", "end"};
    auto s = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(file_of(plain), {1000, 3, 7000}), {.data_at = 8});
    REQUIRE(strings(s.out) == plain);
    REQUIRE(s.slices_of_chunks);
}

TEST_CASE("recordio: bad magic, broken part sequences and truncation", "[recordio][corrupt]") {
    std::vector<std::string> want;
    for (int i = 0; i < 20; ++i) want.push_back("rec" + std::to_string(i) + std::string(static_cast<std::size_t>(i), '.'));
    std::string file;
    std::vector<std::size_t> at;
    for (auto& s : want) {
        at.push_back(file.size());
        sluice::append_recordio(file, s);
    }
    {
        std::string bad = file;
        bad[at[5]] = 'X';
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(bad, {9}, "m.rec"));
        REQUIRE(e.error == "sluice: bad RecordIO magic in 'm.rec' at byte " + std::to_string(at[5]));
        REQUIRE(e.out.size() == 5);
        auto s = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(bad, {9}), {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 1);
        auto expect = want;
        expect.erase(expect.begin() + 5);
        REQUIRE(strings(s.out) == expect);
    }
    {
        // A last part with no first part before it.
        std::string bad = file;
        bad[at[3] + 7] = static_cast<char>(bad[at[3] + 7] | 0x60);  // cflag 3
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(bad, {64}, "c.rec"));
        REQUIRE(e.error == "sluice: broken RecordIO split record: a last part without a first part in 'c.rec' at byte " +
                               std::to_string(at[3]));
        auto s = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(bad, {64}), {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.skipped == 1);
        REQUIRE(s.out.size() == want.size() - 1);
    }
    for (std::size_t keep : {at[19] + 2, at[19] + 8, file.size() - 1}) {
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(file.substr(0, keep), {4}, "t.rec"));
        INFO("kept " << keep);
        REQUIRE(e.error == "sluice: truncated RecordIO record (the shard ends inside a part) in 't.rec' at byte " +
                               std::to_string(at[19]));
        REQUIRE(e.out.size() == 19);
    }
    {
        // Cut inside the last record's padding: the offset is its header's, not past the end.
        std::string f;
        sluice::append_recordio(f, "abcde");  // 5 bytes + 3 of padding
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(f.substr(0, f.size() - 2), {3}, "p.rec"));
        REQUIRE(e.error == "sluice: truncated RecordIO record (the shard ends inside a part) in 'p.rec' at byte 0");
    }
    {
        // The shard ends after a first part.
        std::string split;
        sluice::append_recordio(split, "abcd" + magic + "efgh");
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(split.substr(0, 12), {100}, "s.rec"));
        REQUIRE(e.error == "sluice: truncated RecordIO record (the shard ends before its last part) in 's.rec' at byte 0");
    }
    auto g = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(std::string(1000, 'g'), {100}, "g.rec"));
    REQUIRE(g.error == "sluice: bad RecordIO magic in 'g.rec' at byte 0");
}

TEST_CASE("recordio stage: from chunks to records in a pipeline", "[recordio]") {
    const std::vector<std::string> want = {"first", "sec" + magic + "ond", "third"};
    std::vector<std::string> got;
    for (auto& r : sluice::pipeline(sluice::from(cut(file_of(want), {6})) | sluice::recordio()))
        got.push_back(sluice_test::bytes_str(r.data));
    REQUIRE(got == want);
}

TEST_CASE("recordio: a record over max_record_bytes is an error naming shard, offset and limit, and skip reads on", "[recordio][corrupt][limit]") {
    // One whole part over the limit, and a split record whose joined size is over it.
    const std::string big(5000, 'x');
    std::string split_rec(600, 'y');
    split_rec.replace(400, 4, magic);  // split by the writer into two parts of 400 and 196
    const std::string f = file_of({"small", big, "after", split_rec + std::string(600, 'z'), "last"});
    const std::size_t big_at = 8 + 8;  // "small" padded to 8 after its header
    for (std::size_t size : {1, 64, 100000}) {
        INFO("chunk size " << size);
        auto e = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(f, {size}, "r.rec"), {.max_record_bytes = 1000});
        REQUIRE(strings(e.out) == std::vector<std::string>{"small"});
        REQUIRE(e.error == "sluice: RecordIO part of 5000 bytes over the limit of 1000 bytes (raise it with "
                           "max_record_bytes) in 'r.rec' at byte " + std::to_string(big_at));
        auto s = sluice_test::parse_chunks<recordio_p, sluice::record>(cut(f, {size}, "r.rec"),
                                                              {.corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000});
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 2);
        REQUIRE(strings(s.out) == std::vector<std::string>{"small", "after", "last"});
        REQUIRE(s.held_peak <= 1000);
        REQUIRE(s.held_after == 0);
    }
}
