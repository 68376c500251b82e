#pragma once
// A local disk cache of remote objects, shared by the processes of one node.
//
// fetch() with `.cache = {.dir, .max_bytes}` looks each object up here first: a hit is
// read from local disk; a miss streams from the source as usual and is written here as
// it arrives. Layout: one file per object, named by a hash of its URL and its file name.
//  - Atomic: an object is written to a temporary file (".tmp-..."), ends with a trailer
//    that records its size, is flushed to disk (fdatasync) and only then renamed into
//    place. A crash leaves at most a temporary file (removed by a later eviction once
//    stale), never a cached object that is later served; a copy whose trailer does not
//    match (cut short by hand, or by a file system that lost the flush) is discarded and
//    fetched again.
//  - Bounded: after each new object, the least recently used objects (by modification
//    time, which each hit refreshes) are removed until the cache holds at most max_bytes.
//    Eviction holds an exclusive flock() on "<dir>/.lock", so processes sharing the
//    directory do not both evict for the same room. A reader that opened an object before
//    another process evicted it keeps reading it (POSIX unlink semantics).
//  - A write that fails (a full disk, a quota) abandons that object's copy with a warning;
//    the object is still delivered from its source, whole and once, and nothing partial is
//    ever renamed into place.
//  - Objects are keyed by URL only: the cache assumes objects do not change under the same
//    URL (datasets are written once). Clear the directory after rewriting one.

#include <sluice/core/detail/random.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace sluice {

struct cache_options {
    /// Directory of the cache (created when missing); empty: no cache.
    std::string dir = {};
    /// Bytes the cache may hold (objects and their trailers); least recently used objects
    /// are removed beyond it. 0: no limit but the disk (a full disk only stops caching).
    std::uint64_t max_bytes = 0;
    /// Bytes per chunk when reading a cached copy.
    std::size_t chunk_size = 4u << 20;
    /// Map cached copies into memory instead of reading them (chunks are slices of the
    /// mapping: no copy; bench/RESULTS.md). Safe here, unlike for read() in general: a
    /// copy is never rewritten in place (a new copy is renamed over it, eviction unlinks
    /// it, and a mapped file that is unlinked stays whole), so nothing shrinks under the
    /// mapping unless someone truncates files in the cache directory by hand.
    bool map = true;
    /// Temporary files untouched for this long belong to a process that died: eviction
    /// removes them.
    std::chrono::seconds stale_after{3600};
    /// Receives warnings (a copy that could not be written); by default one line on
    /// stderr for the first, then a count in the stage's stats ("cache_write_failures").
    std::function<void(const std::string&)> on_warning = nullptr;
};

namespace detail {

/// One cache directory as this process uses it.
class local_cache {
public:
    static constexpr char magic[8] = {'s', 'l', 'u', 'i', 'c', 'e', 'c', '1'};
    static constexpr std::size_t trailer_size = 16;  // magic + little-endian size

    explicit local_cache(cache_options o) : o_(std::move(o)) {
        std::error_code ec;
        std::filesystem::create_directories(o_.dir, ec);
        if (ec) throw source_error(o_.dir, "cannot create the cache directory", ec);
        const std::string lock = o_.dir + "/.lock";
        lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock_fd_ < 0) throw source_error(lock, "cannot open the cache's lock file", {errno, std::generic_category()});
    }
    ~local_cache() {
        if (lock_fd_ >= 0) ::close(lock_fd_);
    }
    local_cache(const local_cache&) = delete;
    local_cache& operator=(const local_cache&) = delete;

    const cache_options& options() const noexcept { return o_; }

