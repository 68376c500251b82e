#include <sluice/ops/counts.hpp>

#include "support/decode_support.hpp"
#include "support/servers.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/core/detail/random.hpp>
#include <sluice/formats/lines.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/formats/recordio.hpp>
#include <sluice/formats/tar.hpp>
#include <sluice/formats/tfrecord.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/io/http.hpp>
#include <sluice/io/list.hpp>
#include <sluice/io/local.hpp>
#include <sluice/ops/plan.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <set>
#include <thread>

// Record counts plan makes itself when ranks need them (ops/counts.hpp): the counts match
// what the decoders yield, the counts file is shared and reused, and bad shards are named.

namespace {
using sluice_test::counter;

std::string note_of(const sluice::pipeline_figures& f, const std::string& stage, const std::string& name) {
    for (auto& s : f.stages)
        if (s.name == stage)
            for (auto& [n, v] : s.notes)
                if (n == name) return v;
    return {};
}

// A tar shard of `n` files: long names, a pax path, a directory, a file without an
// extension (WebDataset ignores it) and samples of two fields each.
std::string tar_shard(sluice::detail::rng& r, int n, std::size_t size) {
    std::string out;
    const std::string global = "22 comment=a global\n";  // a pax global header: read and ignored
    sluice::detail::tar_header(out, "GlobalHead", global.size(), 'g');
    out += global;
    sluice::detail::tar_pad(out);
    sluice::detail::tar_header(out, "dir/", 0, '5');
    const std::string target = std::string(110, 't') + '\0';  // a GNU long link target, then the link
    sluice::detail::tar_header(out, "././@LongLink", target.size(), 'K');
    out += target;
    sluice::detail::tar_pad(out);
    sluice::detail::tar_header(out, "link.jpg", 0, '2');
    for (int i = 0; i < n; ++i) {
        const std::string key = i % 5 == 0 ? std::string(120, 'k') + std::to_string(i) : "s" + std::to_string(i);
        if (i % 7 == 3) {  // a pax header naming the next member
            const std::string rec = "path=pax/" + key + ".cls";
            std::string kv = " " + rec + "\n";
            std::size_t n = kv.size() + 1;  // LEN counts its own digits
            while (std::to_string(n).size() + kv.size() != n) ++n;
            kv = std::to_string(n) + kv;
            sluice::detail::tar_header(out, "PaxHeader", kv.size(), 'x');
            out += kv;
            sluice::detail::tar_pad(out);
            sluice::append_tar_file(out, "ignored-name", "7");
            sluice::append_tar_file(out, "pax/" + key + ".jpg", sluice_test::random_bytes(r, size));
        } else {
            sluice::append_tar_file(out, key + ".jpg", sluice_test::random_bytes(r, size));
            sluice::append_tar_file(out, key + ".cls", std::to_string(i));
        }
        if (i % 4 == 1) sluice::append_tar_file(out, "README", "no extension");
    }
    sluice::append_tar_file(out, "s1.txt", "the key s1 again, after others: a sample of its own");
    sluice::end_tar(out);
    return out;
}

struct formats_data {
    sluice_test::temp_dir dir;
    std::map<std::string, std::vector<std::string>> files;  // format -> shard paths
    formats_data() {
        sluice::detail::rng r(sluice_test::test_seed());
        for (int s = 0; s < 5; ++s) {
            const int n = 3 + s * 4;
            const std::string id = std::to_string(s);
            files["tar"].push_back(dir.write("tar/" + id + ".tar", tar_shard(r, n, 1000 + 300 * s)));
            std::string tf, rio, text;
            for (int i = 0; i < n; ++i) {
                sluice::append_tfrecord(tf, sluice_test::random_bytes(r, 10 + 50 * i));
                // Data holding the magic word at a 4-byte boundary is split into parts.
                std::string d = sluice_test::random_bytes(r, 16 + 4 * i);
                if (i % 3 == 0) d.replace(8, 4, std::string("\x0a\x23\xd7\xce", 4));
                sluice::append_recordio(rio, d);
                text += i % 4 == 2 ? "\r\n" : "line " + std::to_string(i) + (i % 5 == 1 ? "\n\n" : "\n");
            }
            if (s % 2) text += "last line without a newline";
            files["tfrecord"].push_back(dir.write("tfrecord/" + id + ".tfrecord", tf));
            files["recordio"].push_back(dir.write("recordio/" + id + ".rec", rio));
            files["lines"].push_back(dir.write("lines/" + id + ".txt", text));
            files["raw"].push_back(dir.write("raw/" + id + ".bin", sluice_test::random_bytes(r, 100 * s)));
        }
        files["webdataset"] = files["tar"];
    }
};

template <class T>
sluice::stage<sluice::chunk, T> decoder(const std::string& f);
template <>
sluice::stage<sluice::chunk, sluice::record> decoder(const std::string& f) {
    if (f == "tar") return sluice::tar();
    if (f == "tfrecord") return sluice::tfrecord();
    if (f == "recordio") return sluice::recordio();
    if (f == "lines") return sluice::lines();
    return sluice::raw();
}
template <>
sluice::stage<sluice::chunk, sluice::sample> decoder(const std::string&) {
    return sluice::webdataset();
}

// Each delivered record's "url#index", rank r of w, counts kept in `dir`.
template <class T>
std::vector<std::string> keys(const std::vector<std::string>& urls, const std::string& f, unsigned r, unsigned w,
                              const std::string& dir, sluice::pipeline_figures* fig = nullptr) {
    sluice::pipeline p(sluice::list(urls) | sluice::plan({.seed = 5, .rank = r, .world = w, .counts_dir = dir}) |
                       sluice::read() | decoder<T>(f));
    std::vector<std::string> out;
    for (auto& x : p) out.push_back(x.source->url + "#" + std::to_string(x.index));
    if (fig) *fig = p.figures();
    return out;
}
}  // namespace

