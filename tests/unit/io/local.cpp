#include <sluice/io/local.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>

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
    sluice::pipeline p(sluice::from<sluice::shard>({{a, 0, 0}}) | sluice::read({.chunk_size = 32 * 1024, .out = {1, 0}}));
    std::size_t n = 0;
    while (auto c = p.next_blocking()) {
        distinct.insert(c->data.data());
        ++n;
    }
    REQUIRE(n == 64);
    REQUIRE(distinct.size() < 8);
}

TEST_CASE("mapped files give the same chunks as reads, as slices of one mapping", "[local]") {
    sluice_test::temp_dir d;
    std::string content(10'000, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = char(i * 7 + 1);
    const auto a = d.write("a.bin", content), empty = d.write("empty.bin", "");
    auto read = read_all({a, empty}, {.chunk_size = 4096});
    auto mapped = read_all({a, empty}, {.chunk_size = 4096, .map = true});
    REQUIRE(mapped.size() == read.size());
    for (std::size_t i = 0; i < read.size(); ++i) {
        REQUIRE(mapped[i].offset == read[i].offset);
        REQUIRE(mapped[i].last == read[i].last);
        REQUIRE(mapped[i].data.view() == read[i].data.view());
    }
    REQUIRE(mapped[0].data.owner_capacity() == content.size());  // the whole file, mapped once
    REQUIRE(mapped[1].data.data() == mapped[0].data.data() + 4096);
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
