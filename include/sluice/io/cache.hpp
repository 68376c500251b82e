#pragma once
// A local disk cache of remote objects, shared by the processes of one node.
//
// fetch() with `.cache = {.dir, .max_bytes}` looks each object up here first: a hit is
// read from local disk; a miss streams from the source as usual and is written here as
// it arrives. Layout: one file per object, named by a hash of its URL and its file name.
//  - Atomic: an object is written to a temporary file (".tmp-..."), ends with a trailer
//    that records its size, is flushed to disk (fdatasync) and only then renamed into
//    place. A crash leaves at most a temporary file (removed by a later scan once
//    stale), never a cached object that is later served; a copy whose trailer does not
//    match (cut short by hand, or by a file system that lost the flush) is discarded and
//    fetched again.
//  - Bounded: after each new object, the least recently used objects (by modification
//    time, which each hit refreshes) are removed until the cache holds at most max_bytes.
//    Placement holds an exclusive flock() on "<dir>/.lock", so processes sharing the
//    directory do not both evict for the same room. A reader that opened an object before
//    another process evicted it keeps reading it (POSIX unlink semantics).
//  - No directory scan per object: each process keeps an index of the directory (path,
//    bytes, modification time, ordered by time) built by one scan, and the node-wide total
//    of committed bytes lives in "<dir>/.lock" itself (read and written under its flock by
//    every process, so the limit holds across processes without a scan). Placing an object
//    is O(1) system calls: flock, lstat of the target, the total, rename. The directory is
//    scanned again (lstat of every entry; stale temporary files removed) when the index is
//    older than rescan_after (10 s: files removed by hand, a total left wrong by a crash),
//    and when room must be made and the oldest copy the index knows was used or made after
//    its scan: copies other processes made since may then be older, so LRU order needs a
//    fresh look. Copies older than the scan come first, so a scan is followed by up to
//    a cache's worth of evictions and hits before the next: amortised O(1) per object. An
//    eviction candidate is lstat'ed first: a copy another process hit since the scan is
//    kept (its newer time re-sorts it), one already gone is dropped from the index. Hits
//    refresh the time in the index too. With max_bytes == 0 nothing is counted and the
//    directory is never scanned (stale temporary files are then left for a cache with a
//    limit, or removal by hand). max_bytes bounds committed copies; copies being written
//    come on top until they are committed.
//  - A write that fails (a full disk, a quota) abandons that object's copy with a warning;
//    the object is still delivered from its source, whole and once, and nothing partial is
//    ever renamed into place.
//  - One fetch per object per node: the first worker (of any process sharing the
//    directory) to miss an object takes an exclusive flock() on "<dir>/.tmp-lock-<name>"
//    and downloads into "<dir>/.tmp-part-<name>"; the others that miss it meanwhile look
//    again every few milliseconds until the copy is committed, and read it. The download never waits for its
//    own consumer (it goes to the file at the network's pace; the downloader then reads
//    the copy as a hit does), so ranks that wait on each other (an all-reduce) cannot
//    hold each other's objects back. The kernel releases the flock when the downloader
//    dies, even by SIGKILL; the next to miss takes the lock and goes on from the partial
//    file's length (Range + If-Match on the ETag the lock file records), if the lock file
//    says it was written since this boot (a partial file that lived through a power loss
//    may hold pages that never reached the disk: started afresh). A partial file is never
//    served: only a committed copy, renamed into place with its trailer, is.
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
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
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
    /// mapping unless someone truncates files in the cache directory by hand (which is
    /// then an error naming the file, not SIGBUS: see read_options::map).
    bool map = true;
    /// Temporary files untouched for this long belong to a process that died: eviction
    /// removes them.
    std::chrono::seconds stale_after{3600};
    /// With max_bytes: how old this process's index of the directory may get before it is
    /// built again by a scan (other processes add and remove copies; see cache.hpp).
    std::chrono::milliseconds rescan_after{10000};
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
            discard(h.path, st);  // cut short (a power loss before its data reached disk)
            return std::nullopt;
        }
        ::futimens(h.fd, nullptr);  // owner: allowed on a read-only descriptor
        if (o_.max_bytes) touch(h.path, static_cast<std::uint64_t>(st.st_size));
        return h;
    }

    /// The right to download one object into the cache for the node: the lock file, held
    /// (flock) until the copy is committed or abandoned.
    struct claim {
        int lock_fd = -1;
        std::string lock_path, part_path;
        claim() = default;
        claim(claim&& o) noexcept
            : lock_fd(std::exchange(o.lock_fd, -1)), lock_path(std::move(o.lock_path)), part_path(std::move(o.part_path)) {}
        claim& operator=(claim&&) = delete;
        ~claim() {  // done with (committed, abandoned, or found a copy): the lock file goes, then the lock
            if (lock_fd < 0) return;
            ::unlink(lock_path.c_str());  // before letting go: no one may lock a file that then vanishes
            ::close(lock_fd);
        }
    };
    enum class claim_result { claimed, busy, unavailable };
    /// Tries to become the one that downloads `url`: `claimed` (`out` holds the lock),
    /// `busy` (another worker of the node downloads it now), or `unavailable` (the lock
    /// file cannot be made: a full disk, a read-only directory; fetch without a copy).
    claim_result try_claim(const std::string& url, claim& out) {
        // For a while after a copy could not be written (a full disk), objects are fetched
        // without one: a download into a copy that fails is fetched again from the start.
        if (const auto at = failed_at_ns_.load(std::memory_order_relaxed);
            at && steady_ns() - at < std::int64_t(10'000'000'000))
            return claim_result::unavailable;
        const std::string final = path_for(url);
        const std::string name = final.substr(final.find_last_of('/') + 1);
        out.lock_path = o_.dir + "/.tmp-lock-" + name;
        out.part_path = o_.dir + "/.tmp-part-" + name;
        for (int tries = 0; tries < 100; ++tries) {
            const int fd = ::open(out.lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0) return claim_result::unavailable;
            if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
                const bool busy = errno == EWOULDBLOCK;
                ::close(fd);
                return busy ? claim_result::busy : claim_result::unavailable;
            }
            // Held, but is it still the file of that name? A downloader that finished
            // unlinks it before letting go: then try again with the new one.
            struct stat held {}, named {};
            if (::fstat(fd, &held) == 0 && ::stat(out.lock_path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
                held.st_dev == named.st_dev) {
                out.lock_fd = fd;
                return claim_result::claimed;
            }
            ::close(fd);
        }
        return claim_result::busy;
    }
    /// Bytes written so far into the partial copy of `url` (another worker's download);
    /// nothing when there is none.
    std::optional<std::uint64_t> part_bytes(const std::string& url) const {
        const std::string final = path_for(url);
        const std::string part = o_.dir + "/.tmp-part-" + final.substr(final.find_last_of('/') + 1);
        struct stat st {};
        if (::stat(part.c_str(), &st) != 0) return std::nullopt;
        return static_cast<std::uint64_t>(st.st_size);
    }

    void warn(const std::string& what) {
        if (o_.on_warning) return o_.on_warning(what);
        if (!warned_.exchange(true)) std::cerr << what << " (later failures are counted as cache_write_failures)\n";
    }

    /// Writes one object's copy as its chunks arrive; commit() puts it in place.
    class writer {
    public:
        /// The download of `url` that `cl` (a claim) allows: into the node's partial file,
        /// going on from where a downloader that died left it (resume_from(), version()).
        writer(local_cache& c, std::string url, claim cl) : c_(c), url_(std::move(url)), claim_(std::move(cl)) {
            tmp_ = claim_.part_path;
            fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd_ < 0) {
                fail(errno, 0);
                return;
            }
            // The lock file says which version the partial file holds, and since which boot.
            char b[512];
            const ssize_t n = ::pread(claim_.lock_fd, b, sizeof b - 1, 0);
            std::string said(b, n > 0 ? static_cast<std::size_t>(n) : 0);
            const std::string head = std::string(part_magic) + " " + boot_id() + " ";
            struct stat st {};
            if (said.starts_with(head) && said.ends_with('\n') && ::fstat(fd_, &st) == 0 && st.st_size > 0) {
                version_ = said.substr(head.size(), said.size() - head.size() - 1);
                resume_from_ = static_cast<std::uint64_t>(st.st_size);
                // Killed inside commit(), after the trailer: the object is whole; drop the
                // trailer (commit writes it again) and go on from its last byte.
                unsigned char t[trailer_size];
                std::uint64_t size = 0;
                if (resume_from_ >= trailer_size &&
                    ::pread(fd_, t, trailer_size, static_cast<off_t>(resume_from_ - trailer_size)) ==
                        static_cast<ssize_t>(trailer_size) &&
                    std::memcmp(t, magic, sizeof magic) == 0) {
                    for (int i = 7; i >= 0; --i) size = (size << 8) | t[8 + i];
                    if (size + trailer_size == resume_from_ && ::ftruncate(fd_, static_cast<off_t>(size)) == 0)
                        resume_from_ = size;
                }
            } else if (::ftruncate(fd_, 0) != 0) {
                fail(errno, 0);
            }
        }
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
            if (read_fd_ >= 0) ::close(read_fd_);
            if (!committed_) ::unlink(tmp_.c_str());
        }  // then claim_ removes its lock file and lets go
        writer(const writer&) = delete;
        writer& operator=(const writer&) = delete;

        bool failed() const noexcept { return failed_; }
        /// Taking over a partial copy: the bytes it holds, and the version (ETag) they are
        /// of (empty: the server gave none). 0: from the start.
        std::uint64_t resume_from() const noexcept { return resume_from_; }
        const std::string& version() const noexcept { return version_; }
        /// Records the version being written (the ETag of the first answer), so that a
        /// process taking over after this one dies asks for the same.
        void set_version(const std::string& etag) {
            if (claim_.lock_fd < 0 || failed_ || version_set_) return;
            version_set_ = true;
            const std::string line = std::string(part_magic) + " " + boot_id() + " " + etag + "\n";
            if (::pwrite(claim_.lock_fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) ||
                ::ftruncate(claim_.lock_fd, static_cast<off_t>(line.size())) != 0)
                fail(errno ? errno : ENOSPC, 0);
        }
        /// After commit(), whatever it returned: the whole object, open for reading (the
        /// caller owns it), unless a write failed; -1 then.
        int take_read_fd() noexcept { return std::exchange(read_fd_, -1); }

        /// The bytes at `offset` of the object (chunks arrive in order; a resumed transfer
        /// may write a range again, which pwrite makes harmless).
        void write(std::span<const std::byte> data, std::uint64_t offset) {
            if (failed_) return;
            std::size_t done = 0;
            while (done < data.size()) {
                const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) return fail(n < 0 ? errno : ENOSPC, offset + done);  // 0: nothing written, full
                done += static_cast<std::size_t>(n);
            }
        }

        /// The object is complete at `size` bytes: add the trailer, make room, rename.
        /// Returns whether the copy is now in the cache.
        bool commit(std::uint64_t size) {
            if (failed_) return false;
            read_fd_ = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);  // all of it is written
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
            c_.failed_at_ns_.store(steady_ns(), std::memory_order_relaxed);
            c_.warn("sluice: cache: cannot write '" + tmp_ + "' at byte " + std::to_string(at) + ": " +
                    std::error_code(err, std::generic_category()).message() + "; '" + source_error::redact(url_) +
                    "' is read from its source and not cached");
        }

        static constexpr const char* part_magic = "sluice-part1";
        /// This boot's id: a partial file from an earlier boot may have lost pages.
        static const std::string& boot_id() {
            static const std::string id = [] {
                std::string s;
                if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
                    char b[64] = {};
                    if (std::fgets(b, sizeof b, f)) s = b;
                    std::fclose(f);
                }
                while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
                return s.empty() ? std::string("unknown-boot") : s;
            }();
            return id;
        }

        local_cache& c_;
        std::string url_;
        claim claim_;  // declared before fd_: the lock lets go last
        std::string tmp_;
        int fd_ = -1;
        int read_fd_ = -1;
        bool failed_ = false;
        bool committed_ = false;
        bool version_set_ = false;
        std::uint64_t resume_from_ = 0;
        std::string version_;
    };

    std::atomic<std::uint64_t> failures{0};

    std::atomic<std::uint64_t> evictions{0};
    /// Directory scans so far (placing an object does not scan; see the header).
    std::atomic<std::uint64_t> scans{0};

    /// Under the directory's lock: makes room for `incoming` more bytes (least recently
    /// used copies first) and renames `tmp` (the caller's complete copy) to `final`.
    /// Returns 0 or the rename's errno.
    int place(std::uint64_t incoming, const std::string& tmp, const std::string& final) {
        auto rename_into_place = [&] { return ::rename(tmp.c_str(), final.c_str()) == 0 ? 0 : errno; };
        if (!o_.max_bytes) return rename_into_place();  // nothing to count: no lock, no scan
        std::lock_guard local(m_);  // flock is per open file: threads of this process queue here
        flock_guard lock(lock_fd_);
        const std::string keep = tmp.substr(tmp.find_last_of('/') + 1);
        bool scanned = false;
        auto rescan = [&] {
            scan(keep);
            scanned = true;
        };
        if (!scanned_once_ || std::chrono::steady_clock::now() - last_scan_ > o_.rescan_after) rescan();
        std::optional<std::uint64_t> total = read_total();
        if (!total) {  // written by no one yet (or damaged): count it
            rescan();
            total = read_total();
        }
        std::uint64_t used = total.value_or(0);
        // A copy of the same object already there (another process's) is replaced.
        auto replaced = [&] {
            struct stat st {};
            return ::lstat(final.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0;
        };
        std::uint64_t old = replaced();
        auto over = [&] { return used - std::min(used, old) + incoming > o_.max_bytes; };
        {
            std::lock_guard il(index_m_);
            forget(final);
        }
        while (over()) {
            std::optional<std::pair<std::string, std::uint64_t>> victim;
            bool look_again = false;
            {
                std::lock_guard il(index_m_);
                // The oldest copy this index knows. One used or made since the last scan
                // may be younger than copies other processes made since: look again first.
                if (!by_time_.empty() && (scanned || by_time_.begin()->first <= scan_started_ns_)) {
                    const auto [when, path] = *by_time_.begin();
                    struct stat st {};
                    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
                        forget(path);  // removed by another process (which counted it)
                        continue;
                    }
                    if (ns_of(st.st_mtim) > when) {  // hit by another process since the scan
                        remember(path, static_cast<std::uint64_t>(st.st_size), ns_of(st.st_mtim));
                        continue;
                    }
                    victim.emplace(path, static_cast<std::uint64_t>(st.st_size));
                    forget(path);
                } else {
                    look_again = !scanned;
                }
            }
            if (look_again) {
                rescan();
                used = read_total().value_or(0);
                old = replaced();
                std::lock_guard il(index_m_);
                forget(final);
                continue;
            }
            if (!victim) break;  // nothing left to evict (copies being written are not counted)
            if (::unlink(victim->first.c_str()) == 0) used -= std::min(used, victim->second);
            evictions.fetch_add(1, std::memory_order_relaxed);
        }
        const int err = rename_into_place();
        if (err == 0) {
            used = used - std::min(used, old) + incoming;
            std::lock_guard il(index_m_);
            remember(final, incoming, now_ns());
        }
        write_total(used);
        return err;
    }