    /// Where the copy of `url` lives.
    std::string path_for(const std::string& url) const {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(mix(fnv1a(fnv_offset, url), url.size())));
        const std::string shown = source_error::redact(url);  // no user:password@ or query in a file name
        std::string name = shown.substr(shown.find_last_of('/') + 1);
        if (const auto q = name.find('?'); q != std::string::npos) name.erase(q);
        for (auto& c : name)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
        if (name.size() > 80) name.resize(80);
        return o_.dir + "/" + hex + "-" + name;
    }

    /// A complete copy of `url`: its open file and the object's size (the bytes before the
    /// trailer). Refreshes its time for LRU. A copy with a bad trailer is removed.
    struct hit {
        int fd = -1;
        std::uint64_t size = 0;
        std::string path;
    };
    std::optional<hit> find(const std::string& url) {
        hit h;
        h.path = path_for(url);
        h.fd = ::open(h.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (h.fd < 0) return std::nullopt;
        struct stat st {};
        unsigned char t[trailer_size];
        bool ok = ::fstat(h.fd, &st) == 0 && st.st_size >= static_cast<off_t>(trailer_size) &&
                  ::pread(h.fd, t, trailer_size, st.st_size - static_cast<off_t>(trailer_size)) ==
                      static_cast<ssize_t>(trailer_size) &&
                  std::memcmp(t, magic, sizeof magic) == 0;
        if (ok) {
            for (int i = 7; i >= 0; --i) h.size = (h.size << 8) | t[8 + i];
            ok = h.size + trailer_size == static_cast<std::uint64_t>(st.st_size);
        }
        if (!ok) {
            ::close(h.fd);
            ::unlink(h.path.c_str());  // cut short (a power loss before its data reached disk)
            return std::nullopt;
        }
        ::futimens(h.fd, nullptr);  // owner: allowed on a read-only descriptor
        return h;
    }

    void warn(const std::string& what) {
        if (o_.on_warning) return o_.on_warning(what);
        if (!warned_.exchange(true)) std::cerr << what << " (later failures are counted as cache_write_failures)\n";
    }

    /// Writes one object's copy as its chunks arrive; commit() puts it in place.
    class writer {
    public:
        writer(local_cache& c, std::string url) : c_(c), url_(std::move(url)) {
            std::random_device rd;
            char name[64];
            std::snprintf(name, sizeof name, "/.tmp-%ld-%08x%08x", static_cast<long>(::getpid()), rd(), rd());
            tmp_ = c_.o_.dir + name;
            fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd_ < 0) fail(errno, 0);
        }
        ~writer() {
            if (fd_ >= 0) ::close(fd_);
            if (!committed_) ::unlink(tmp_.c_str());
        }
        writer(const writer&) = delete;
        writer& operator=(const writer&) = delete;

        bool failed() const noexcept { return failed_; }

        /// The bytes at `offset` of the object (chunks arrive in order; a resumed transfer
        /// may write a range again, which pwrite makes harmless).
        void write(std::span<const std::byte> data, std::uint64_t offset) {
            if (failed_) return;
            std::size_t done = 0;
            while (done < data.size()) {
                const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) return fail(n < 0 ? errno : ENOSPC, offset + done);
                done += static_cast<std::size_t>(n);
            }
        }

        /// The object is complete at `size` bytes: add the trailer, make room, rename.
        /// Returns whether the copy is now in the cache.
        bool commit(std::uint64_t size) {
            if (failed_) return false;
            if (c_.o_.max_bytes && size + trailer_size > c_.o_.max_bytes) return false;  // would never fit
            unsigned char t[trailer_size];
            std::memcpy(t, magic, sizeof magic);
            for (int i = 0; i < 8; ++i) t[8 + i] = static_cast<unsigned char>(size >> (8 * i));
            const std::span<const std::byte> tb(reinterpret_cast<const std::byte*>(t), trailer_size);
            write(tb, size);
            if (failed_) return false;
            if (::ftruncate(fd_, static_cast<off_t>(size + trailer_size)) != 0 || ::fdatasync(fd_) != 0) {
                fail(errno, size);  // on disk before it has its name: a power loss cannot leave it half written
                return false;
            }
            ::close(fd_);
            fd_ = -1;
            if (const int err = c_.place(size + trailer_size, tmp_, c_.path_for(url_))) {
                fail(err, size);
                return false;
            }
            committed_ = true;
            return true;
        }

    private:
        void fail(int err, std::uint64_t at) {
            failed_ = true;
            if (fd_ >= 0) ::close(fd_);
            fd_ = -1;
            ::unlink(tmp_.c_str());
            c_.failures.fetch_add(1, std::memory_order_relaxed);
            c_.warn("sluice: cache: cannot write '" + tmp_ + "' at byte " + std::to_string(at) + ": " +
                    std::error_code(err, std::generic_category()).message() + "; '" + source_error::redact(url_) +
                    "' is read from its source and not cached");
        }

        local_cache& c_;
        std::string url_;
        std::string tmp_;
        int fd_ = -1;
        bool failed_ = false;
        bool committed_ = false;
    };

    std::atomic<std::uint64_t> failures{0};

    /// Under the directory's lock: removes stale temporary files, then least recently
    /// used objects until `incoming` more bytes fit in max_bytes, then renames `tmp` (the
    /// caller's complete copy) to `final`. Returns 0 or the rename's errno.
    int place(std::uint64_t incoming, const std::string& tmp, const std::string& final) {
        std::lock_guard local(m_);  // flock is per open file: threads of this process queue here
        struct flock_guard {
            int fd;
            explicit flock_guard(int f) : fd(f) {
                while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
                }
            }
            ~flock_guard() { ::flock(fd, LOCK_UN); }
        } lock(lock_fd_);
        struct entry {
            std::string path;
            std::uint64_t bytes;
            struct timespec mtime;
        };
        std::vector<entry> entries;
        std::uint64_t used = 0;
        const auto now = std::chrono::system_clock::now();
        const std::string keep_name = tmp.substr(tmp.find_last_of('/') + 1);
        if (DIR* d = ::opendir(o_.dir.c_str())) {
            while (dirent* e = ::readdir(d)) {
                const std::string name = e->d_name;
                if (name == "." || name == ".." || name == ".lock") continue;
                const std::string path = o_.dir + "/" + name;
                struct stat st {};
                if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
                const auto bytes = static_cast<std::uint64_t>(st.st_size);
                if (name.starts_with(".tmp-")) {
                    const auto age = now - std::chrono::system_clock::time_point(
                                               std::chrono::seconds(st.st_mtim.tv_sec));
                    if (name != keep_name && age > o_.stale_after) ::unlink(path.c_str());
                    else if (name != keep_name) used += bytes;  // another writer's object in progress
                    continue;
                }
                if (path == final) continue;  // another process's copy of the same object: replaced
                used += bytes;
                entries.push_back({path, bytes, st.st_mtim});
            }
            ::closedir(d);
        }
        auto rename_into_place = [&] { return ::rename(tmp.c_str(), final.c_str()) == 0 ? 0 : errno; };
        if (!o_.max_bytes || used + incoming <= o_.max_bytes) return rename_into_place();
        std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
            return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
        });
        for (auto& e : entries) {
            if (used + incoming <= o_.max_bytes) break;
            if (::unlink(e.path.c_str()) == 0 || errno == ENOENT) used -= std::min(used, e.bytes);
            evictions.fetch_add(1, std::memory_order_relaxed);
        }
        return rename_into_place();
    }

    std::atomic<std::uint64_t> evictions{0};

private:
    cache_options o_;
    int lock_fd_ = -1;
    std::mutex m_;
    std::atomic<bool> warned_{false};
};

}  // namespace detail
}  // namespace sluice
