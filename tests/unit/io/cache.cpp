#include <sluice/io/cache.hpp>

#include "support/test_support.hpp"

#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <thread>

namespace {
std::span<const std::byte> as_bytes(const std::string& s) {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string read_copy(sluice::detail::local_cache::hit h) {
    std::string out(h.size, '\0');
    REQUIRE(::pread(h.fd, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
    ::close(h.fd);
    return out;
}
// Puts `content` in the cache as the copy of `url`.
bool put(sluice::detail::local_cache& c, const std::string& url, const std::string& content) {
    sluice::detail::local_cache::writer w(c, url);
    w.write(as_bytes(content.substr(0, content.size() / 2)), 0);
    w.write(as_bytes(content.substr(content.size() / 2)), content.size() / 2);
    return w.commit(content.size());
}
// The same, for a forked child (no REQUIRE there).
std::string read_copy_raw(sluice::detail::local_cache::hit h) {
    std::string out(h.size, '\0');
    const bool ok = ::pread(h.fd, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size());
    ::close(h.fd);
    return ok ? out : std::string();
}
void put_raw(sluice::detail::local_cache& c, const std::string& url, const std::string& content) {
    sluice::detail::local_cache::writer w(c, url);
    w.write(as_bytes(content), 0);
    w.commit(content.size());
}
int entries(const std::string& dir) {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) n += !e.path().filename().string().starts_with(".");
    return n;
}
}  // namespace

TEST_CASE("a committed copy is found with its size, an uncommitted one never is", "[cache]") {
    sluice_test::temp_dir d;
    sluice::detail::local_cache c({.dir = d / "c"});
    REQUIRE_FALSE(c.find("http://h/a.tar"));
    REQUIRE(put(c, "http://h/a.tar", "hello, cache"));
    auto h = c.find("http://h/a.tar");
    REQUIRE(h);
    REQUIRE(h->size == 12);
    REQUIRE(read_copy(*h) == "hello, cache");
    {
        sluice::detail::local_cache::writer w(c, "http://h/b.tar");
        w.write(as_bytes("partial"), 0);
        REQUIRE(entries(d / "c") == 1);  // the partial copy is a temporary file only
    }  // abandoned: removed
    REQUIRE_FALSE(c.find("http://h/b.tar"));
    REQUIRE(std::distance(std::filesystem::directory_iterator(d / "c"), {}) == 2);  // the copy and .lock
}

TEST_CASE("a copy whose trailer does not match (cut short) is removed, not served", "[cache]") {
    sluice_test::temp_dir d;
    sluice::detail::local_cache c({.dir = d / "c"});
    REQUIRE(put(c, "http://h/a", std::string(1000, 'a')));
    const auto path = c.path_for("http://h/a");
    std::filesystem::resize_file(path, 600);
    REQUIRE_FALSE(c.find("http://h/a"));
    REQUIRE_FALSE(std::filesystem::exists(path));
}

TEST_CASE("the cache evicts the least recently used copies to stay under max_bytes", "[cache]") {
    sluice_test::temp_dir d;
    const std::uint64_t each = 1000 + sluice::detail::local_cache::trailer_size;
    sluice::detail::local_cache c({.dir = d / "c", .max_bytes = 3 * each});
    for (auto name : {"a", "b", "c"}) {
        REQUIRE(put(c, std::string("http://h/") + name, std::string(1000, name[0])));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct modification times
    }
    auto hit = c.find("http://h/a");  // a is now the most recently used
    REQUIRE(hit);
    ::close(hit->fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(put(c, "http://h/d", std::string(1000, 'd')));
    REQUIRE(c.find("http://h/a"));
    REQUIRE_FALSE(c.find("http://h/b"));  // the least recently used went
    REQUIRE(c.find("http://h/c"));
    REQUIRE(c.find("http://h/d"));
    REQUIRE(c.evictions.load() == 1);
    // An object larger than the whole cache is not kept (nor does it empty the cache).
    REQUIRE_FALSE(put(c, "http://h/huge", std::string(4 * each, 'h')));
    REQUIRE(entries(d / "c") == 3);
}

TEST_CASE("stale temporary files of dead writers are removed, live ones kept", "[cache]") {
    sluice_test::temp_dir d;
    sluice::detail::local_cache c({.dir = d / "c", .max_bytes = 1 << 20, .stale_after = std::chrono::seconds(60)});
    const auto old_tmp = d.write("c/.tmp-1-dead", "left by a crash");
    const auto new_tmp = d.write("c/.tmp-2-live", "being written");
    const auto then = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
    std::filesystem::last_write_time(old_tmp, then);
    REQUIRE(put(c, "http://h/a", "x"));
    REQUIRE_FALSE(std::filesystem::exists(old_tmp));
    REQUIRE(std::filesystem::exists(new_tmp));
}

TEST_CASE("a write that fails abandons the copy with a warning naming the file and the error", "[cache][errors]") {
    sluice_test::temp_dir d;
    std::vector<std::string> warnings;
    sluice::detail::local_cache c({.dir = d / "c", .on_warning = [&](const std::string& w) { warnings.push_back(w); }});
    std::filesystem::remove_all(d / "c");  // (a read-only directory would not stop root)
    // A signature no path could hold by chance (the copy's name is hex, "abc" was seen in one).
    sluice::detail::local_cache::writer w(c, "https://user:secret@h/a.tar?X-Amz-Signature=SIGNATUREVALUE");
    w.write(as_bytes("data"), 0);
    REQUIRE(w.failed());
    REQUIRE_FALSE(w.commit(4));
    REQUIRE(warnings.size() == 1);
    REQUIRE_THAT(warnings[0], Catch::Contains("sluice: cache: cannot write") && Catch::Contains("No such file or directory") &&
                                  Catch::Contains("is read from its source and not cached"));
    REQUIRE(warnings[0].find("secret") == std::string::npos);
    REQUIRE(warnings[0].find("SIGNATUREVALUE") == std::string::npos);
    REQUIRE(c.failures.load() == 1);
}

TEST_CASE("processes sharing a cache directory keep it under its limit and every copy whole", "[cache]") {
    sluice_test::temp_dir d;
    const std::uint64_t each = 4096 + sluice::detail::local_cache::trailer_size;
    const std::string dir = d / "c";
    std::vector<pid_t> kids;
    for (int p = 0; p < 4; ++p) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            int bad = 0;
            try {
                sluice::detail::local_cache c({.dir = dir, .max_bytes = 5 * each});
                for (int i = 0; i < 40; ++i) {
                    const std::string url = "http://h/o" + std::to_string((i * 7 + p) % 12);
                    const std::string content(4096, char('a' + (i * 7 + p) % 12));
                    if (auto h = c.find(url)) bad += read_copy_raw(*h) != content;
                    else put_raw(c, url, content);
                }
            } catch (...) {
                bad = 100;
            }
            ::_exit(bad);
        }
        kids.push_back(pid);
    }
    for (auto pid : kids) {
        int st = 0;
        REQUIRE(::waitpid(pid, &st, 0) == pid);
        REQUIRE(WIFEXITED(st));
        REQUIRE(WEXITSTATUS(st) == 0);  // no copy read back wrong
    }
    std::uint64_t bytes = 0;
    for (auto& e : std::filesystem::directory_iterator(dir))
        if (!e.path().filename().string().starts_with(".")) bytes += e.file_size();
    REQUIRE(bytes <= 5 * each);
}

TEST_CASE("placing objects does not scan the directory per object, and with no limit it never scans", "[cache]") {
    sluice_test::temp_dir d;
    sluice::detail::local_cache c({.dir = d / "c", .max_bytes = 1 << 20});
    for (int i = 0; i < 20; ++i) REQUIRE(put(c, "http://h/o" + std::to_string(i), std::string(100, 'x')));
    REQUIRE(c.scans.load() == 1);  // the first placement builds the index
    REQUIRE(entries(d / "c") == 20);
    sluice::detail::local_cache unlimited({.dir = d / "u"});
    for (int i = 0; i < 5; ++i) REQUIRE(put(unlimited, "http://h/o" + std::to_string(i), "y"));
    REQUIRE(unlimited.find("http://h/o3"));
    REQUIRE(unlimited.scans.load() == 0);
    // An index older than rescan_after is built again (files removed by hand are forgotten).
    sluice::detail::local_cache eager({.dir = d / "e", .max_bytes = 1 << 20, .rescan_after = std::chrono::milliseconds(0)});
    REQUIRE(put(eager, "http://h/a", "a"));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(put(eager, "http://h/b", "b"));
    REQUIRE(eager.scans.load() == 2);
}

TEST_CASE("the index follows other processes: LRU order across them, their hits keep a copy", "[cache]") {
    // Two caches on one directory in one process: flock() excludes them like two processes.
    sluice_test::temp_dir d;
    const std::uint64_t each = 1000 + sluice::detail::local_cache::trailer_size;
    const std::string dir = d / "c";
    sluice::detail::local_cache a({.dir = dir, .max_bytes = 3 * each}), b({.dir = dir, .max_bytes = 3 * each});
    auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
    auto there = [&](int i) { return std::filesystem::exists(a.path_for("http://h/" + std::to_string(i))); };
    auto put_n = [&](sluice::detail::local_cache& c, int i) {
        pause();
        return put(c, "http://h/" + std::to_string(i), std::string(1000, char('0' + i)));
    };
    REQUIRE(put_n(a, 1));
    REQUIRE(put_n(a, 2));
    pause();
    auto h = b.find("http://h/1");  // b hits 1: now 2 is the least recently used
    REQUIRE(h);
    ::close(h->fd);
    REQUIRE(put_n(b, 3));  // b's index: built now
    REQUIRE(put_n(a, 4));  // a's index lacks 3 (the total in .lock counts it): a looks again
    REQUIRE_FALSE(there(2));
    REQUIRE(there(1));
    REQUIRE(a.scans.load() == 2);
    REQUIRE(put_n(a, 5));
    REQUIRE_FALSE(there(1));
    REQUIRE(put_n(a, 6));
    REQUIRE_FALSE(there(3));  // b's copy, the least recently used
    REQUIRE(a.scans.load() == 2);  // copies older than the scan are evicted without one
    REQUIRE(put_n(a, 7));
    REQUIRE_FALSE(there(4));
    REQUIRE(entries(dir) == 3);
    REQUIRE(a.evictions.load() == 4);
    // The same object placed again replaces its copy and is counted once.
    REQUIRE(put_n(b, 7));
    REQUIRE(entries(dir) == 3);
    REQUIRE(put_n(b, 8));  // b's index is stale: gone copies are dropped, one eviction
    REQUIRE(b.evictions.load() == 1);
    REQUIRE_FALSE(there(5));
    REQUIRE(there(6));
    REQUIRE(there(7));
    REQUIRE(entries(dir) == 3);
}

TEST_CASE("hits and placements on different threads share the index", "[cache]") {
    sluice_test::temp_dir d;
    const std::uint64_t each = 512 + sluice::detail::local_cache::trailer_size;
    sluice::detail::local_cache c({.dir = d / "c", .max_bytes = 8 * each, .rescan_after = std::chrono::milliseconds(5)});
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < 60; ++i) {
                const int k = (i * 5 + t) % 16;
                const std::string url = "http://h/o" + std::to_string(k), content(512, char('a' + k));
                if (auto h = c.find(url)) bad += read_copy_raw(*h) != content;
                else put_raw(c, url, content);
            }
        });
    for (auto& t : ts) t.join();
    REQUIRE(bad.load() == 0);
    std::uint64_t bytes = 0;
    for (auto& e : std::filesystem::directory_iterator(d / "c"))
        if (!e.path().filename().string().starts_with(".")) bytes += e.file_size();
    REQUIRE(bytes <= 8 * each);
}