TEST_CASE("plan counts records itself for equal shares, as each decoder numbers them, and keeps them", "[plan][counts]") {
    formats_data d;
    for (const auto& [format, urls] : d.files) {
        DYNAMIC_SECTION(format) {
            // What the decoder yields, read whole by one rank.
            sluice::record_counts want;
            if (format == "webdataset")
                want = sluice::count_records(sluice::list(urls) | sluice::plan({.rank = 0, .world = 1}) | sluice::read() |
                                             sluice::webdataset());
            else
                want = sluice::count_records(sluice::list(urls) | sluice::plan({.rank = 0, .world = 1}) | sluice::read() |
                                             decoder<sluice::record>(format));
            std::uint64_t total = 0;
            for (auto& [u, n] : want) total += n;
            REQUIRE(want.size() == urls.size());
            sluice_test::temp_dir counts;
            std::set<std::string> all;
            for (unsigned r = 0; r < 3; ++r) {
                sluice::pipeline_figures fig;
                auto got = format == "webdataset" ? keys<sluice::sample>(urls, format, r, 3, counts.path(), &fig)
                                                  : keys<sluice::record>(urls, format, r, 3, counts.path(), &fig);
                REQUIRE(got.size() == total / 3);  // equal steps
                all.insert(got.begin(), got.end());
                // The first rank counted every shard; the others found them in the file.
                REQUIRE(counter(fig, "plan", "shards_counted") == (r == 0 ? urls.size() : 0));
                REQUIRE(counter(fig, "plan", "counts_reused") == (r == 0 ? 0 : urls.size()));
                REQUIRE(note_of(fig, "plan", "counts") == counts / "record-counts");
            }
            REQUIRE(all.size() == total / 3 * 3);  // disjoint
            // The file holds the decoder's counts, keyed by format.
            auto kept = sluice::detail::load_counts_file(counts / "record-counts");
            REQUIRE(kept.size() == urls.size());
            for (auto& [key, n] : kept) {
                // "+gunzip": counted through a gunzip (the decoder's own, for the formats that may be gzip'd)
                const std::string keyed = key.substr(0, key.find(' '));
                REQUIRE((keyed == format || keyed == format + "+gunzip"));
                const std::string url = key.substr(key.rfind(' ') + 1);
                REQUIRE(want.at(url) == n);
            }
        }
    }
}

