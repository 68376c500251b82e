#include <sluice/formats/tfrecord.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/shuffle.hpp>

#include <optional>
#include <set>

using sluice_test::cut;
using sluice_test::strings;
using tfrecord_p = sluice::detail::tfrecord_parser;

namespace {
std::vector<std::string> tfrecords(sluice::detail::rng& r, int n, std::size_t max) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) {
        std::string s(r.below(max + 1), '\0');
        for (auto& c : s) c = static_cast<char>(r.next());
        v.push_back(std::move(s));
    }
    return v;
}
std::string tfrecord_file(const std::vector<std::string>& rs) {
    std::string f;
    for (auto& s : rs) sluice::append_tfrecord(f, s);
    return f;
}
// Offset of record i in a file of `rs`.
std::uint64_t offset_of(const std::vector<std::string>& rs, std::size_t i) {
    std::uint64_t o = 0;
    for (std::size_t k = 0; k < i; ++k) o += 16 + rs[k].size();
    return o;
}
// The tfrecord stage's counter `name` in p's figures; nullopt when it has none.
std::optional<std::uint64_t> tfrecord_counter(const sluice::pipeline<sluice::host_batch>& p, const std::string& name) {
    for (auto& st : p.figures().stages)
        for (auto& [n, v] : st.counters)
            if (st.name == "tfrecord" && n == name) return v;
    return std::nullopt;
}
}  // namespace

TEST_CASE("tfrecord: records, offsets and indices, the same at every chunk size", "[tfrecord][streaming]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    // 8 MiB of records from empty to 300 KiB, cut from 1 byte up to 4 MiB.
    std::vector<std::string> want = tfrecords(r, 40, 300 << 10);
    for (auto& s : tfrecords(r, 200, 64)) want.push_back(s);
    const std::string file = tfrecord_file(want);
    for (int t = 0; t < 12; ++t) {
        const auto sizes = sluice_test::random_sizes(r, 4u << 20);
        auto p = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, sizes), {.data_at = 12});
        REQUIRE(p.error.empty());
        REQUIRE(strings(p.out) == want);
        REQUIRE(p.slices_of_chunks);
        for (std::size_t i = 0; i < p.out.size(); ++i) {
            REQUIRE(p.out[i].index == i);
            REQUIRE(p.out[i].offset == offset_of(want, i));
        }
    }
    // One byte at a time, on a smaller file.
    std::vector<std::string> small(want.end() - 100, want.end());
    auto p = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(tfrecord_file(small), {1}));
    REQUIRE(p.error.empty());
    REQUIRE(strings(p.out) == small);
}

TEST_CASE("tfrecord: records inside one chunk are slices of it", "[tfrecord]") {
    const std::vector<std::string> want = {"alpha", "beta", "", "gamma"};
    auto chunks = cut(tfrecord_file(want), {1 << 20});
    const std::byte* base = chunks[0].data.data();
    auto p = sluice_test::parse_chunks<tfrecord_p, sluice::record>(std::move(chunks));
    REQUIRE(strings(p.out) == want);
    REQUIRE(p.out[0].data.data() == base + 12);
    REQUIRE(p.out[1].data.data() == base + 16 + 5 + 12);
}

TEST_CASE("tfrecord: a bad data checksum is an error naming shard and offset, or skipped", "[tfrecord][corrupt]") {
    const std::vector<std::string> want = {"one", "two", "three", "four"};
    std::string file = tfrecord_file(want);
    const auto at = offset_of(want, 2);
    file[at + 12 + 1] ^= 0x20;  // "three" -> "tHree"
    auto e = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {7}, "d/x.tfrecord"));
    REQUIRE(e.error == "sluice: bad TFRecord data checksum (record 2) in 'd/x.tfrecord' at byte " + std::to_string(at));
    REQUIRE(strings(e.out) == std::vector<std::string>{"one", "two"});  // what came before is kept

    auto s = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {7}), {.corrupt = sluice::on_corrupt::skip});
    REQUIRE(s.error.empty());
    REQUIRE(s.skipped == 1);
    REQUIRE(strings(s.out) == std::vector<std::string>{"one", "two", "four"});
    REQUIRE(s.out[2].index == 3);

    auto unchecked = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {7}), {.verify = false});
    REQUIRE(unchecked.error.empty());
    REQUIRE(strings(unchecked.out) == std::vector<std::string>{"one", "two", "tHree", "four"});
}

