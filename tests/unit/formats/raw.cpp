#include <sluice/formats/raw.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/io/local.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/shuffle.hpp>

#include <pthread.h>

TEST_CASE("one record per file: whole in one chunk without a copy, assembled otherwise", "[raw]") {
    sluice_test::temp_dir d;
    const std::string big(10'000, 'b');
    const auto small = d.write("small", "tiny"), large = d.write("large", big), empty = d.write("empty", "");
    std::vector<sluice::shard> shards{{small, 0, 0}, {large, 0, 1}, {empty, 0, 2}};
    // Read (small files are, by default) and mapped (.map_min_bytes = 0).
    for (std::uint64_t map_min : {std::uint64_t{1} << 20, std::uint64_t{0}}) {
        INFO("map_min_bytes " << map_min);
        std::vector<sluice::record> got;
        for (auto& r : sluice::pipeline(sluice::from(shards) | sluice::read({.chunk_size = 4096, .map_min_bytes = map_min}) |
                                        sluice::raw({})))
            got.push_back(r);
        REQUIRE(got.size() == 3);
        REQUIRE(got[0].data.view() == "tiny");
        REQUIRE((got[0].data.file() != nullptr) == (map_min == 0));
        // The chunk itself (no copy), and the chunk is sized to the file: a 4-byte file does
        // not pin a 4096-byte buffer (read: the pool's smallest size class).
        if (map_min == 0) REQUIRE(got[0].data.owner_capacity() == 4);
        else REQUIRE(got[0].data.owner_capacity() < 4096);
        REQUIRE(got[0].data.owner_use_count() == 1);
        REQUIRE(got[1].data.view() == big);
        REQUIRE(got[1].source->url == large);
        REQUIRE(got[2].data.empty());
    }
}

TEST_CASE("an object as fetch sends it (its bytes, then an empty last chunk) is passed on without a copy", "[raw]") {
    auto src = std::make_shared<const sluice::shard>(sluice::shard{"http://host/obj.bin", 0, 0});
    const auto body = sluice::bytes::copy_of(std::string(150'000, 'f'));
    std::vector<sluice::chunk> chunks{{src, 0, body, false, false}, {src, body.size(), {}, true, false}};
    std::vector<sluice::record> got;
    for (auto& r : sluice::pipeline(sluice::from(chunks) | sluice::raw({.gzip = sluice::compression::none}))) got.push_back(r);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].data.data() == body.data());  // the chunk itself
    REQUIRE(got[0].data.size() == 150'000);
}

TEST_CASE("a mapped file of several windows is one record viewing the mapping, not a copy", "[raw]") {
    sluice_test::temp_dir d;
    std::string content(10'000, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = char(i * 11 + 3);
    const auto f = d.write("f.bin", content);
    std::vector<sluice::record> got;
    for (auto& r : sluice::pipeline(sluice::from<sluice::shard>({{f, 0, 0}}) | sluice::read({.chunk_size = 4096, .map_min_bytes = 0}) | sluice::raw({})))
        got.push_back(r);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].data.view() == content);
    REQUIRE(got[0].data.file() != nullptr);
    REQUIRE(got[0].data.data() == got[0].data.file()->data());
    // Read instead of mapped, the windows are assembled (one copy), with the same bytes.
    got.clear();
    for (auto& r : sluice::pipeline(sluice::from<sluice::shard>({{f, 0, 0}}) | sluice::read({.chunk_size = 4096, .map = false}) |
                                    sluice::raw({})))
        got.push_back(r);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].data.view() == content);
    REQUIRE(got[0].data.file() == nullptr);
}

