#include <sluice/formats/decode.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/formats/lines.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/ops/from.hpp>

using sluice_test::cut;

namespace {
struct inflated {
    std::string data;
    std::vector<sluice::chunk> chunks;
    std::uint64_t skipped = 0;
    std::string error;
    std::error_code code;
};
inflated gunzip(std::vector<sluice::chunk> in, sluice::on_corrupt oc = sluice::on_corrupt::error,
                sluice::compression mode = sluice::compression::detect, std::size_t out_chunk = 1000) {
    inflated r;
    std::atomic<std::uint64_t> skipped{0};
    auto pol = std::make_shared<sluice::detail::parse_policy>();
    pol->corrupt = oc;
    pol->skipped = &skipped;
    sluice::detail::gunzip_decoder z(pol, mode, out_chunk);
    try {
        for (auto& c : in) z(std::move(c), r.chunks);
    } catch (const sluice::source_error& e) {
        r.error = e.what();
        r.code = e.code();
    }
    for (auto& c : r.chunks) r.data += sluice_test::bytes_str(c.data);
    r.skipped = skipped.load();
    return r;
}
std::string text(sluice::detail::rng& r, std::size_t n) {
    std::string s(n, ' ');
    for (auto& c : s) c = static_cast<char>('a' + r.below(r.below(2) ? 3 : 26));  // compressible
    return s;
}
}  // namespace

TEST_CASE("gunzip: multi-member files inflate as one stream at every chunk size", "[gzip][streaming]") {
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    std::string plain, gz;
    for (int m = 0; m < 3; ++m) {
        auto part = text(r, 1 + r.below(3 << 20));
        plain += part;
        gz += sluice_test::gzip(part, 1 + m * 4);
    }
    gz += std::string(10, '\0');  // padding after the last member is ignored
    for (int t = 0; t < 6; ++t) {
        auto z = gunzip(cut(gz, sluice_test::random_sizes(r, 4u << 20), "m.gz"), sluice::on_corrupt::error,
                        sluice::compression::detect, 64 << 10);
        REQUIRE(z.error.empty());
        REQUIRE(z.data == plain);
        std::uint64_t off = 0;
        for (auto& c : z.chunks) {
            REQUIRE(c.inflated);
            REQUIRE(c.offset == off);
            off += c.data.size();
        }
        REQUIRE(z.chunks.back().last);
        REQUIRE(std::count_if(z.chunks.begin(), z.chunks.end(), [](auto& c) { return c.last; }) == 1);
    }
    const auto small = sluice_test::gzip("tiny") + sluice_test::gzip(" file");
    REQUIRE(gunzip(cut(small, {1}, "s")).data == "tiny file");  // magic cut across chunks
}

TEST_CASE("gunzip: detection by name and magic, other shards pass through untouched", "[gzip]") {
    const std::string plain = "not compressed at all";
    auto pass = gunzip(cut(plain, {1}, "a.txt"));
    REQUIRE(pass.data == plain);
    REQUIRE_FALSE(pass.chunks.front().inflated);
    REQUIRE(gunzip(cut(sluice_test::gzip(plain), {4}, "no-suffix")).data == plain);
    REQUIRE(gunzip(cut(sluice_test::gzip(plain), {4}, "x.gz"), sluice::on_corrupt::error, sluice::compression::none).data ==
            sluice_test::gzip(plain));
    REQUIRE(gunzip(cut("", {1}, "empty")).data.empty());
    // Named .gz but not gzip: an error, not a pass-through.
    auto wrong = gunzip(cut(plain, {5}, "x.gz"));
    REQUIRE(wrong.error == "sluice: broken gzip stream (incorrect header check) in the member starting at byte 0 of 'x.gz' at byte 2");
    // Forced on a shard without the magic.
    REQUIRE_FALSE(gunzip(cut(plain, {5}, "y"), sluice::on_corrupt::error, sluice::compression::gzip).error.empty());
}