TEST_CASE("tfrecord: a bad length checksum is an error, skipping finds the next record", "[tfrecord][corrupt]") {
    std::vector<std::string> want;
    for (int i = 0; i < 50; ++i) want.push_back("record " + std::to_string(i) + std::string(static_cast<std::size_t>(i * 37), 'x'));
    std::string file = tfrecord_file(want);
    const auto at = offset_of(want, 10);
    file[at + 2] ^= 1;  // the length field of record 10
    auto e = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {4096}, "x.tfrecord"));
    REQUIRE(e.error == "sluice: bad TFRecord length checksum in 'x.tfrecord' at byte " + std::to_string(at));
    REQUIRE(e.out.size() == 10);
    for (std::size_t size : {1ul, 13ul, 4096ul}) {
        auto s = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {size}), {.corrupt = sluice::on_corrupt::skip});
        INFO("chunk size " << size);
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 1);
        auto expect = want;
        expect.erase(expect.begin() + 10);
        REQUIRE(strings(s.out) == expect);
    }
}

TEST_CASE("tfrecord: truncated files and garbage", "[tfrecord][corrupt]") {
    const std::vector<std::string> want = {"first", "second record", "third"};
    const std::string file = tfrecord_file(want);
    const auto at = offset_of(want, 2);
    for (std::size_t keep : {at + 3, at + 12, at + 14, file.size() - 1}) {
        INFO("kept " << keep << " bytes");
        auto e = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file.substr(0, keep), {5}, "t.tfrecord"));
        REQUIRE(e.error == "sluice: truncated TFRecord (the shard ends inside a record) in 't.tfrecord' at byte " +
                               std::to_string(at));
        REQUIRE(strings(e.out) == std::vector<std::string>{"first", "second record"});
        auto s = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file.substr(0, keep), {5}),
                                                              {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.skipped == 1);
        REQUIRE(s.out.size() == 2);
    }
    std::string garbage(5000, '\0');
    sluice::detail::rng r(7);
    for (auto& c : garbage) c = static_cast<char>(r.next());
    auto g = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(garbage, {100}, "g"));
    REQUIRE(g.error == "sluice: bad TFRecord length checksum in 'g' at byte 0");
    auto gs = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(garbage, {100}), {.corrupt = sluice::on_corrupt::skip});
    REQUIRE(gs.error.empty());
    REQUIRE(gs.skipped == 1);
    REQUIRE(gs.out.empty());
    // A length over the limit, with checksums off, is refused rather than allocated.
    std::string huge;
    sluice::detail::put_le(huge, std::uint64_t{1} << 40, 8);
    huge += std::string(100, 'z');
    auto h = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(huge, {50}, "h"), {.verify = false, .max_record_bytes = 1 << 20});
    REQUIRE(h.error == "sluice: TFRecord length 1099511627776 over the limit of 1048576 bytes (raise it with max_record_bytes) in 'h' at byte 0");
}

TEST_CASE("tfrecord stage: gzip'd shards inflate on their own, skip counts in the stage's stats", "[tfrecord][gzip]") {
    const std::vector<std::string> want = {"a", "bb", "ccc", "dddd"};
    std::string bad = tfrecord_file(want);
    bad[offset_of(want, 1) + 12] ^= 1;
    auto chunks = cut(sluice_test::gzip(tfrecord_file(want)), {3}, "x.tfrecord.gz");
    for (auto& c : cut(bad, {1000}, "y.tfrecord")) chunks.push_back(std::move(c));
    std::vector<std::string> got;
    sluice::pipeline p(sluice::from(std::move(chunks)) | sluice::tfrecord({.on_corrupt = sluice::on_corrupt::skip}));
    for (auto& r : p) got.push_back(sluice_test::bytes_str(r.data));
    REQUIRE(got == std::vector<std::string>{"a", "bb", "ccc", "dddd", "a", "ccc", "dddd"});
    const auto f = p.figures();
    bool counted = false;
    for (auto& st : f.stages)
        for (auto& [name, v] : st.counters)
            if (st.name == "tfrecord" && name == "corrupt") counted = v == 1;
    REQUIRE(counted);
}

