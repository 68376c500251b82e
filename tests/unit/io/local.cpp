#include <sluice/io/local.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>

#include <sluice/formats/lines.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/formats/tar.hpp>
#include <sluice/formats/tfrecord.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/shuffle.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

namespace {
std::vector<sluice::chunk> read_all(const std::vector<std::string>& paths, sluice::read_options o) {
    std::vector<sluice::shard> shards;
    for (auto& p : paths) shards.push_back({p, 0, shards.size()});
    std::vector<sluice::chunk> out;
    for (auto& c : sluice::pipeline(sluice::from(shards) | sluice::read(o))) out.push_back(c);
    return out;
}
}  // namespace

TEST_CASE("files are read in chunks of the configured size, the last one flagged", "[local]") {
    sluice_test::temp_dir d;
    std::string content(10'000, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = char(i * 131);
    const auto a = d.write("a.bin", content), empty = d.write("empty.bin", "");
    auto chunks = read_all({a, empty}, {.chunk_size = 4096});
    REQUIRE(chunks.size() == 4);
    REQUIRE(chunks[0].data.size() == 4096);
    REQUIRE(chunks[2].data.size() == 10'000 - 8192);
    REQUIRE(chunks[2].last);
    REQUIRE_FALSE(chunks[1].last);
    REQUIRE(chunks[1].offset == 4096);
    std::string joined;
    for (int i = 0; i < 3; ++i) joined += chunks[i].data.view();
    REQUIRE(joined == content);
    REQUIRE(chunks[3].source->url == empty);  // an empty file is one empty last chunk
    REQUIRE(chunks[3].data.empty());
    REQUIRE(chunks[3].last);
}

TEST_CASE("an exact multiple of the chunk size ends without an empty chunk", "[local]") {
    sluice_test::temp_dir d;
    auto chunks = read_all({d.write("a", std::string(8192, 'q'))}, {.chunk_size = 4096});
    REQUIRE(chunks.size() == 2);
    REQUIRE(chunks[1].last);
}

TEST_CASE("a missing file is an error naming the path, after the chunks before it", "[local]") {
    sluice_test::temp_dir d;
    const auto ok = d.write("ok", "hello"), missing = d / "missing.txt";
    sluice::pipeline p(sluice::from<sluice::shard>({{ok, 0, 0}, {missing, 0, 1}}) | sluice::read());
    auto first = p.next_blocking();
    REQUIRE(first);
    REQUIRE(first->data.view() == "hello");
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("cannot open '" + missing + "'") &&
                                                Catch::Contains("No such file"));
}

TEST_CASE("a directory given as a file is an error naming it", "[local]") {
    sluice_test::temp_dir d;
    sluice::pipeline p(sluice::from<sluice::shard>({{d.path().string(), 0, 0}}) | sluice::read());
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("cannot read '" + d.path().string() + "'"));
}

TEST_CASE("an unreadable file is an error naming it", "[local]") {
    if (::geteuid() == 0) {
        WARN("SKIPPED: running as root, which reads files whatever their mode");
        return;
    }
    sluice_test::temp_dir d;
    const auto p = d.write("secret", "x");
    std::filesystem::permissions(p, std::filesystem::perms::none);
    sluice::pipeline pl(sluice::from<sluice::shard>({{p, 0, 0}}) | sluice::read());
    REQUIRE_THROWS_WITH(pl.next_blocking(), Catch::Contains("cannot open '" + p + "'"));
}

TEST_CASE("chunk buffers are recycled through the runtime's pool", "[local]") {
    sluice_test::temp_dir d;
    const auto a = d.write("a", std::string(64 * 32 * 1024, 'x'));
    // Consume chunk by chunk, dropping each: the reader reuses the same few buffers.
    std::set<const std::byte*> distinct;
    sluice::pipeline p(
        sluice::from<sluice::shard>({{a, 0, 0}}) | sluice::read({.chunk_size = 32 * 1024, .map = false, .out = {1, 0}}));
    std::size_t n = 0;
    while (auto c = p.next_blocking()) {
        distinct.insert(c->data.data());
        ++n;
    }
    REQUIRE(n == 64);
    REQUIRE(distinct.size() < 8);
}