TEST_CASE("counting a tar reads its headers, not its members", "[plan][counts]") {
    sluice_test::temp_dir d;
    sluice::detail::rng r(sluice_test::test_seed());
    std::vector<std::string> urls;
    std::uint64_t bytes = 0;
    for (int s = 0; s < 2; ++s) {
        std::string t;
        for (int i = 0; i < 10 + s; ++i) sluice::append_tar_file(t, std::to_string(i) + ".bin", sluice_test::random_bytes(r, 1u << 20));
        sluice::end_tar(t);
        bytes += t.size();
        urls.push_back(d.write(std::to_string(s) + ".tar", t));
    }
    sluice_test::temp_dir counts;
    sluice::pipeline_figures fig;
    REQUIRE(keys<sluice::record>(urls, "tar", 1, 2, counts.path(), &fig).size() == 10);
    REQUIRE(counter(fig, "plan", "shards_counted") == 2);
    // One 64 KiB window per header read, against 1 MiB members.
    REQUIRE(counter(fig, "plan", "count_bytes") > 0);
    REQUIRE(counter(fig, "plan", "count_bytes") <= 23 * (64u << 10));
    REQUIRE(counter(fig, "plan", "count_bytes") < bytes / 10);
}

TEST_CASE("a rewritten shard is counted again, bad shards are named, and without a directory plan still counts", "[plan][counts][errors]") {
    formats_data d;
    auto urls = d.files["tfrecord"];
    sluice_test::temp_dir counts;
    sluice::pipeline_figures fig;
    const auto before = keys<sluice::record>(urls, "tfrecord", 0, 2, counts.path(), &fig).size();
    REQUIRE(counter(fig, "plan", "shards_counted") == 5);
    {  // shard 2 gains 10 records: its size and mtime change, so its count is made again
        std::string more;
        for (int i = 0; i < 10; ++i) sluice::append_tfrecord(more, "x");
        std::ofstream(urls[2], std::ios::binary | std::ios::app) << more;
    }
    REQUIRE(keys<sluice::record>(urls, "tfrecord", 0, 2, counts.path(), &fig).size() == before + 5);
    REQUIRE(counter(fig, "plan", "shards_counted") == 1);
    REQUIRE(counter(fig, "plan", "counts_reused") == 4);
    REQUIRE(sluice::detail::load_counts_file(counts / "record-counts").size() == 5);  // the old version is gone

    SECTION("a corrupt length: the shard and the byte offset") {
        std::string bad;
        sluice::append_tfrecord(bad, "good");
        sluice::append_tfrecord(bad, "flipped");
        bad[bad.size() - 4 - 7 - 4 - 3] ^= 1;  // the second record's length
        urls.push_back(d.dir.write("tfrecord/bad.tfrecord", bad));
        REQUIRE_THROWS_WITH(keys<sluice::record>(urls, "tfrecord", 0, 2, counts.path()),
                            Catch::Contains("cannot count records: bad TFRecord length checksum in '") &&
                                Catch::EndsWith("bad.tfrecord' at byte 20"));
    }
    SECTION("a truncated tar: the shard and the member's offset") {
        auto tars = d.files["tar"];
        std::string t;
        sluice::append_tar_file(t, "a.jpg", std::string(3000, 'a'));
        sluice::append_tar_file(t, "b.jpg", std::string(3000, 'b'));
        t.resize(t.size() - 1000);
        tars.push_back(d.dir.write("tar/cut.tar", t));
        REQUIRE_THROWS_WITH(keys<sluice::record>(tars, "tar", 1, 2, counts.path()),
                            Catch::Contains("truncated tar archive (the shard ends inside a member) in '") &&
                                Catch::EndsWith("cut.tar' at byte 3584"));
    }
    SECTION("a gzip'd shard is refused, saying what to pass instead") {
        auto lines = d.files["lines"];
        lines.push_back(d.dir.write("lines/z.txt.gz", std::string("\x1f\x8b\x08\x00", 4) + std::string(40, '\0')));
        REQUIRE_THROWS_WITH(keys<sluice::record>(lines, "lines", 0, 2, counts.path()),
                            Catch::Contains("gzip'd shard") && Catch::Contains("plan_options::counts") &&
                                Catch::Contains("z.txt.gz'"));
    }
    SECTION("a missing shard is named") {
        urls.push_back(d.dir / "tfrecord/gone.tfrecord");
        REQUIRE_THROWS_WITH(keys<sluice::record>(urls, "tfrecord", 0, 2, counts.path()),
                            Catch::Contains("cannot count records: cannot stat") && Catch::Contains("gone.tfrecord'"));
    }
    SECTION("a directory that cannot be made: counted in memory, and said so") {
        const std::string file = d.dir.write("a-file", "x");
        REQUIRE(keys<sluice::record>(urls, "tfrecord", 0, 2, file + "/sub", &fig).size() == before + 5);
        REQUIRE(counter(fig, "plan", "shards_counted") == 5);
        REQUIRE(note_of(fig, "plan", "counts").starts_with("not kept"));
    }
    SECTION("a gunzip of the user's between reader and decoder: counted through, gzip'd shards refused") {
        auto through = [&](const std::vector<std::string>& urls, unsigned rank) {
            sluice::pipeline p(sluice::list(urls) | sluice::plan({.seed = 5, .rank = rank, .world = 2, .counts_dir = counts.path()}) |
                               sluice::read() | sluice::gunzip() | sluice::lines({.gzip = sluice::compression::none}));
            std::vector<std::string> out;
            for (auto& x : p) out.push_back(x.key());
            return out;
        };
        REQUIRE(through(d.files["lines"], 0) == keys<sluice::record>(d.files["lines"], "lines", 0, 2, counts.path()));
        REQUIRE(through(d.files["lines"], 1) == keys<sluice::record>(d.files["lines"], "lines", 1, 2, counts.path()));
        auto lines = d.files["lines"];
        lines.push_back(d.dir.write("lines/zipped", sluice_test::gzip("a\nb\n")));  // gzip'd, not named so
        REQUIRE_THROWS_WITH(through(lines, 0), Catch::Contains("gzip'd shard") && Catch::Contains("lines/zipped'"));
    }
    SECTION("a stage of the user's between reader and decoder: plan cannot count the bytes it may change") {
        auto same = sluice::make_stage<sluice::chunk, sluice::chunk>(
            "mine", {}, [](sluice::stage_context<sluice::chunk, sluice::chunk>& ctx) -> sluice::task<void> {
                while (auto c = co_await ctx.in.next()) co_await ctx.out.send(std::move(*c));
            });
        sluice::pipeline p(sluice::list(d.files["lines"]) | sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) |
                           sluice::read() | same | sluice::lines());
        REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("needs record counts") &&
                                                   Catch::Contains("a stage between read and lines may change the bytes"));
    }
    SECTION("a stage plan cannot count through: the old error, saying why") {
        sluice::pipeline p(sluice::list(urls) | sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) |
                           sluice::read() |
                           sluice::make_stage<sluice::chunk, int>("mine", {}, [](sluice::stage_context<sluice::chunk, int>& ctx) -> sluice::task<void> {
                               while (co_await ctx.in.next()) co_await ctx.out.send(1);
                           }));
        REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("needs record counts") &&
                                                   Catch::Contains("no decoder it knows") && Catch::Contains("by_shard"));
    }
}