TEST_CASE("one download per object: the first claim holds it, others are told it is busy, a commit lets go",
          "[cache][node]") {
    sluice_test::temp_dir d;
    using lc = sluice::detail::local_cache;
    lc a({.dir = d / "c"}), b({.dir = d / "c"});  // two processes' views of one directory
    lc::claim ca, cb;
    REQUIRE(a.try_claim("http://h/x.bin", ca) == lc::claim_result::claimed);
    REQUIRE(b.try_claim("http://h/x.bin", cb) == lc::claim_result::busy);
    {
        lc::claim cy;
        REQUIRE(b.try_claim("http://h/y.bin", cy) == lc::claim_result::claimed);  // another object: free
    }  // let go unused: its lock file goes too
    {
        lc::writer w(a, "http://h/x.bin", std::move(ca));
        CHECK(w.resume_from() == 0);
        w.set_version("\"v1\"");
        w.write(as_bytes("0123456789"), 0);
        CHECK(b.part_bytes("http://h/x.bin") == 10u);  // the others see it grow
        lc::claim again;
        CHECK(b.try_claim("http://h/x.bin", again) == lc::claim_result::busy);
        REQUIRE(w.commit(10));
        const int fd = w.take_read_fd();  // the whole object, to deliver from
        REQUIRE(fd >= 0);
        char buf[16] = {};
        CHECK(::pread(fd, buf, 10, 0) == 10);
        CHECK(std::string(buf, 10) == "0123456789");
        ::close(fd);
    }
    auto h = b.find("http://h/x.bin");
    REQUIRE(h);
    CHECK(read_copy(*h) == "0123456789");
    int temps = 0;
    for (auto& e : std::filesystem::directory_iterator(d / "c")) temps += e.path().filename().string().starts_with(".tmp-");
    CHECK(temps == 0);  // no lock file or partial copy left
    lc::claim later;
    CHECK(b.try_claim("http://h/x.bin", later) == lc::claim_result::claimed);  // free again (the caller looks for the copy)
}

