#pragma once
// Record counts plan makes itself (plan_options::counts unset, world > 1): every shard's
// count, from a counts file where it is there and still holds, else counted through the
// reader and decoder after plan (core/detail/shard_counting.hpp) and added to the file.
//
// The counts file, `<dir>/record-counts`, keeps one line per shard version:
//     COUNT FORMAT SIZE VERSION URL
// (the URL without credentials or query string, plus a hash of the whole where those
// were there: see counts_url) keyed by everything but the count: a shard rewritten (another size or mtime/ETag), or
// read by another format (tar and webdataset number a file differently; "+gunzip" when
// counted through a gunzip, which refuses gzip'd shards), is counted
// again. Lines it cannot read are ignored (counted again), never trusted.
//
// One counter per node: every process takes an exclusive flock on
// `<dir>/record-counts.lock` before it reads the file, and holds it while it counts what
// is missing and writes the file back (a temporary file renamed over it, so a reader
// never sees half a file). The ranks that come second wait on the lock and then find
// every count there. A process that dies holding the lock frees it (the kernel drops
// flocks with their process), and what it had not yet renamed is never seen.
//
// A directory that cannot be made or written is not an error: the counts are then made
// in memory by each process, and the stage's figures say so ("counts" note).

#include <sluice/core/detail/shard_counting.hpp>
#include <sluice/core/detail/random.hpp>
#include <sluice/core/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace sluice::detail {

/// What plan's counting did: the counts (one per URL, in listed order) and its figures.
struct counted_shards {
    std::vector<std::uint64_t> counts;
    std::uint64_t counted = 0;  // shards this process counted
    std::uint64_t reused = 0;   // shards whose counts it found in the file
    std::uint64_t bytes = 0;    // bytes it read to count them
    std::string where;          // the counts file, or why none was kept
};

/// Where plan keeps its counts file: `given`, else fetch's cache directory, else
/// $XDG_CACHE_HOME/sluice, else $HOME/.cache/sluice; empty when none is known.
inline std::string counts_dir_for(const std::string& given, const std::string& cache_dir) {
    if (!given.empty()) return given;
    if (!cache_dir.empty()) return cache_dir;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/sluice";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/sluice";
    return {};
}

/// A version as one word in the counts file ("-" when empty).
inline std::string counts_word(const std::string& v) {
    if (v.empty()) return "-";
    std::string out;
    for (char c : v) {
        if (c == ' ' || c == '%' || c == '\t' || c == '\n' || c == '\r') {
            static constexpr char hex[] = "0123456789ABCDEF";
            out += '%';
            out += hex[(static_cast<unsigned char>(c) >> 4) & 15];
            out += hex[static_cast<unsigned char>(c) & 15];
        } else {
            out += c;
        }
    }
    return out;
}

/// A URL as the counts file keeps it: as error messages show it (source_error::redact:
/// no user:password@, no query string, where presigned URLs carry their signature), plus a
/// hash of the whole URL where that differs, so no credential is written to disk and two
/// URLs that differ only there are still told apart; escaped like a version.
inline std::string counts_url(const std::string& url) {
    std::string out = source_error::redact(url);
    if (out != url) {
        char hex[24];
        std::snprintf(hex, sizeof hex, "#%016llx", static_cast<unsigned long long>(fnv1a(fnv_offset, url)));
        out += hex;
    }
    return counts_word(out);
}

/// The key of a shard version: "FORMAT SIZE VERSION URL" (the line less its count).
inline std::string counts_key(const std::string& format, const std::string& url, const shard_facts& f) {
    return format + ' ' + std::to_string(f.size) + ' ' + counts_word(f.version) + ' ' + counts_url(url);
}

/// The counts file's lines as key -> count; lines it cannot read are left out.
inline std::map<std::string, std::uint64_t> load_counts_file(const std::string& path) {
    std::map<std::string, std::uint64_t> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line.back() == '\r') continue;
        const auto sp = line.find(' ');
        if (sp == 0 || sp == std::string::npos) continue;
        std::uint64_t n = 0;
        bool ok = sp < 20;
        for (std::size_t i = 0; i < sp && ok; ++i) ok = line[i] >= '0' && line[i] <= '9', n = n * 10 + static_cast<unsigned>(line[i] - '0');
        // FORMAT SIZE VERSION URL: three more spaces at least.
        const std::string key = line.substr(sp + 1);
        if (!ok || std::count(key.begin(), key.end(), ' ') < 3) continue;
        out[key] = n;
    }
    return out;
}

/// Runs `work(i)` for i in [0, n) on up to `threads` threads (fewer where the system
/// gives fewer); the first exception, or a stop, ends the others at their next item, and
/// is rethrown.
template <class Work>
void for_each_parallel(std::size_t n, unsigned threads, const std::stop_token& stop, Work work) {
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first;
    std::mutex m;
    auto run = [&] {
        for (std::size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
            try {
                if (stop.stop_requested()) throw stopped{};
                work(i);
            } catch (...) {
                std::lock_guard lock(m);
                if (!first) first = std::current_exception();
                failed = true;
            }
        }
    };
    std::vector<std::thread> ts;
    const auto t = static_cast<unsigned>(std::min<std::size_t>(threads, n));
    try {
        for (unsigned k = 1; k < t; ++k) ts.emplace_back(run);
    } catch (const std::system_error&) {  // no more threads: those started and this one do it
    }
    run();
    for (auto& th : ts) th.join();
    if (first) std::rethrow_exception(first);
}