TEST_CASE("ranks starting together count once: the others wait for the counts file", "[plan][counts]") {
    formats_data d;
    const auto urls = d.files["tar"];
    sluice_test::temp_dir counts;
    constexpr unsigned world = 4;
    std::vector<std::vector<std::string>> got(world);
    std::vector<sluice::pipeline_figures> fig(world);
    std::vector<std::string> failed(world);
    {
        std::vector<std::thread> ts;
        for (unsigned r = 0; r < world; ++r)
            ts.emplace_back([&, r] {
                try {
                    got[r] = keys<sluice::record>(urls, "tar", r, world, counts.path(), &fig[r]);
                } catch (const std::exception& e) {
                    failed[r] = e.what();
                }
            });
        for (auto& t : ts) t.join();
    }
    std::uint64_t counted = 0, reused = 0;
    std::set<std::string> all;
    for (unsigned r = 0; r < world; ++r) {
        INFO("rank " << r << ": " << failed[r]);
        REQUIRE(failed[r].empty());
        REQUIRE(got[r].size() == got[0].size());
        counted += counter(fig[r], "plan", "shards_counted");
        reused += counter(fig[r], "plan", "counts_reused");
        all.insert(got[r].begin(), got[r].end());
    }
    REQUIRE(counted == urls.size());  // each shard counted once, by whichever rank came first
    REQUIRE(reused == (world - 1) * urls.size());
    REQUIRE(all.size() == world * got[0].size());
}