TEST_CASE("a downloader that dies leaves a partial copy the next claim goes on from, this boot only", "[cache][node]") {
    sluice_test::temp_dir d;
    using lc = sluice::detail::local_cache;
    const std::string url = "http://h/big.bin";
    auto die_while_writing = [&](const std::string& u, const std::string& etag, const std::string& bytes) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            lc c({.dir = d / "c"});
            lc::claim cl;
            if (c.try_claim(u, cl) != lc::claim_result::claimed) ::_exit(1);
            auto* w = new lc::writer(c, u, std::move(cl));  // never destroyed: as if killed
            w->set_version(etag);
            w->write(as_bytes(bytes), 0);
            ::_exit(0);
        }
        int st = 0;
        REQUIRE(::waitpid(pid, &st, 0) == pid);
        REQUIRE(WIFEXITED(st));
        REQUIRE(WEXITSTATUS(st) == 0);
    };
    die_while_writing(url, "\"e1\"", "first half");
    lc c({.dir = d / "c"});
    CHECK_FALSE(c.find(url));  // never taken for a copy
    {
        lc::claim cl;
        REQUIRE(c.try_claim(url, cl) == lc::claim_result::claimed);  // the kernel let the dead one's lock go
        lc::writer w(c, url, std::move(cl));
        CHECK(w.resume_from() == 10);
        CHECK(w.version() == "\"e1\"");
        w.write(as_bytes(", second"), 10);
        REQUIRE(w.commit(18));
        ::close(w.take_read_fd());
    }
    auto h = c.find(url);
    REQUIRE(h);
    CHECK(read_copy(*h) == "first half, second");
    // A partial copy whose lock file names another boot (pages may never have reached the
    // disk before a power loss) is started afresh.
    const std::string other = "http://h/other.bin";
    die_while_writing(other, "\"e2\"", "stale bytes");
    for (auto& e : std::filesystem::directory_iterator(d / "c")) {
        const auto name = e.path().filename().string();
        if (name.starts_with(".tmp-lock-") && name.ends_with("other.bin"))
            std::ofstream(e.path(), std::ios::trunc) << "sluice-part1 00000000-0000-0000-0000-000000000000 \"e2\"\n";
    }
    lc::claim cl;
    REQUIRE(c.try_claim(other, cl) == lc::claim_result::claimed);
    lc::writer w(c, other, std::move(cl));
    CHECK(w.resume_from() == 0);
    CHECK(c.part_bytes(other) == 0u);  // truncated
}