TEST_CASE("gunzip: broken and truncated streams name the shard and offset, skip resumes at the next member", "[gzip][corrupt]") {
    sluice::detail::rng r(11);
    const auto a = text(r, 50001), b = text(r, 50003), c = text(r, 50005);  // not multiples of the out chunk
    const auto ga = sluice_test::gzip(a), gb = sluice_test::gzip(b), gc = sluice_test::gzip(c);
    std::string gz = ga + gb + gc;
    const std::size_t hit = ga.size() + gb.size() / 2;
    gz[hit] ^= 0x55;
    auto e = gunzip(cut(gz, {4096}, "broken.gz"));
    REQUIRE(e.error.starts_with("sluice: broken gzip stream ("));
    REQUIRE(e.error.find("in the member starting at byte " + std::to_string(ga.size()) + " of 'broken.gz' at byte ") != std::string::npos);
    REQUIRE(e.data.starts_with(a));  // the first member came through, before the error
    REQUIRE(e.code == std::error_code(Z_DATA_ERROR, sluice::zlib_category()));  // a caller can branch on it
    REQUIRE(std::string(e.code.category().name()) == "zlib");
    auto s = gunzip(cut(gz, {4096}, "broken.gz"), sluice::on_corrupt::skip);
    REQUIRE(s.error.empty());
    REQUIRE(s.skipped == 1);
    REQUIRE(s.data.starts_with(a));
    REQUIRE(s.data.ends_with(c));  // nothing after the broken member is lost

    const std::string whole = ga + gb;
    auto t = gunzip(cut(whole.substr(0, whole.size() - 10), {1000}, "cut.gz"));
    REQUIRE(t.error == "sluice: truncated gzip stream (the shard ends inside the member starting at byte " +
                           std::to_string(ga.size()) + ") in 'cut.gz' at byte " + std::to_string(whole.size() - 10));
    REQUIRE(t.code == std::error_code(Z_BUF_ERROR, sluice::zlib_category()));
    auto ts = gunzip(cut(whole.substr(0, whole.size() - 10), {1000}, "cut.gz"), sluice::on_corrupt::skip);
    REQUIRE(ts.skipped == 1);
    REQUIRE(ts.data.starts_with(a));
    REQUIRE(ts.chunks.back().last);
}

TEST_CASE("lines inflate gzip'd shards, raw gives bytes as stored", "[gzip][lines]") {
    const std::string body = "one\ntwo\nthree\n";
    std::vector<std::string> got;
    for (auto& rec : sluice::pipeline(sluice::from(cut(sluice_test::gzip(body), {3}, "t.jsonl.gz")) | sluice::lines()))
        got.push_back(sluice_test::bytes_str(rec.data));
    REQUIRE(got == std::vector<std::string>{"one", "two", "three"});
    got.clear();
    for (auto& rec : sluice::pipeline(sluice::from(cut(sluice_test::gzip(body), {3}, "t.gz")) | sluice::raw()))
        got.push_back(sluice_test::bytes_str(rec.data));
    REQUIRE(got == std::vector<std::string>{sluice_test::gzip(body)});
    got.clear();
    for (auto& rec : sluice::pipeline(sluice::from(cut(sluice_test::gzip(body), {3}, "t.gz")) | sluice::gunzip() | sluice::raw()))
        got.push_back(sluice_test::bytes_str(rec.data));
    REQUIRE(got == std::vector<std::string>{body});
}