TEST_CASE("mapped files give the same chunks as reads, as windows of one mapping", "[local]") {
    sluice_test::temp_dir d;
    std::string content(10'000, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = char(i * 7 + 1);
    const auto a = d.write("a.bin", content), empty = d.write("empty.bin", "");
    auto read = read_all({a, empty}, {.chunk_size = 4096, .map = false});
    auto mapped = read_all({a, empty}, {.chunk_size = 4096, .map_min_bytes = 0});
    REQUIRE(mapped.size() == read.size());
    for (std::size_t i = 0; i < read.size(); ++i) {
        REQUIRE(mapped[i].offset == read[i].offset);
        REQUIRE(mapped[i].last == read[i].last);
        REQUIRE(mapped[i].data.view() == read[i].data.view());
        REQUIRE(read[i].data.file() == nullptr);
    }
    REQUIRE(mapped[0].data.file() != nullptr);
    REQUIRE(mapped[0].data.file()->size() == content.size());  // the whole file, mapped once
    REQUIRE(mapped[1].data.file() == mapped[0].data.file());
    REQUIRE(mapped[0].data.owner_capacity() == 4096);  // each window pins its own pages
    REQUIRE(mapped[1].data.data() == mapped[0].data.data() + 4096);
    REQUIRE(mapped[3].data.file() == nullptr);  // the empty file: nothing to map
}

TEST_CASE("small files are read unless a shuffle after read holds their records, and large files are mapped", "[local]") {
    sluice_test::temp_dir d;
    const auto small = d.write("small.bin", std::string(10'000, 's'));
    const auto big = d.write("big.bin", std::string(2u << 20, 'b'));  // over map_min_bytes (1 MiB)
    const std::vector<sluice::shard> shards{{small, 0, 0}, {big, 0, 1}};
    auto mapped_by_url = [](auto&& pipeline) {
        std::map<std::string, bool> out;
        for (auto& r : pipeline) out[r.source->url] = r.data.file() != nullptr;
        return out;
    };
    // Nothing holds the records: the small file is read into a recycled buffer.
    auto plain = mapped_by_url(sluice::pipeline(sluice::from(shards) | sluice::read() | sluice::raw({})));
    CHECK_FALSE(plain[small]);
    CHECK(plain[big]);
    // A shuffle after read holds them: every file is mapped (held records pin page cache).
    auto held = mapped_by_url(
        sluice::pipeline(sluice::from(shards) | sluice::read() | sluice::raw({}) | sluice::shuffle({.buffer = 4})));
    CHECK(held[small]);
    CHECK(held[big]);
    // A shuffle of what a map made of the records (decoded images, say) holds memory of
    // its own: the small file is read.
    std::atomic<int> small_mapped{-1};
    auto sizes = sluice::pipeline(sluice::from(shards) | sluice::read() | sluice::raw({}) |
                                  sluice::map([&](sluice::record r) {
                                      if (r.source->url == small) small_mapped = r.data.file() != nullptr;
                                      return r.data.size();
                                  }) |
                                  sluice::shuffle({.buffer = 4}));
    std::size_t total = 0;
    for (auto n : sizes) total += n;
    CHECK(total == 10'000 + (2u << 20));
    CHECK(small_mapped == 0);
    // A shuffle of the shards, before read, holds no records.
    auto before = mapped_by_url(sluice::pipeline(sluice::from(shards) | sluice::shuffle({.buffer = 2}) | sluice::read() | sluice::raw({})));
    CHECK_FALSE(before[small]);
    // map_min_bytes = 0 maps every file; map = false maps none.
    auto all = mapped_by_url(sluice::pipeline(sluice::from(shards) | sluice::read({.map_min_bytes = 0}) | sluice::raw({})));
    CHECK(all[small]);
    auto none = mapped_by_url(sluice::pipeline(sluice::from(shards) | sluice::read({.map = false}) | sluice::raw({})));
    CHECK_FALSE(none[big]);
    CHECK(plain.size() == 2);
    CHECK(held.size() == 2);
}

namespace {
/// Resident kB of the mapping that holds `p`, from /proc/self/smaps.
long resident_kb(const void* p) {
    std::ifstream in("/proc/self/smaps");
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(in, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
            inside = a >= lo && a < hi;
            continue;
        }
        long kb = 0;
        if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kb) == 1) return kb;
    }
    return -1;
}
}  // namespace

TEST_CASE("a record kept from a mapped window pins only its own pages, with no copy", "[local]") {
    sluice_test::temp_dir d;
    std::string content(8u << 20, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = char(i * 13 + 5);
    const auto a = d.write("big.bin", content);
    std::vector<sluice::bytes> kept;
    const std::byte* base = nullptr;
    {
        auto chunks = read_all({a}, {.chunk_size = 4u << 20});
        REQUIRE(chunks.size() == 2);
        base = chunks[0].data.file()->data();
        REQUIRE(resident_kb(base) >= 8 * 1024);  // each window populated as it was sent
        // What the shuffle does with a record it holds: compact it.
        auto small = chunks[0].data.slice(100'000, 50'000).compact();
        REQUIRE(small.data() == chunks[0].data.data() + 100'000);  // no copy
        REQUIRE(small.owner_capacity() == 50'000);
        REQUIRE(small.file() == chunks[0].data.file());
        kept.push_back(small);
    }
    sluice::detail::file_mapping::sweep_pending();  // what read() does before each window it sends
    // The windows are gone; the mapping stays for the kept record, and only the blocks
    // it lies in stay resident (16 KiB blocks: 50,000 bytes span at most 5 of them), or,
    // where the kernel maps the page cache's large folios whole (ext4 on Linux >= 6.16
    // maps up to 2 MiB at a time), the one folio they lie in: not the 8 MiB.
    REQUIRE(kept[0].view() == std::string_view(content).substr(100'000, 50'000));
    const long kb = resident_kb(base);
    INFO("resident kB " << kb);
    REQUIRE(kb > 0);
    REQUIRE(kb <= 2048 + 5 * 16);
}

TEST_CASE("records that straddle mapped windows are views across them, not copies", "[local]") {
    sluice_test::temp_dir d;
    const auto a = d.write("a.bin", std::string(10'000, 'z'));
    auto chunks = read_all({a}, {.chunk_size = 4096, .map_min_bytes = 0});
    std::vector<sluice::bytes> parts{chunks[0].data.slice(4000, 96), chunks[1].data, chunks[2].data.slice(0, 100)};
    auto joined = sluice::bytes::joined_in_place(parts);
    REQUIRE(joined.file() == chunks[0].data.file());
    REQUIRE(joined.data() == chunks[0].data.data() + 4000);
    REQUIRE(joined.size() == 96 + 4096 + 100);
    std::vector<sluice::bytes> apart{chunks[0].data.slice(0, 10), chunks[1].data};  // not end to end
    REQUIRE(sluice::bytes::joined_in_place(apart).file() == nullptr);
}

TEST_CASE("a mapped file that shrinks while read is an error naming it and the offset, not SIGBUS", "[local]") {
    sluice_test::temp_dir d;
    std::string content;
    for (int i = 0; content.size() < (1u << 20); ++i) content += "line " + std::to_string(i) + "\n";
    const auto a = d.write("shrinks.txt", content);
    sluice::pipeline p(sluice::from<sluice::shard>({{a, 0, 0}}) |
                       sluice::read({.chunk_size = 4096, .map_min_bytes = 0, .out = {1, 0}}) | sluice::lines({.out = {1, 0}}));
    auto first = p.next_blocking();
    REQUIRE(first);
    REQUIRE(first->data.view() == "line 0");
    REQUIRE(::truncate(a.c_str(), 8192) == 0);  // the pages past 8 KiB are gone from the mapping
    std::size_t lines = 1;
    try {
        while (auto r = p.next_blocking()) {
            REQUIRE(r->data.view().find('\0') == std::string_view::npos);  // no zeros passed on as data
            ++lines;
        }
        FAIL("the pipeline ended without an error after the file shrank");
    } catch (const sluice::source_error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find("the file shrank while it was read") != std::string::npos);
        REQUIRE(e.url() == a);
        REQUIRE(e.offset() >= 8192);
        REQUIRE(e.offset() < content.size());
    }
    REQUIRE(lines < 100'000);
}

namespace {
/// A read stage's counter, 0 when it has none.
template <class T>
std::uint64_t read_stage_counter(const sluice::pipeline<T>& p, const std::string& name) {
    for (auto& st : p.figures().stages)
        for (auto& [n, v] : st.counters)
            if (st.name == "read" && n == name) return v;
    return 0;
}
/// Every record of every batch, by content.
std::multiset<std::string> batched_records(sluice::pipeline<sluice::host_batch>& p) {
    std::multiset<std::string> got;
    for (auto& hb : p)
        for (std::size_t i = 0; i + 1 < hb.offsets.size(); ++i)
            got.insert(std::string(hb.data.view().substr(hb.offsets[i], hb.offsets[i + 1] - hb.offsets[i])));
    return got;
}
std::string patterned_bytes(int shard, int i, std::size_t size) {
    std::string s(size, '\0');
    for (std::size_t k = 0; k < size; ++k) s[k] = char(shard * 31 + i * 7 + k * 13);
    return s;
}
}  // namespace

// (No semicolon in a test's name: CMake's test discovery would cut it in two.)
TEST_CASE("shards whose records reach batch untouched are read by call: headers and records with pread, "
          "none where a stage between reads the bytes or a shard is gzip'd", "[local][by_call]") {
    sluice_test::temp_dir d;
    std::vector<sluice::shard> shards;
    std::multiset<std::string> want;
    for (int f = 0; f < 3; ++f) {  // 1.2 MB each: over read's by-call floor of 1 MiB
        std::string tar, tfr;
        for (int i = 0; i < 40; ++i) {
            const std::string rec = patterned_bytes(f, i, 30'000 + 97 * i);
            // Every tenth name over 100 bytes: a GNU long-name member first, whose body
            // tar reads (with pread, by call).
            const std::string dir = i % 10 == 3 ? std::string(120, 'd') + "/" : "";
            sluice::append_tar_file(tar, dir + "s" + std::to_string(f) + "/r" + std::to_string(i) + ".bin", rec);
            want.insert(rec);
        }
        sluice::end_tar(tar);
        shards.push_back({d.write("shard-" + std::to_string(f) + ".tar", tar), 0, shards.size()});
    }
    const auto same = [](sluice::record r) { return r; };
    // 4 KiB windows: headers cut by window boundaries go through the cursor's stash.
    for (std::size_t window : {std::size_t{4096}, std::size_t{4} << 20}) {
        INFO("window " << window);
        const sluice::read_options ro{.chunk_size = window};
        {  // read | gunzip | tar | shuffle | batch: by call
            sluice::pipeline p(sluice::from(shards) | sluice::read(ro) | sluice::gunzip() | sluice::tar({.gzip = sluice::compression::none}) |
                               sluice::shuffle({.buffer = 50, .seed = 4}) | sluice::batch({.size = 16}));
            REQUIRE(batched_records(p) == want);
            REQUIRE(read_stage_counter(p, "files_by_call") == shards.size());
        }
        {  // tar's own gzip detection, batch on two workers: by call
            sluice::pipeline p(sluice::from(shards) | sluice::read(ro) | sluice::tar() | sluice::batch({.size = 16, .concurrency = 2}));
            REQUIRE(batched_records(p) == want);
            REQUIRE(read_stage_counter(p, "files_by_call") == shards.size());
        }
        {  // a user's map between reads the bytes: mapped and populated as before
            sluice::pipeline p(sluice::from(shards) | sluice::read(ro) | sluice::tar() | sluice::map(same) | sluice::batch({.size = 16}));
            REQUIRE(batched_records(p) == want);
            REQUIRE(read_stage_counter(p, "files_by_call") == 0u);
        }
    }
    {  // raw: each file one record, a view across its windows, read whole by batch
        std::multiset<std::string> files;
        for (auto& sh : shards) files.insert(sluice_test::slurp_file(sh.url));
        sluice::pipeline p(sluice::from(shards) | sluice::read() | sluice::raw() | sluice::shuffle({.buffer = 2}) |
                           sluice::batch({.size = 2}));
        REQUIRE(batched_records(p) == files);
        REQUIRE(read_stage_counter(p, "files_by_call") == shards.size());
    }
    // A gzip'd shard is inflated, so read whole: not by call, while a plain one beside it is.
    std::string tar;
    sluice::append_tar_file(tar, "z/only.bin", patterned_bytes(9, 0, 1'500'000));
    sluice::end_tar(tar);
    auto mixed = shards;
    mixed.push_back({d.write("z.tar.gz", sluice_test::gzip(tar, 1)), 0, mixed.size()});
    auto zipped = want;
    zipped.insert(patterned_bytes(9, 0, 1'500'000));
    sluice::pipeline p(sluice::from(mixed) | sluice::read() | sluice::tar() | sluice::batch({.size = 16}));
    REQUIRE(batched_records(p) == zipped);
    REQUIRE(read_stage_counter(p, "files_by_call") == shards.size());
}

TEST_CASE("tfrecord shards read by call: a bad data checksum is found as batch reads the record, "
          "or drops it, naming the shard and offset", "[local][by_call]") {
    sluice_test::temp_dir d;
    std::string f;
    std::vector<std::uint64_t> at;
    std::multiset<std::string> want;
    for (int i = 0; i < 50; ++i) {
        at.push_back(f.size());
        want.insert(patterned_bytes(1, i, 25'000 + 5 * i));
        sluice::append_tfrecord(f, patterned_bytes(1, i, 25'000 + 5 * i));
    }
    const auto good = d.write("good.tfrecord", f);
    // 0: read | tfrecord | shuffle | batch; 1: 4 KiB windows (footers and headers cut by
    // them) through gunzip's detection; 2: batch drops the last 2 records (drop_last),
    // where the shuffle puts record 33 (seed 2), and checks them all the same.
    auto run = [&](const std::string& path, int how) {
        const sluice::read_options ro{.chunk_size = how == 1 ? std::size_t{4096} : std::size_t{4} << 20};
        auto records = how == 1 ? sluice::from<sluice::shard>({{path, 0, 0}}) | sluice::read(ro) | sluice::gunzip() |
                                      sluice::tfrecord({.gzip = sluice::compression::none})
                                : sluice::from<sluice::shard>({{path, 0, 0}}) | sluice::read(ro) | sluice::tfrecord();
        return sluice::pipeline(std::move(records) | sluice::shuffle({.buffer = 20, .seed = 2}) |
                                sluice::batch({.size = 8, .drop_last = how == 2}));
    };
    for (int how : {0, 1}) {
        INFO("pipeline " << how);
        auto ok = run(good, how);
        REQUIRE(batched_records(ok) == want);
        REQUIRE(read_stage_counter(ok, "files_by_call") == 1u);
    }
    // Which records the shuffle leaves for the dropped tail (the same order for every file
    // of the same record count: the shuffle draws by position, not by content).
    std::set<std::string> tail;
    {
        auto ok = run(good, 2);
        auto kept = batched_records(ok);
        REQUIRE(kept.size() == 48);
        for (auto& w : want)
            if (!kept.count(w)) tail.insert(w);
        REQUIRE(tail.size() == 2);
    }
    for (int how : {0, 1, 2}) {
        INFO("pipeline " << how);
        std::size_t bad_one = 33;
        if (how == 2)  // a record of the dropped tail
            for (std::size_t i = 0; i < 50; ++i)
                if (tail.count(patterned_bytes(1, int(i), 25'000 + 5 * i))) bad_one = i;
        std::string g = f;
        g[at[bad_one] + 12 + 1000] ^= 0x20;
        const auto bad = d.write("bad" + std::to_string(how) + ".tfrecord", g);
        auto p = run(bad, how);
        try {
            for (auto& b : p) (void)b;
            FAIL("a corrupt record passed");
        } catch (const sluice::source_error& e) {
            INFO(e.what());
            REQUIRE(e.url() == bad);
            REQUIRE(e.offset() == at[bad_one]);
            REQUIRE(std::string(e.what()).find("checksum") != std::string::npos);
        }
        REQUIRE(read_stage_counter(p, "files_by_call") == 1u);
    }
}

TEST_CASE("tfrecord shards read by call: later epochs take the record boundaries kept from the first, "
          "the same records with the same ordinals, none where a stage between reads the bytes", "[local][by_call][tfrecord]") {
    sluice_test::temp_dir d;
    std::vector<std::string> paths;
    std::map<std::pair<std::string, std::uint64_t>, std::string> want;  // (shard, ordinal) -> bytes
    for (int f = 0; f < 2; ++f) {  // 1.25 MB each: over read's by-call floor of 1 MiB
        std::string t;
        for (int i = 0; i < 50; ++i) sluice::append_tfrecord(t, patterned_bytes(f, i, 25'000 + 5 * i));
        paths.push_back(d.write("e" + std::to_string(f) + ".tfrecord", t));
        for (int i = 0; i < 50; ++i) want[{paths.back(), std::uint64_t(i)}] = patterned_bytes(f, i, 25'000 + 5 * i);
    }
    const int epochs = 3;
    std::vector<sluice::shard> shards;
    for (int e = 0; e < epochs; ++e)
        for (auto& path : paths) shards.push_back({path, static_cast<std::uint32_t>(e), shards.size() % paths.size()});
    auto counter = [](const sluice::pipeline<sluice::host_batch>& p, const std::string& name) {
        std::optional<std::uint64_t> v;
        for (auto& st : p.figures().stages)
            for (auto& [n, c] : st.counters)
                if (st.name == "tfrecord" && n == name) v = c;
        return v;
    };
    // Every record of every batch, by shard and ordinal: each must come `epochs` times,
    // each time the bytes written at that ordinal.
    auto check = [&](sluice::pipeline<sluice::host_batch>& p) {
        std::map<std::pair<std::string, std::uint64_t>, int> seen;
        for (auto& hb : p)
            for (std::size_t i = 0; i + 1 < hb.offsets.size(); ++i) {
                const std::pair<std::string, std::uint64_t> at{hb.sources[i]->url, hb.indices[i]};
                INFO(at.first << " #" << at.second);
                REQUIRE(want.count(at));
                REQUIRE(sluice_test::bytes_str(hb.data).substr(hb.offsets[i], hb.offsets[i + 1] - hb.offsets[i]) == want[at]);
                ++seen[at];
            }
        REQUIRE(seen.size() == want.size());
        for (auto& [at, n] : seen) REQUIRE(n == epochs);
    };
    // 4 KiB windows: headers and footers cut by window boundaries, consumed unread.
    for (std::size_t window : {std::size_t{4096}, std::size_t{4} << 20}) {
        INFO("window " << window);
        const sluice::read_options ro{.chunk_size = window};
        sluice::pipeline p(sluice::from(shards) | sluice::read(ro) | sluice::tfrecord() |
                           sluice::shuffle({.buffer = 30, .seed = 5}) | sluice::batch({.size = 8}));
        check(p);
        REQUIRE(read_stage_counter(p, "files_by_call") == shards.size());
        REQUIRE(counter(p, "checks_deferred") == want.size() * epochs);  // every record checked by batch
        REQUIRE(counter(p, "indexed") == want.size() * (epochs - 1));   // all but the first epoch's
    }
    {  // a map between reads the bytes: the parser checks, nothing is kept
        const auto same = [](sluice::record r) { return r; };
        sluice::pipeline p(sluice::from(shards) | sluice::read() | sluice::tfrecord() | sluice::map(same) |
                           sluice::batch({.size = 8}));
        check(p);
        REQUIRE(counter(p, "checks_deferred").value_or(0) == 0u);
        REQUIRE(counter(p, "indexed").value_or(0) == 0u);
    }
}

TEST_CASE("tfrecord: boundaries kept for a file that do not hold to its end, or not where it is, give way to its headers",
          "[local][by_call][tfrecord]") {
    sluice_test::temp_dir d;
    std::string t;
    std::vector<std::uint64_t> at;
    std::vector<std::string> want;
    for (int i = 0; i < 20; ++i) {
        at.push_back(t.size());
        want.push_back(patterned_bytes(2, i, 3'000 + 11 * i));
        sluice::append_tfrecord(t, want.back());
    }
    const std::string path = d.write("k.tfrecord", t);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    auto mapping = sluice::detail::file_mapping::open(fd, t.size(), path, /*by_call=*/true);
    REQUIRE(mapping);
    REQUIRE(mapping->by_call());
    const auto key = sluice::detail::record_index::key_of(path, fd);
    ::close(fd);
    REQUIRE(key);
    // What the parser finds in the file itself: each record's entry.
    std::vector<sluice::detail::record_index::entry> truth;
    for (int i = 0; i < 20; ++i)
        truth.push_back({at[i], static_cast<std::uint32_t>(want[i].size()), sluice::crc32c_mask(sluice::crc32c(want[i].data(), want[i].size()))});
    auto parse = [&](std::vector<sluice::detail::record_index::entry> kept, std::size_t window) {
        auto pol = std::make_shared<sluice::detail::parse_policy>();
        pol->defer_data_crc = true;
        pol->index = std::make_shared<sluice::detail::record_index>();
        std::atomic<std::uint64_t> indexed{0};
        pol->indexed = &indexed;
        pol->index->keep(*key, std::move(kept));
        sluice::detail::tfrecord_parser p;
        p.pol = pol.get();
        p.src = std::make_shared<const sluice::shard>(sluice::shard{path, 0, 0});
        std::vector<sluice::record> out;
        for (std::size_t off = 0; off < t.size(); off += window) {
            const std::size_t n = std::min(window, t.size() - off);
            p.cur.feed(sluice::bytes(std::make_shared<const sluice::buffer>(mapping, off, n), n));
            p.parse(out);
        }
        p.finish(out);
        for (std::size_t i = 0; i < out.size(); ++i) {
            INFO("record " << i);
            REQUIRE(out[i].index == i);
            REQUIRE(out[i].offset == at[i]);
            REQUIRE(out[i].unchecked_crc32c == truth[i].crc);
            std::string got(out[i].data.size(), '\0');
            out[i].data.copy_to(reinterpret_cast<std::byte*>(got.data()), 0, got.size());
            REQUIRE(got == want[i]);
        }
        REQUIRE(out.size() == want.size());
        return indexed.load();
    };
    for (std::size_t window : {std::size_t{1000}, std::size_t{1} << 20}) {
        INFO("window " << window);
        REQUIRE(parse(truth, window) == 20u);  // all from the index
        REQUIRE(parse({truth.begin(), truth.begin() + 7}, window) == 7u);  // 7 kept, the rest read
        auto off = truth;
        off[5].start += 1;  // not where the file has record 5: read from there on
        REQUIRE(parse(off, window) == 5u);
    }
}

TEST_CASE("record_index: a file's boundaries are found again only for the same version of it", "[local][by_call][tfrecord]") {
    sluice_test::temp_dir d;
    const std::string path = d.write("v.tfrecord", std::string(1000, 'a'));
    auto key = [&] {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        auto k = sluice::detail::record_index::key_of(path, fd);
        ::close(fd);
        REQUIRE(k);
        return *k;
    };
    sluice::detail::record_index idx;
    const auto first = key();
    idx.keep(first, {{0, 984, 7}});
    REQUIRE(idx.find(first));
    REQUIRE(idx.find(key())->at(0).crc == 7u);  // unchanged: found
    const std::size_t one = idx.records_held();  // its entry and the file's bookkeeping
    REQUIRE(one > 1u);
    REQUIRE(idx.room(path) == sluice::detail::record_index::max_records - one - (one - 1));
    {  // rewritten with the same size, its modification time set back: the status-change time tells
        d.write("v.tfrecord", std::string(1000, 'c'));
        const timespec back[2] = {{0, UTIME_OMIT}, {first.mtime_ns / 1'000'000'000, first.mtime_ns % 1'000'000'000}};
        REQUIRE(::utimensat(AT_FDCWD, path.c_str(), back, 0) == 0);
        const auto k = key();
        REQUIRE(k.size == first.size);
        REQUIRE(k.mtime_ns == first.mtime_ns);
        REQUIRE_FALSE(idx.find(k));
    }
    {  // the same size, a later modification time: not found
        const timespec later[2] = {{0, UTIME_OMIT}, {first.mtime_ns / 1'000'000'000 + 5, 0}};
        REQUIRE(::utimensat(AT_FDCWD, path.c_str(), later, 0) == 0);
        REQUIRE_FALSE(idx.find(key()));
    }
    d.write("v.tfrecord", std::string(2000, 'b'));  // rewritten, another size
    REQUIRE_FALSE(idx.find(key()));
    // Kept again for the new version: the old one's entries no longer count.
    idx.keep(key(), {{0, 900, 1}, {916, 900, 2}});
    REQUIRE(idx.find(key())->size() == 2u);
    REQUIRE(idx.records_held() == one + 1);
    // Nothing past the bound is kept.
    const sluice::detail::record_index::file_key big{"big", 1, 2, 3, 4, 5};
    idx.keep(big, std::vector<sluice::detail::record_index::entry>(idx.room("big") + 1));
    REQUIRE_FALSE(idx.find(big));
    REQUIRE(idx.records_held() == one + 1);
    idx.keep(big, std::vector<sluice::detail::record_index::entry>(idx.room("big")));  // just fits
    REQUIRE(idx.find(big));
    REQUIRE(idx.room("other") == 0u);
}

TEST_CASE("a shard read by call that shrinks before batch reads its records is an error naming it and the offset",
          "[local][by_call]") {
    sluice_test::temp_dir d;
    std::string tar;
    for (int i = 0; i < 60; ++i) sluice::append_tar_file(tar, "r" + std::to_string(i) + ".bin", patterned_bytes(2, i, 40'000));
    sluice::end_tar(tar);
    const auto a = d.write("shrinks.tar", tar);
    // The shuffle holds every record (its buffer is larger than the shard), so all are
    // parsed before the first batch, and read by batch after the cut.
    sluice::pipeline p(sluice::from<sluice::shard>({{a, 0, 0}}) | sluice::read() | sluice::tar() |
                       sluice::shuffle({.buffer = 100, .seed = 1}) | sluice::batch({.size = 4}));
    auto first = p.next_blocking();
    REQUIRE(first);
    REQUIRE(read_stage_counter(p, "files_by_call") == 1u);
    const std::size_t cut = tar.size() / 2;
    REQUIRE(::truncate(a.c_str(), static_cast<off_t>(cut)) == 0);
    try {
        while (auto b = p.next_blocking()) {
            // Records that lie before the cut are whole; none holds the zeros of a lost one.
            for (std::size_t i = 0; i + 1 < b->offsets.size(); ++i)
                REQUIRE(b->data.view().substr(b->offsets[i], b->offsets[i + 1] - b->offsets[i]).find(std::string(512, '\0')) ==
                        std::string_view::npos);
        }
        FAIL("the pipeline ended without an error after the file shrank");
    } catch (const sluice::source_error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find("the file shrank while it was read") != std::string::npos);
        REQUIRE(e.url() == a);
        REQUIRE(e.offset() >= cut);
        REQUIRE(e.offset() < tar.size());
    }
}

namespace {
/// Lowers the process's soft RLIMIT_NOFILE for a scope, so that file_mapping keeps
/// descriptors for a quarter of it only (then opens files again by their paths).
struct scoped_nofile {
    rlimit was{};
    explicit scoped_nofile(rlim_t soft) {
        REQUIRE(::getrlimit(RLIMIT_NOFILE, &was) == 0);
        rlimit now = was;
        now.rlim_cur = std::min(soft, was.rlim_max);
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &now) == 0);
    }
    ~scoped_nofile() { ::setrlimit(RLIMIT_NOFILE, &was); }
};
/// `n` small files of 1-30 KB in `d`, each a different pattern.
std::vector<std::string> small_files(const sluice_test::temp_dir& d, int n) {
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) {
        names.push_back("small-" + std::to_string(i) + ".bin");
        d.write(names.back(), patterned_bytes(7, i, 1'000 + 997 * i));
    }
    return names;
}
}  // namespace

TEST_CASE("small files whose records reach batch untouched are read by call, by their paths past the descriptors "
          "the process can spare, and a later chdir does not move them", "[local][by_call]") {
    sluice_test::temp_dir d;
    const auto names = small_files(d, 60);
    std::multiset<std::string> want;
    for (auto& n : names) want.insert(sluice_test::slurp_file(d / n));
    std::vector<sluice::shard> shards;
    for (auto& n : names) shards.push_back({n, 0, shards.size()});  // relative to d
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(d.path());
    std::multiset<std::string> got;
    std::uint64_t by_call = 0, by_path = 0;
    try {
        scoped_nofile limit(64);  // descriptors kept for 16 files at most
        // batch collates one batch ahead of the consumer at most (.out = {1, 0}).
        sluice::pipeline p(sluice::from(shards) | sluice::read() | sluice::raw() | sluice::shuffle({.buffer = 100, .seed = 2}) |
                           sluice::batch({.size = 8, .out = {1, 0}}));
        // The shuffle holds every record before the first batch: every file is mapped,
        // and most records go to batch after the directory is no longer the current one.
        auto first = p.next_blocking();
        REQUIRE(first);
        std::filesystem::current_path("/");
        for (auto b = std::move(first); b; b = p.next_blocking())
            for (std::size_t i = 0; i + 1 < b->offsets.size(); ++i)
                got.insert(std::string(b->data.view().substr(b->offsets[i], b->offsets[i + 1] - b->offsets[i])));
        by_call = read_stage_counter(p, "files_by_call");
        by_path = read_stage_counter(p, "files_by_path");
    } catch (...) {
        std::filesystem::current_path(cwd);
        throw;
    }
    std::filesystem::current_path(cwd);
    REQUIRE(got == want);
    REQUIRE(by_call == names.size());
    REQUIRE(by_path >= names.size() - 16);
    REQUIRE(by_path < names.size());
    // With descriptors to spare, every file is kept open (none by its path).
    rlimit r{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
    if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur / 4 > 2 * names.size()) {
        std::vector<sluice::shard> full;
        for (auto& n : names) full.push_back({d / n, 0, full.size()});
        sluice::pipeline p(sluice::from(full) | sluice::read() | sluice::raw() | sluice::shuffle({.buffer = 100, .seed = 2}) |
                           sluice::batch({.size = 8}));
        REQUIRE(batched_records(p) == want);
        REQUIRE(read_stage_counter(p, "files_by_call") == names.size());
        REQUIRE(read_stage_counter(p, "files_by_path") == 0u);
    }
}

TEST_CASE("a small file read by its path reads as read opened it when it is replaced, touched or removed before "
          "batch reads it, and one that shrinks is an error naming it", "[local][by_call]") {
    enum class what { replaced, touched, removed, truncated };
    for (auto how : {what::replaced, what::touched, what::removed, what::truncated}) {
        INFO("case " << int(how));
        sluice_test::temp_dir d;
        const auto names = small_files(d, 60);
        std::multiset<std::string> want;
        std::vector<sluice::shard> shards;
        for (auto& n : names) {
            shards.push_back({d / n, 0, shards.size()});
            want.insert(sluice_test::slurp_file(d / n));
        }
        scoped_nofile limit(64);
        sluice::pipeline p(sluice::from(shards) | sluice::read() | sluice::raw() | sluice::shuffle({.buffer = 100, .seed = 3}) |
                           sluice::batch({.size = 4, .out = {1, 0}}));
        auto first = p.next_blocking();
        REQUIRE(first);
        REQUIRE(read_stage_counter(p, "files_by_path") >= 44u);
        // The last 40 files were mapped past the 16 descriptors: each is read by its path.
        std::set<std::string> changed;
        for (std::size_t i = 20; i < names.size(); ++i) {
            const auto f = d / names[i];
            changed.insert(f);
            if (how == what::replaced) {  // another file at the path, with other bytes
                d.write(names[i] + ".new", patterned_bytes(8, int(i), 5'000));
                REQUIRE(::rename((f + ".new").c_str(), f.c_str()) == 0);
            } else if (how == what::touched) {  // the same bytes, a new modification time
                const timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000, 0}};
                REQUIRE(::utimensat(AT_FDCWD, f.c_str(), times, 0) == 0);
            } else if (how == what::removed) {
                REQUIRE(::unlink(f.c_str()) == 0);
            } else {
                REQUIRE(::truncate(f.c_str(), 100) == 0);
            }
        }
        std::multiset<std::string> got;
        auto take = [&](const sluice::host_batch& b) {
            for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i)
                got.insert(std::string(b.data.view().substr(b.offsets[i], b.offsets[i + 1] - b.offsets[i])));
        };
        take(*first);
        if (how != what::truncated) {
            while (auto b = p.next_blocking()) take(*b);
            REQUIRE(got == want);  // the bytes read opened, not the new file's, nor zeros
            continue;
        }
        try {
            while (auto b = p.next_blocking()) take(*b);
            FAIL("the pipeline ended without an error after its files shrank");
        } catch (const sluice::source_error& e) {
            INFO(e.what());
            REQUIRE(std::string(e.what()).find("the file shrank while it was read") != std::string::npos);
            REQUIRE(changed.count(e.url()) == 1);
            REQUIRE(e.offset() == 100u);
        }
    }
}

TEST_CASE("a SIGBUS that is not about sluice's mappings still ends the process", "[local]") {
    sluice_test::temp_dir d;
    read_all({d.write("a", "x")}, {.map_min_bytes = 0});  // maps it: installs the handler
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // a mapping of its own, not sluice's, touched past the file's end
        const auto f = d.write("other", std::string(8192, 'o'));
        const int fd = ::open(f.c_str(), O_RDONLY);
        auto* m = static_cast<volatile const char*>(::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0));
        if (m == MAP_FAILED || ::truncate(f.c_str(), 0) != 0) std::_Exit(2);
        const char c = m[4096];
        std::_Exit(c == 'o' ? 3 : 4);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    INFO("child status " << status << (WIFSIGNALED(status) ? " (signal " : " (exit ")
                         << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)) << ")");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    // A sanitizer handles deadly signals itself (ASan's SIGBUS handler was there before
    // sluice's; TSan reports the re-raised default as "BUS on unknown address"): it ends
    // the child with SIGABRT or its exit code. What matters: the child did not read on.
    REQUIRE((WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 2 &&
                                     WEXITSTATUS(status) != 3 && WEXITSTATUS(status) != 4)));
#else
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGBUS);
#endif
}

TEST_CASE("a URL given to read() says to use fetch(), naming it", "[local]") {
    for (std::string url : {"http://host/shard-000.tar", "https://host/x.tar", "s3://bucket/key.tar", "HTTP://h/y"}) {
        INFO(url);
        sluice::pipeline p(sluice::from<sluice::shard>({{url, 0, 0}}) | sluice::read());
        REQUIRE_THROWS_WITH(p.next_blocking(), "sluice: use sluice::fetch(), not sluice::read() (which reads local files), for '" +
                                                   url + "': Protocol not supported");
    }
    sluice::pipeline q(sluice::from<sluice::shard>({{"gs://b/k", 0, 0}}) | sluice::read());
    REQUIRE_THROWS_WITH(q.next_blocking(), Catch::Contains("sluice::read() reads local files, not 'gs://b/k'"));
    // file:// is a local path.
    sluice_test::temp_dir d;
    const auto a = d.write("a", "hello");
    auto chunks = read_all({"file://" + a}, {});
    REQUIRE(chunks.size() == 1);
    REQUIRE(chunks[0].data.view() == "hello");
}