TEST_CASE("a downloader killed inside its commit, after the trailer, is taken over as a whole object", "[cache][node]") {
    sluice_test::temp_dir d;
    using lc = sluice::detail::local_cache;
    const std::string url = "http://h/whole.bin";
    const pid_t pid = ::fork();
    if (pid == 0) {
        lc c({.dir = d / "c"});
        lc::claim cl;
        if (c.try_claim(url, cl) != lc::claim_result::claimed) ::_exit(1);
        auto* w = new lc::writer(c, url, std::move(cl));
        w->set_version("\"e3\"");
        w->write(as_bytes("all twelve b"), 0);
        unsigned char t[lc::trailer_size];  // the trailer commit() writes before flushing and renaming
        std::memcpy(t, lc::magic, sizeof lc::magic);
        // 64 bits wide, as commit() writes it (12u >> 32 is undefined: UBSan stopped the
        // child before the trailer, and at -O1 the bytes came out wrong).
        for (int i = 0; i < 8; ++i) t[8 + i] = static_cast<unsigned char>(std::uint64_t{12} >> (8 * i));
        w->write({reinterpret_cast<const std::byte*>(t), sizeof t}, 12);
        ::_exit(w->failed() ? 2 : 0);
    }
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));  // the child wrote the object and its trailer
    lc c({.dir = d / "c"});
    CHECK_FALSE(c.find(url));
    lc::claim cl;
    REQUIRE(c.try_claim(url, cl) == lc::claim_result::claimed);
    lc::writer w(c, url, std::move(cl));
    CHECK(w.resume_from() == 12);  // the object, without its trailer: fetch asks from byte 11
    CHECK(c.part_bytes(url) == 12u);
    w.write(as_bytes("b"), 11);
    REQUIRE(w.commit(12));
    ::close(w.take_read_fd());
    auto h = c.find(url);
    REQUIRE(h);
    CHECK(read_copy(*h) == "all twelve b");
}