TEST_CASE("tfrecord stage: an error reaches the consumer after the records before it", "[tfrecord][corrupt]") {
    std::string file = tfrecord_file({"good", "bad!"});
    file[16 + 4 + 12] ^= 1;
    sluice::pipeline p(sluice::from(cut(file, {1 << 20}, "z.tfrecord")) | sluice::tfrecord());
    REQUIRE(p.next_blocking());
    REQUIRE_THROWS_WITH(p.next_blocking(), "sluice: bad TFRecord data checksum (record 1) in 'z.tfrecord' at byte 20");
}

TEST_CASE("tfrecord: a sound length over the limit skips that record whole", "[tfrecord][corrupt]") {
    const std::vector<std::string> want = {"small", std::string(5000, 'B'), "after"};
    const std::string file = tfrecord_file(want);
    auto e = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {300}, "l"), {.max_record_bytes = 1000});
    REQUIRE(e.error == "sluice: TFRecord length 5000 over the limit of 1000 bytes (raise it with max_record_bytes) in 'l' at byte 21");
    auto s = sluice_test::parse_chunks<tfrecord_p, sluice::record>(cut(file, {300}),
                                                          {.corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000});
    REQUIRE(s.error.empty());
    REQUIRE(s.skipped == 1);
    REQUIRE(strings(s.out) == std::vector<std::string>{"small", "after"});
    REQUIRE(s.out[1].index == 2);
}

// (No semicolon in a test's name: CMake's test discovery would cut it in two.)
TEST_CASE("tfrecord + batch: the data checksum is checked as batch copies, with shuffles between or not, "
          "and by the parser where a stage between reads the records", "[tfrecord][batch][corrupt]") {
    sluice::detail::rng r(sluice_test::test_seed());
    std::vector<std::string> want = tfrecords(r, 40, 30000);
    want[7] = std::string(20000, 'x');  // long enough for the three-chain path
    const std::string file = tfrecord_file(want);
    // 0: tfrecord | batch, 1: | shuffle | batch, 2: | map | batch, 3: | batch on two
    // workers, 4: | shuffle | map | batch, 5: gzip'd shard | batch
    auto run = [&](std::string f, int how) {
        auto src = sluice::from(how == 5 ? cut(sluice_test::gzip(f), {4096}, "d.tfrecord.gz")
                                         : cut(f, {4096, 65536}, "d.tfrecord")) |
                   sluice::tfrecord();
        auto b = sluice::batch({.size = 4, .concurrency = how == 3 ? 2u : 1u});
        auto same = [](sluice::record x) { return x; };
        if (how == 1) return sluice::pipeline(std::move(src) | sluice::shuffle({.buffer = 8, .seed = 3}) | std::move(b));
        if (how == 2) return sluice::pipeline(std::move(src) | sluice::map(same) | std::move(b));
        if (how == 4)
            return sluice::pipeline(std::move(src) | sluice::shuffle({.buffer = 8, .seed = 3}) | sluice::map(same) |
                                    std::move(b));
        return sluice::pipeline(std::move(src) | std::move(b));
    };
    const auto deferred = [](int how) { return how == 0 || how == 1 || how == 3; };
    for (int how : {0, 1, 2, 3, 4, 5}) {
        INFO("pipeline " << how);
        auto p = run(file, how);
        std::multiset<std::string> got;
        for (auto& hb : p)
            for (std::size_t i = 0; i + 1 < hb.offsets.size(); ++i)
                got.insert(sluice_test::bytes_str(hb.data).substr(hb.offsets[i], hb.offsets[i + 1] - hb.offsets[i]));
        REQUIRE(got == std::multiset<std::string>(want.begin(), want.end()));
        // Left to batch only where nothing between reads the bytes.
        if (deferred(how)) REQUIRE(tfrecord_counter(p, "checks_deferred") == want.size());
        else REQUIRE(tfrecord_counter(p, "checks_deferred").value_or(0) == 0u);  // gzip'd: known per shard, so 0
    }
    for (std::size_t bad : {std::size_t{5}, std::size_t{7}}) {
        std::string f = file;
        f[offset_of(want, bad) + 12 + want[bad].size() / 2] ^= 0x10;
        for (int how : {0, 1, 2, 3, 4, 5}) {
            INFO("record " << bad << ", pipeline " << how);
            auto p = run(f, how);
            std::size_t batches = 0;
            std::string error;
            try {
                for (auto& hb : p) batches += hb.offsets.size() > 1;
            } catch (const sluice::source_error& e) {
                error = e.what();
                REQUIRE(e.offset() == offset_of(want, bad));
            }
            // The same error wherever it is checked.
            REQUIRE(error == "sluice: bad TFRecord data checksum (record " + std::to_string(bad) + ") in 'd.tfrecord" +
                                 (how == 5 ? ".gz' at byte " + std::to_string(offset_of(want, bad)) +
                                                 " of the uncompressed stream"
                                           : "' at byte " + std::to_string(offset_of(want, bad))));
            // Without a shuffle the same batches arrive as when the parser checks: those
            // before the one that holds the bad record.
            if (how != 1 && how != 4) REQUIRE(batches == bad / 4);
            if (deferred(how)) REQUIRE(tfrecord_counter(p, "checks_deferred") > 0u);
        }
    }
}