TEST_CASE("a rank waiting for another's counts stops at once when asked", "[plan][counts]") {
    formats_data d;
    sluice_test::temp_dir counts;
    // Another process's counter, holding the lock.
    const int fd = ::open((counts / "record-counts.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    sluice::pipeline p(sluice::list(d.files["tar"]) |
                       sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) | sluice::read() |
                       sluice::tar());
    std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        p.stop();
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<sluice::record> first;
    REQUIRE_NOTHROW(first = p.next_blocking());
    stopper.join();
    REQUIRE_FALSE(first);  // stopped while it waited: nothing delivered
    REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // the stop came at 0.3 s
    ::close(fd);
}

TEST_CASE("a counter killed while it holds the lock frees it: the next rank counts, nothing half-written is read", "[plan][counts]") {
    formats_data d;
    sluice_test::temp_dir counts;
    // What a counter that died mid-write leaves: its temporary file (never renamed), here
    // with the key of a real shard and a wrong count.
    const std::string url = d.files["tar"][0];
    std::ofstream(counts / "record-counts.tmp.999999")
        << "123456 " << sluice::detail::counts_key("tar", url, sluice::detail::local_access().facts(url)) << "\n";
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // another process's counter: takes the lock and hangs until killed
        const int fd = ::open((counts / "record-counts.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
        (void)!::write(ready[1], "x", 1);
        for (;;) ::pause();
    }
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(child, SIGKILL);
    });
    sluice::pipeline_figures fig;
    const auto t0 = std::chrono::steady_clock::now();
    const auto got = keys<sluice::record>(d.files["tar"], "tar", 0, 2, counts.path(), &fig);
    REQUIRE(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(250));  // it waited for the lock
    killer.join();
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    ::close(ready[0]);
    ::close(ready[1]);
    REQUIRE(counter(fig, "plan", "shards_counted") == 5);  // it waited, then counted all
    REQUIRE(got.size() == keys<sluice::record>(d.files["tar"], "tar", 1, 2, counts.path()).size());
    for (auto& [key, n] : sluice::detail::load_counts_file(counts / "record-counts")) REQUIRE(n != 123456);
}

TEST_CASE("over HTTP, plan counts with ranged requests and names a missing object", "[plan][counts][http]") {
    sluice_test::temp_dir www;
    sluice::detail::rng r(sluice_test::test_seed());
    sluice_test::nginx_server nginx(www.path().string());
    std::vector<std::string> urls;
    std::uint64_t bytes = 0, files = 0;
    for (int s = 0; s < 4; ++s) {
        std::string t;
        for (int i = 0; i < 6 + s; ++i, ++files)
            sluice::append_tar_file(t, "f" + std::to_string(i) + ".bin", sluice_test::random_bytes(r, 512u << 10));
        sluice::end_tar(t);
        bytes += t.size();
        www.write("shard-" + std::to_string(s) + ".tar", t);
        urls.push_back(nginx.url("shard-" + std::to_string(s) + ".tar"));
    }
    // Credentials in a URL (user:password@, a presigned query) must not reach the counts
    // file; an empty object (nginx answers 416 to its range) counts 0.
    urls[1].replace(0, 7, "http://user:hunter2@");
    urls[2] += "?X-Amz-Signature=0123abcd";
    www.write("empty.tar", "");
    urls.push_back(nginx.url("empty.tar"));
    sluice_test::temp_dir counts;
    std::set<std::string> all;
    for (unsigned rank = 0; rank < 2; ++rank) {
        sluice::pipeline p(sluice::list(urls) | sluice::plan({.rank = rank, .world = 2, .counts_dir = counts.path()}) |
                           sluice::fetch() | sluice::tar());
        std::uint64_t n = 0;
        for (auto& rec : p) all.insert(rec.source->url + "#" + std::to_string(rec.index)), ++n;
        REQUIRE(n == files / 2);
        const auto f = p.figures();
        REQUIRE(counter(f, "plan", "shards_counted") == (rank == 0 ? 5 : 0));
        if (rank == 0) {
            REQUIRE(counter(f, "plan", "count_bytes") > 0);
            REQUIRE(counter(f, "plan", "count_bytes") < bytes / 5);
        }
    }
    REQUIRE(all.size() == files);
    // The key holds the ETag nginx gives.
    auto kept = sluice::detail::load_counts_file(counts / "record-counts");
    REQUIRE(kept.size() == 5);
    REQUIRE(kept.begin()->first.find('"') != std::string::npos);
    const std::string file = sluice_test::slurp_file(counts / "record-counts");
    REQUIRE(file.find("hunter2") == std::string::npos);
    REQUIRE(file.find("0123abcd") == std::string::npos);
    REQUIRE(file.find("?...#") != std::string::npos);  // the redacted URL and the whole one's hash

    urls.push_back(nginx.url("no-such-shard.tar"));
    sluice::pipeline p(sluice::list(urls) | sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) |
                       sluice::fetch() | sluice::tar());
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("cannot count records (HTTP 404)") &&
                                               Catch::Contains("no-such-shard.tar'"));
}