TEST_CASE("stale partial copies go only when no one holds their lock", "[cache][node]") {
    sluice_test::temp_dir d;
    using lc = sluice::detail::local_cache;
    lc c({.dir = d / "c", .max_bytes = 1u << 20, .stale_after = std::chrono::seconds(60)});
    const pid_t pid = ::fork();
    if (pid == 0) {  // a downloader that dies: its lock file and partial copy stay, unheld
        lc cc({.dir = d / "c"});
        lc::claim cl;
        if (cc.try_claim("http://h/dead.bin", cl) != lc::claim_result::claimed) ::_exit(1);
        auto* w = new lc::writer(cc, "http://h/dead.bin", std::move(cl));
        w->write(as_bytes("dead"), 0);
        ::_exit(w->failed() ? 2 : 0);
    }
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    lc::claim held;  // a live download, longer than stale_after
    REQUIRE(c.try_claim("http://h/live.bin", held) == lc::claim_result::claimed);
    lc::writer live(c, "http://h/live.bin", std::move(held));
    live.write(as_bytes("live"), 0);
    auto temps = [&](const std::string& object) {
        int n = 0;
        for (auto& e : std::filesystem::directory_iterator(d / "c")) {
            const auto name = e.path().filename().string();
            n += name.starts_with(".tmp-") && name.ends_with(object);
        }
        return n;
    };
    REQUIRE(temps("dead.bin") == 2);
    REQUIRE(temps("live.bin") == 2);
    const auto then = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
    for (auto& e : std::filesystem::directory_iterator(d / "c"))
        if (e.path().filename().string().starts_with(".tmp-")) std::filesystem::last_write_time(e.path(), then);
    REQUIRE(put(c, "http://h/a", "x"));  // a placement scans: stale temporary files go
    CHECK(temps("dead.bin") == 0);
    CHECK(temps("live.bin") == 2);  // its lock is held: kept
}