/// An exclusive flock on `path`, taken while `stop` is not requested (polled: a blocked
/// flock cannot be interrupted otherwise). Not held when the file cannot be opened.
class counts_lock {
public:
    counts_lock(const std::string& path, const std::stop_token& stop) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd_ < 0) return;
        while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            if (errno != EWOULDBLOCK && errno != EINTR) {
                ::close(fd_);
                fd_ = -1;
                return;
            }
            if (stop.stop_requested()) {
                ::close(fd_);
                throw stopped{};
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ~counts_lock() {
        if (fd_ >= 0) ::close(fd_);  // closing drops the lock
    }
    counts_lock(const counts_lock&) = delete;
    counts_lock& operator=(const counts_lock&) = delete;
    bool held() const noexcept { return fd_ >= 0; }

private:
    int fd_ = -1;
};

/// The record counts of `urls` through what the stages after plan offered (`b`), kept in
/// `dir`'s counts file (see the top of this file). Blocking; as many shards at once as
/// the access says (shard_access::parallel).
inline counted_shards count_shards(const std::vector<std::string>& urls, const counting_board& b, const std::string& dir,
                                   std::stop_token stop) {
    counted_shards out;
    out.counts.assign(urls.size(), 0);
    std::vector<shard_facts> facts(urls.size());
    std::mutex m;
    std::vector<std::unique_ptr<shard_access>> spare;  // one access per thread, kept for the counting
    spare.push_back(b.access(stop));
    const unsigned threads = std::max(1u, spare.back()->parallel());
    auto take = [&] {
        std::lock_guard lock(m);
        if (spare.empty()) return b.access(stop);
        auto a = std::move(spare.back());
        spare.pop_back();
        return a;
    };
    auto give = [&](std::unique_ptr<shard_access> a) {
        std::lock_guard lock(m);
        spare.push_back(std::move(a));
    };
    for_each_parallel(urls.size(), threads, stop, [&](std::size_t i) {
        auto a = take();
        facts[i] = a->facts(urls[i]);
        give(std::move(a));
    });

    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string file = dir.empty() ? std::string() : dir + "/record-counts";
    if (!dir.empty()) fs::create_directories(dir, ec);
    std::unique_ptr<counts_lock> lock;
    if (!dir.empty() && !ec) lock = std::make_unique<counts_lock>(file + ".lock", stop);
    const bool kept = lock && lock->held();
    out.where = kept ? file : dir.empty() ? "not kept (no directory: set plan_options::counts_dir)"
                                          : "not kept (cannot write " + dir + ")";
    auto known = kept ? load_counts_file(file) : std::map<std::string, std::uint64_t>{};
    // Counted through a gunzip (the decoder's own or the user's), a gzip'd shard is
    // refused; counted without one, it is counted as it is read: keyed apart.
    const auto between = b.checks_between();
    const std::string format = between.empty() ? b.format : b.format + "+gunzip";
    std::vector<std::size_t> missing;
    std::vector<std::string> keys(urls.size());
    for (std::size_t i = 0; i < urls.size(); ++i) {
        keys[i] = counts_key(format, urls[i], facts[i]);
        if (auto it = known.find(keys[i]); it != known.end()) {
            out.counts[i] = it->second;
            ++out.reused;
        } else {
            missing.push_back(i);
        }
    }
    std::atomic<std::uint64_t> bytes{0};
    for_each_parallel(missing.size(), threads, stop, [&](std::size_t k) {
        const std::size_t i = missing[k];
        auto a = take();
        shard_reader r(*a, urls[i], facts[i].size, stop);
        for (auto& check : between) check(r);  // a gunzip between reader and decoder refuses gzip'd shards
        out.counts[i] = b.count(r);
        bytes += r.bytes_read();
        // A shard rewritten while it was counted (at the same size, or the reads would have
        // found it short) would keep a count that is not its own under its new version.
        const shard_facts after = a->facts(urls[i]);
        if (after.size != facts[i].size || after.version != facts[i].version)
            throw source_error(urls[i], "cannot count records: the shard changed while they were counted (size " +
                                            std::to_string(facts[i].size) + " -> " + std::to_string(after.size) +
                                            ", version " + counts_word(facts[i].version) + " -> " +
                                            counts_word(after.version) + "):");
        give(std::move(a));
    });
    out.counted = missing.size();
    out.bytes = bytes.load();
    if (!kept || missing.empty()) return out;
    // Back into the file: what was there, less older versions of these shards, plus them.
    // "FORMAT URL" -> the key of the version counted now; the URL without the hash a
    // credential or query string adds (counts_url), so a presigned URL signed anew
    // replaces its old line instead of adding one each run.
    auto family = [](std::string url) {
        const auto h = url.rfind('#');
        if (h != std::string::npos && url.size() - h == 17 &&
            url.find_first_not_of("0123456789abcdef", h + 1) == std::string::npos)
            url.resize(h);
        return url;
    };
    std::map<std::string, std::string> current;
    for (auto i : missing) {
        known[keys[i]] = out.counts[i];
        current[format + ' ' + family(counts_url(urls[i]))] = keys[i];
    }
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    {
        std::ofstream o(tmp, std::ios::trunc);
        for (auto& [key, n] : known) {
            // An older version of a shard just counted (same format and URL) is dropped.
            const auto s1 = key.find(' '), s2 = key.find(' ', s1 + 1), s3 = key.find(' ', s2 + 1);
            const auto it = current.find(key.substr(0, s1) + ' ' + family(key.substr(s3 + 1)));
            if (it == current.end() || it->second == key) o << n << ' ' << key << '\n';
        }
        o.flush();
        if (!o) {
            fs::remove(tmp, ec);
            out.where = "not kept (cannot write " + tmp + ")";
            return out;
        }
    }
    fs::rename(tmp, file, ec);
    if (ec) {
        fs::remove(tmp, ec);
        out.where = "not kept (cannot rename into " + file + ")";
    }
    return out;
}

}  // namespace sluice::detail