TEST_CASE("tfrecord + batch: a corrupt record in a partial batch that drop_last drops is still an error",
          "[tfrecord][batch][corrupt]") {
    const std::vector<std::string> want = {"r0", "r1", "r2", "r3", "r4", "r5", "r6"};
    std::string f = tfrecord_file(want);
    f[offset_of(want, 6) + 12] ^= 1;  // in the last group of 3, which is dropped
    sluice::pipeline p(sluice::from(cut(f, {1 << 20}, "t.tfrecord")) | sluice::tfrecord() |
                       sluice::batch({.size = 4, .drop_last = true}));
    REQUIRE(p.next_blocking());
    REQUIRE_THROWS_WITH(p.next_blocking(), "sluice: bad TFRecord data checksum (record 6) in 't.tfrecord' at byte " +
                                               std::to_string(offset_of(want, 6)));
    REQUIRE(tfrecord_counter(p, "checks_deferred") == want.size());
    // Sound, the same pipeline gives one batch and ends.
    sluice::pipeline q(sluice::from(cut(tfrecord_file(want), {1 << 20}, "t.tfrecord")) | sluice::tfrecord() |
                       sluice::batch({.size = 4, .drop_last = true}));
    REQUIRE(q.next_blocking());
    REQUIRE(!q.next_blocking());
}

TEST_CASE("tfrecord + batch: batches of several MiB (streaming stores) hold the records byte for byte",
          "[tfrecord][batch]") {
    sluice::detail::rng r(sluice_test::test_seed());
    std::vector<std::string> want = tfrecords(r, 200, 100000);  // batches of 64: about 3 MiB on average, some over 4
    want.push_back(std::string(5u << 20, 'y'));  // one batch over 4 MiB for certain
    sluice::pipeline p(sluice::from(cut(tfrecord_file(want), {1 << 20}, "big.tfrecord")) | sluice::tfrecord() |
                       sluice::batch({.size = 64}));
    std::vector<std::string> got;
    for (auto& hb : p) {
        const std::string all = sluice_test::bytes_str(hb.data);
        for (std::size_t i = 0; i + 1 < hb.offsets.size(); ++i)
            got.push_back(all.substr(hb.offsets[i], hb.offsets[i + 1] - hb.offsets[i]));
    }
    REQUIRE(got == want);
    REQUIRE(tfrecord_counter(p, "checks_deferred") == want.size());
}

TEST_CASE("tfrecord + batch: skipping corrupt records, or not verifying, leaves nothing to batch", "[tfrecord][batch][corrupt]") {
    const std::vector<std::string> want = {"aaaa", "bbbb", "cccc", "dddd"};
    std::string f = tfrecord_file(want);
    f[offset_of(want, 1) + 12] ^= 1;
    sluice::pipeline p(sluice::from(cut(f, {1 << 20}, "s.tfrecord")) | sluice::tfrecord({.on_corrupt = sluice::on_corrupt::skip}) |
                       sluice::batch({.size = 8}));
    auto b = p.next_blocking();
    REQUIRE(b);
    REQUIRE(sluice_test::bytes_str(b->data) == "aaaaccccdddd");
    REQUIRE(!tfrecord_counter(p, "checks_deferred"));
    REQUIRE(tfrecord_counter(p, "corrupt") == 1u);
    sluice::pipeline q(sluice::from(cut(f, {1 << 20}, "s.tfrecord")) | sluice::tfrecord({.verify = false}) |
                       sluice::batch({.size = 8}));
    auto c = q.next_blocking();
    REQUIRE(c);
    REQUIRE(c->offsets.size() == 5);  // the damaged record too: nothing checks
    REQUIRE(!tfrecord_counter(q, "checks_deferred"));
}