TEST_CASE("over S3 with signatures checked, plan counts through signed ranged requests", "[plan][counts][s3]") {
    SLUICE_SKIP_WITHOUT("moto");
    sluice_test::temp_dir root;
    sluice::detail::rng r(sluice_test::test_seed());
    std::vector<std::string> urls;
    std::uint64_t total = 0;
    for (int s = 0; s < 3; ++s) {
        std::string tf;
        for (int i = 0; i < 5 + 3 * s; ++i, ++total) sluice::append_tfrecord(tf, sluice_test::random_bytes(r, 3000));
        root.write("data/tf/" + std::to_string(s) + ".tfrecord", tf);
        urls.push_back("s3://data/tf/" + std::to_string(s) + ".tfrecord");
    }
    sluice_test::s3_server moto("moto", root.path().string());
    sluice_test::scoped_env env({{"AWS_ACCESS_KEY_ID", moto.key()},
                                 {"AWS_SECRET_ACCESS_KEY", moto.secret()},
                                 {"AWS_SESSION_TOKEN", std::nullopt},
                                 {"AWS_PROFILE", std::nullopt},
                                 {"AWS_ENDPOINT_URL", moto.endpoint()},
                                 {"AWS_ENDPOINT_URL_S3", std::nullopt},
                                 {"AWS_REGION", "us-east-1"}});
    sluice_test::temp_dir counts;
    std::uint64_t n = 0;
    for (unsigned rank = 0; rank < 2; ++rank) {
        sluice::pipeline p(sluice::list(urls) | sluice::plan({.rank = rank, .world = 2, .counts_dir = counts.path()}) |
                           sluice::fetch() | sluice::tfrecord());
        for (auto& rec : p) (void)rec, ++n;
    }
    REQUIRE(n == total / 2 * 2);
    REQUIRE(sluice::detail::load_counts_file(counts / "record-counts").size() == 3);
}

TEST_CASE("a server that ignores ranges: small objects are taken whole, a large one is refused by name", "[plan][counts][http]") {
    if (!sluice_test::have_program("python3")) {
        WARN("[test skipped] python3 is missing");
        return;
    }
    sluice_test::temp_dir www, logs;
    std::string small, large;
    sluice::append_tar_file(small, "a.bin", "one");
    sluice::append_tar_file(small, "b.bin", "two");
    sluice::end_tar(small);
    for (int i = 0; i < 3; ++i) sluice::append_tar_file(large, std::to_string(i) + ".bin", std::string(7u << 20, 'x'));
    sluice::end_tar(large);
    www.write("small.tar", small);
    www.write("large.tar", large);
    const int port = sluice_test::free_port();
    // Python's http.server answers every GET whole (200), Range or not.
    sluice_test::child server({"python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", www.path().string(),
                               std::to_string(port)},
                              logs / "out", logs / "err");
    for (int i = 0; i < 500 && !sluice_test::accepts(port); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(sluice_test::accepts(port));
    const std::string base = "http://127.0.0.1:" + std::to_string(port) + "/";
    sluice_test::temp_dir counts;
    sluice::pipeline ok(sluice::list({base + "small.tar", base + "small.tar?again"}) |
                        sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) | sluice::fetch() | sluice::tar());
    std::uint64_t n = 0;
    for (auto& r : ok) (void)r, ++n;
    REQUIRE(n == 2);  // 4 files, halved
    sluice::pipeline big(sluice::list({base + "small.tar", base + "large.tar"}) |
                         sluice::plan({.rank = 0, .world = 2, .counts_dir = counts.path()}) | sluice::fetch() | sluice::tar());
    REQUIRE_THROWS_WITH(big.next_blocking(), Catch::Contains("the server ignores ranged requests") &&
                                                 Catch::Contains("large.tar'"));
}