namespace {
struct objects {
    std::vector<std::string> data;
    std::string error;
    std::uint64_t corrupt = 0, held_peak = 0, held_now = 0;
};
objects read_raw(sluice::stage<sluice::shard, sluice::record> s, const std::vector<sluice::shard>& shards) {
    objects r;
    sluice::pipeline p(sluice::from(shards) | std::move(s));
    try {
        while (auto rec = p.next_blocking()) r.data.emplace_back(rec->data.view());
    } catch (const sluice::source_error& e) {
        r.error = e.what();
    }
    for (auto& st : p.figures().stages)
        if (st.name == "raw")
            for (auto& [n, v] : st.counters) {
                if (n == "corrupt") r.corrupt = v;
                if (n == "held_bytes_peak") r.held_peak = v;
                if (n == "held_bytes") r.held_now = v;
            }
    return r;
}
}  // namespace

TEST_CASE("raw: an object over max_record_bytes is an error naming the file and the limit", "[raw][corrupt][limit]") {
    sluice_test::temp_dir d;
    const auto a = d.write("a", "first"), big = d.write("big", std::string(10'000, 'b')), c = d.write("c", "third");
    std::vector<sluice::shard> shards{{a, 0, 0}, {big, 0, 1}, {c, 0, 2}};
    for (std::size_t chunk : {1000, 4096, 1 << 20}) {
        INFO("chunk size " << chunk);
        auto e = read_raw(sluice::read({.chunk_size = chunk}) | sluice::raw({.max_record_bytes = 5000}), shards);
        REQUIRE(e.data == std::vector<std::string>{"first"});
        const std::string size = chunk < 10'000 ? "at least " + std::to_string(chunk * (5000 / chunk + 1)) : "10000";
        REQUIRE(e.error == "sluice: object of " + size +
                               " bytes over the limit of 5000 bytes (raise it with max_record_bytes) in '" + big +
                               "' at byte 0");
        REQUIRE(e.held_peak <= 5000);
    }
}

TEST_CASE("raw: under skip an object over max_record_bytes is counted and the next objects arrive", "[raw][corrupt][limit]") {
    sluice_test::temp_dir d;
    const std::string mid(4000, 'm');
    const auto a = d.write("a", "first"), big = d.write("big", std::string(10'000, 'b')), c = d.write("c", mid);
    std::vector<sluice::shard> shards{{a, 0, 0}, {big, 0, 1}, {c, 0, 2}};
    for (std::size_t chunk : {1000, 1 << 20}) {
        auto s = read_raw(sluice::read({.chunk_size = chunk}) |
                              sluice::raw({.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 5000}),
                          shards);
        REQUIRE(s.error.empty());
        REQUIRE(s.data == std::vector<std::string>{"first", mid});
        REQUIRE(s.corrupt == 1);
        REQUIRE(s.held_now == 0);
        REQUIRE(s.held_peak == (chunk == 1000 ? 5000u : 0u));  // 5 chunks of big before the limit; mid: 4000
    }
}

TEST_CASE("raw: options as the other formats take them, and gzip only when asked", "[raw][gzip]") {
    sluice_test::temp_dir d;
    const std::string body = "hello, raw\n";
    const auto gz = d.write("h.gz", sluice_test::gzip(body));
    std::vector<sluice::shard> shards{{gz, 0, 0}};
    REQUIRE(read_raw(sluice::read() | sluice::raw(), shards).data == std::vector<std::string>{sluice_test::gzip(body)});
    REQUIRE(read_raw(sluice::read() | sluice::raw({.gzip = sluice::compression::detect}), shards).data ==
            std::vector<std::string>{body});
    // An object inflating past the limit: offsets of the uncompressed stream.
    const auto big = d.write("big.gz", sluice_test::gzip(std::string(100'000, 'z')));
    auto e = read_raw(sluice::read({.chunk_size = 1000}) |
                          sluice::raw({.gzip = sluice::compression::detect, .max_record_bytes = 50'000}),
                      {{big, 0, 0}});
    REQUIRE(e.error.starts_with("sluice: object of "));
    REQUIRE(e.error.ends_with("over the limit of 50000 bytes (raise it with max_record_bytes) in '" + big +
                              "' at byte 0 of the uncompressed stream"));
}

TEST_CASE("raw runs on the I/O loop where its chunks arrive there and its records go straight to a batch", "[raw]") {
    // Where raw's worker runs, seen from the thread that calls its on_skip: an object over
    // max_record_bytes is skipped on the worker's thread.
    auto object = [](const std::string& name, std::string body) {
        auto src = std::make_shared<const sluice::shard>(sluice::shard{"http://host/" + name, 0, 0});
        const auto b = sluice::bytes::copy_of(body);
        return std::vector<sluice::chunk>{{src, 0, b, false, false}, {src, b.size(), {}, true, false}};  // as fetch sends it
    };
    auto over = object("over", std::string(200, 'o')), fits = object("fits", std::string(50, 'f'));
    std::vector<sluice::chunk> chunks = over;
    chunks.insert(chunks.end(), fits.begin(), fits.end());
    using names = std::vector<std::string>;
    auto noting_raw = [](std::shared_ptr<names> seen) {
        return sluice::raw({.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 100, .on_skip = [seen](const sluice::source_error&) {
                                char name[16] = {};
                                ::pthread_getname_np(::pthread_self(), name, sizeof name);
                                seen->push_back(name);  // one worker: one call at a time
                            }});
    };
    auto records_of = [](auto&& pipe) {
        std::size_t n = 0;
        for (auto& b : sluice::pipeline(std::move(pipe))) n += b.size();
        return n;
    };
    SECTION("from a stage on the loop, straight to a batch or through a shuffle to one: the loop") {
        auto seen = std::make_shared<names>();
        REQUIRE(records_of(sluice::from(chunks) | noting_raw(seen) | sluice::batch({.size = 2})) == 1);
        REQUIRE(*seen == names{"sluice-io"});
        seen->clear();
        REQUIRE(records_of(sluice::from(chunks) | noting_raw(seen) | sluice::shuffle({.buffer = 4, .seed = 1}) |
                           sluice::batch({.size = 2})) == 1);
        REQUIRE(*seen == names{"sluice-io"});
    }
    SECTION("before a map, after a gunzip stage (on the pool), or at the pipeline's end: the pool") {
        auto seen = std::make_shared<names>();
        REQUIRE(records_of(sluice::from(chunks) | noting_raw(seen) | sluice::map([](sluice::record r) { return r; }) |
                           sluice::batch({.size = 2})) == 1);
        REQUIRE(*seen == names{"sluice-cpu"});
        seen->clear();
        REQUIRE(records_of(sluice::from(chunks) | sluice::gunzip() | noting_raw(seen) | sluice::batch({.size = 2})) == 1);
        REQUIRE(*seen == names{"sluice-cpu"});
        seen->clear();
        std::size_t n = 0;
        for (auto& r : sluice::pipeline(sluice::from(chunks) | noting_raw(seen))) n += r.data.size();
        REQUIRE(n == 50);
        REQUIRE(*seen == names{"sluice-cpu"});
    }
    SECTION("an object assembled from several chunks moves the stage to the pool for the rest of the run") {
        auto src = std::make_shared<const sluice::shard>(sluice::shard{"http://host/two-chunks", 0, 0});
        const auto a = sluice::bytes::copy_of(std::string(60, 'a')), b = sluice::bytes::copy_of(std::string(30, 'b'));
        std::vector<sluice::chunk> in = over;  // skipped on the loop
        in.push_back({src, 0, a, false, false});
        in.push_back({src, 60, b, true, false});  // copied into the object: from here on, the pool
        in.insert(in.end(), over.begin(), over.end());  // skipped on the pool
        auto seen = std::make_shared<names>();
        std::vector<std::string> got;
        for (auto& batch : sluice::pipeline(sluice::from(in) | noting_raw(seen) | sluice::batch({.size = 4})))
            for (std::size_t i = 0; i < batch.size(); ++i)
                got.emplace_back(reinterpret_cast<const char*>(batch[i].data()), batch[i].size());
        REQUIRE(got == std::vector<std::string>{std::string(60, 'a') + std::string(30, 'b')});
        REQUIRE(*seen == names{"sluice-io", "sluice-cpu"});
    }
}