TEST_CASE("gunzip: a chunk that inflates a thousandfold is given out one output chunk at a time", "[gzip]") {
    const std::string zeros(64u << 20, '\0');
    const std::string gz = sluice_test::gzip(zeros, 9);
    REQUIRE(gz.size() < (100u << 10));
    auto pol = std::make_shared<sluice::detail::parse_policy>();
    sluice::detail::gunzip_decoder z(pol, sluice::compression::detect, 1u << 20);
    auto chunks = cut(gz, {gz.size()}, "zeros.gz");
    std::vector<sluice::chunk> out;
    z.start(std::move(chunks[0]), out);
    REQUIRE(out.empty());
    std::size_t total = 0, steps = 0;
    bool more = true;
    while (more) {
        more = z.step(out);
        ++steps;
        REQUIRE(out.size() <= 1);  // never more than one output chunk held
        for (auto& c : out) total += c.data.size();
        out.clear();
    }
    REQUIRE(total == zeros.size());
    REQUIRE(steps >= 64);
}

TEST_CASE("gunzip: a member inflating past max_record_bytes is an error naming shard and member, and skip reads on", "[gzip][corrupt][limit]") {
    const std::string a(1000, 'a'), bomb(1u << 20, '\0'), c = "after";
    const auto ga = sluice_test::gzip(a), gb = sluice_test::gzip(bomb, 9), gc = sluice_test::gzip(c);
    const std::string gz = ga + gb + gc;
    auto run = [&](sluice::on_corrupt oc) {
        std::atomic<std::uint64_t> skipped{0};
        auto pol = std::make_shared<sluice::detail::parse_policy>();
        pol->corrupt = oc;
        pol->skipped = &skipped;
        pol->max_member_bytes = 64 << 10;
        sluice::detail::gunzip_decoder z(pol, sluice::compression::detect, 4096);
        inflated r;
        try {
            for (auto& ch : cut(gz, {700}, "bomb.gz")) z(std::move(ch), r.chunks);
        } catch (const sluice::source_error& e) {
            r.error = e.what();
        }
        for (auto& ch : r.chunks) r.data += sluice_test::bytes_str(ch.data);
        r.skipped = skipped.load();
        return r;
    };
    auto e = run(sluice::on_corrupt::error);
    REQUIRE(e.error == "sluice: gzip member inflating to more than 65536 bytes (raise it with gunzip's max_record_bytes) "
                       "in 'bomb.gz' at byte " + std::to_string(ga.size()));
    REQUIRE(e.data.starts_with(a));
    REQUIRE(e.data.size() <= a.size() + (64 << 10));  // never more than the limit of the member
    auto s = run(sluice::on_corrupt::skip);
    REQUIRE(s.error.empty());
    REQUIRE(s.skipped >= 1);
    REQUIRE(s.data.starts_with(a));
    REQUIRE(s.data.ends_with(c));
    REQUIRE(s.data.size() <= a.size() + (64 << 10) + c.size());
    // In a pipeline: gunzip({.max_record_bytes}) then lines, which see the gap.
    std::vector<std::string> got;
    for (auto& r : sluice::pipeline(sluice::from(cut(sluice_test::gzip("one\ntwo\n") + gb + sluice_test::gzip("three\n"), {500}, "l.gz")) |
                                    sluice::gunzip({.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000}) |
                                    sluice::lines({.gzip = sluice::compression::none})))
        got.push_back(sluice_test::bytes_str(r.data));
    REQUIRE(got.front() == "one");
    REQUIRE(got.back() == "three");
}

TEST_CASE("every format takes decode_options, and unset gzip and out are the format's defaults", "[gzip][lines][raw]") {
    // The same call form for every format.
    [[maybe_unused]] auto l = sluice::lines({.on_corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1 << 20,
                                             .out = sluice::channel_limits{16, 1 << 20}});
    [[maybe_unused]] auto r = sluice::raw({.gzip = sluice::compression::detect, .out = {4, 1 << 20}});
    const std::string body = "x\ny\n";
    std::size_t n = 0;
    for (auto& rec : sluice::pipeline(sluice::from(cut(sluice_test::gzip(body), {3}, "t.gz")) |
                                      sluice::lines({.max_record_bytes = 10})))
        n += rec.data.size();
    REQUIRE(n == 2);
}