private:
    struct flock_guard {
        int fd;
        explicit flock_guard(int f) : fd(f) {
            while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
            }
        }
        ~flock_guard() { ::flock(fd, LOCK_UN); }
        flock_guard(const flock_guard&) = delete;
        flock_guard& operator=(const flock_guard&) = delete;
    };
    struct entry {
        std::uint64_t bytes;
        std::int64_t mtime_ns;
    };
    static constexpr char total_magic[8] = {'s', 'l', 'u', 'i', 'c', 'e', 't', '1'};

    static std::int64_t ns_of(const struct timespec& t) noexcept {
        return std::int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
    }
    static std::int64_t steady_ns() noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
    static std::int64_t now_ns() noexcept {  // not before the file times the kernel gives
        struct timespec t {};
        ::clock_gettime(CLOCK_REALTIME, &t);
        return ns_of(t);
    }

    // The index (under index_m_).
    void forget(const std::string& path) {
        if (auto it = by_path_.find(path); it != by_path_.end()) {
            by_time_.erase({it->second.mtime_ns, path});
            by_path_.erase(it);
        }
    }
    void remember(const std::string& path, std::uint64_t bytes, std::int64_t mtime_ns) {
        forget(path);
        by_path_.emplace(path, entry{bytes, mtime_ns});
        by_time_.emplace(mtime_ns, path);
    }
    /// A hit: the copy is now the most recently used (added when another process made it).
    void touch(const std::string& path, std::uint64_t bytes) {
        std::lock_guard il(index_m_);
        if (scanned_once_) remember(path, bytes, now_ns());
    }

    /// The node-wide total of committed bytes, kept in the lock file (under its flock).
    std::optional<std::uint64_t> read_total() const {
        unsigned char b[16];
        if (::pread(lock_fd_, b, sizeof b, 0) != static_cast<ssize_t>(sizeof b) ||
            std::memcmp(b, total_magic, sizeof total_magic) != 0)
            return std::nullopt;
        std::uint64_t v = 0;
        for (int i = 7; i >= 0; --i) v = (v << 8) | b[8 + i];
        return v;
    }
    void write_total(std::uint64_t v) const {
        unsigned char b[16];
        std::memcpy(b, total_magic, sizeof total_magic);
        for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<unsigned char>(v >> (8 * i));
        [[maybe_unused]] const auto n = ::pwrite(lock_fd_, b, sizeof b, 0);  // a lost write: the next scan counts
    }

    /// Under the flock: one pass over the directory. Removes stale temporary files (not
    /// `keep`, the caller's own), rebuilds the index and writes the total.
    void scan(const std::string& keep) {
        std::unordered_map<std::string, entry> paths;
        std::set<std::pair<std::int64_t, std::string>> times;
        std::uint64_t used = 0;
        const auto now = std::chrono::system_clock::now();
        const auto started = now_ns();
        if (DIR* d = ::opendir(o_.dir.c_str())) {
            while (dirent* e = ::readdir(d)) {
                const std::string name = e->d_name;
                if (name == "." || name == ".." || name == ".lock") continue;
                const std::string path = o_.dir + "/" + name;
                struct stat st {};
                if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
                if (name.starts_with(".tmp-")) {
                    const auto age = now - std::chrono::system_clock::time_point(std::chrono::seconds(st.st_mtim.tv_sec));
                    if (name != keep && age > o_.stale_after) remove_stale(name);
                    continue;  // another writer's object in progress: counted when committed
                }
                const auto bytes = static_cast<std::uint64_t>(st.st_size);
                used += bytes;
                paths.emplace(path, entry{bytes, ns_of(st.st_mtim)});
                times.emplace(ns_of(st.st_mtim), path);
            }
            ::closedir(d);
        }
        write_total(used);
        {
            std::lock_guard il(index_m_);
            by_path_ = std::move(paths);
            by_time_ = std::move(times);
            scanned_once_ = true;
            scan_started_ns_ = started;
        }
        last_scan_ = std::chrono::steady_clock::now();
        scans.fetch_add(1, std::memory_order_relaxed);
    }

    /// A stale temporary file. A partial copy and its lock file go only when no one holds
    /// the lock (a download may outlast stale_after; its partial file is still touched, its
    /// lock file is not).
    void remove_stale(const std::string& name) {
        for (const char* kind : {".tmp-part-", ".tmp-lock-"}) {
            if (!name.starts_with(kind)) continue;
            const std::string rest = name.substr(std::strlen(kind));
            const std::string lock = o_.dir + "/.tmp-lock-" + rest;
            const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
            if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
                ::close(fd);
                return;  // being downloaded
            }
            ::unlink((o_.dir + "/.tmp-part-" + rest).c_str());
            ::unlink(lock.c_str());
            if (fd >= 0) ::close(fd);
            return;
        }
        ::unlink((o_.dir + "/" + name).c_str());
    }

    /// Removes a copy that failed its trailer check, unless another copy replaced it.
    void discard(const std::string& path, const struct stat& opened) {
        if (!o_.max_bytes) {
            ::unlink(path.c_str());
            return;
        }
        std::lock_guard local(m_);
        flock_guard lock(lock_fd_);
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || st.st_ino != opened.st_ino || st.st_dev != opened.st_dev) return;
        if (::unlink(path.c_str()) != 0) return;
        if (auto total = read_total()) write_total(*total - std::min<std::uint64_t>(*total, static_cast<std::uint64_t>(st.st_size)));
        std::lock_guard il(index_m_);
        forget(path);
    }

    cache_options o_;
    int lock_fd_ = -1;
    std::mutex m_;  // placement (and its scans) of this process, one at a time
    std::chrono::steady_clock::time_point last_scan_{};  // under m_
    std::mutex index_m_;  // the index: hits refresh it from other threads
    bool scanned_once_ = false;  // under index_m_ (written under m_ too)
    std::unordered_map<std::string, entry> by_path_;
    std::set<std::pair<std::int64_t, std::string>> by_time_;
    std::int64_t scan_started_ns_ = 0;  // wall clock, as file times are
    std::atomic<bool> warned_{false};
    std::atomic<std::int64_t> failed_at_ns_{0};  // steady clock: the last copy that failed
};

}  // namespace detail
}  // namespace sluice
