#pragma once
// The request limit of a node: one AIMD limit and one 503 back-off shared by every process
// that names the same directory (fetch_options::shared_limit), so eight ranks behind one
// NIC answer a 503 storm once, not eight times, and their floors do not add up.
//
// The state is a small file, "<dir>/.sluice-requests", mapped shared by each process
// (MAP_SHARED; lock-free atomics only, so a process killed at any instruction leaves
// nothing locked):
//  - the node's limit (AIMD: halved once per round of requests on 503/429, +1/limit on
//    success, between the smallest floor and the largest ceiling the processes give),
//  - the requests in flight across the node, and each process's own share of them in a
//    slot named by its pid,
//  - a shared back-off deadline: after a halving no process starts a request for
//    `quiet` (fetch's backoff_base), as one process alone waits before its retry.
// Cleanup after a crash: a slot whose pid no longer exists (kill(pid, 0) gives ESRCH) is
// reclaimed by the next process that finds the node full, and its requests leave the count;
// a process attaching when no slot is alive starts the file afresh. The file stays (4 KiB);
// remove it by hand once no process uses the directory. The processes must share a pid
// namespace (a container of its own sees other pids as dead); a pid reused by an unrelated
// process keeps its slot's count until that process exits.

#include <sluice/core/error.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <system_error>

namespace sluice::detail {

class node_limit {
public:
    static constexpr const char* file_name = ".sluice-requests";
    static constexpr unsigned slot_count = 248;

    /// Attaches to (or creates) the shared limit in `dir`. This process may keep at most
    /// `ceiling` requests in flight; the node's limit rises to the largest ceiling of the
    /// processes attached and falls no lower than the smallest `floor`.
    node_limit(const std::string& dir, unsigned ceiling, unsigned floor, std::chrono::milliseconds quiet)
        : quiet_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(quiet).count()) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        path_ = dir + "/" + file_name;
        if (ec) throw source_error(dir, "cannot create the directory of the shared request limit", ec);
        fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw source_error(path_, "cannot open the shared request limit", {errno, std::generic_category()});
        while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
        }
        struct unlock {
            int fd;
            ~unlock() { ::flock(fd, LOCK_UN); }  // a no-op on a closed descriptor's error paths (unlocked there)
        } unlock_at_end{fd_};
        struct stat st {};
        if (::fstat(fd_, &st) != 0 || (st.st_size < static_cast<off_t>(file_size) && ::ftruncate(fd_, file_size) != 0)) {
            const int err = errno;
            ::flock(fd_, LOCK_UN);  // before the descriptor's number can be reused
            ::close(fd_);
            throw source_error(path_, "cannot size the shared request limit", {err, std::generic_category()});
        }
        void* p = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::flock(fd_, LOCK_UN);
            ::close(fd_);
            throw source_error(path_, "cannot map the shared request limit", {err, std::generic_category()});
        }
        s_ = static_cast<shared*>(p);
        ceiling = std::max(1u, ceiling);
        floor = std::clamp(floor, 1u, ceiling);
        // Under the file's lock: no other process attaches meanwhile (requests go on).
        bool alive = false;
        if (std::memcmp(s_->magic, magic, sizeof magic) == 0) {
            for (auto& sl : s_->slots) {
                reclaim_if_dead(sl);
                alive = alive || sl.pid.load() > 0;
            }
        }
        if (!alive) {  // the first process, or every one before has ended: start afresh
            std::memset(static_cast<void*>(s_), 0, file_size);
            s_->ceiling.store(ceiling);
            s_->floor.store(floor);
            s_->limit_fx.store(std::uint64_t{ceiling} << fx);
            std::memcpy(s_->magic, magic, sizeof magic);
            fresh_ = true;
        } else {
            for (auto c = s_->ceiling.load(); c < ceiling && !s_->ceiling.compare_exchange_weak(c, ceiling);) {
            }
            for (auto f = s_->floor.load(); f > floor && !s_->floor.compare_exchange_weak(f, floor);) {
            }
        }
        const auto me = static_cast<std::int32_t>(::getpid());
        for (auto& sl : s_->slots) {
            std::int32_t free = 0;
            if (sl.pid.compare_exchange_strong(free, me)) {
                sl.in_flight.store(0);
                slot_ = &sl;
                break;
            }
        }
        if (!slot_) {
            ::munmap(s_, file_size);
            ::flock(fd_, LOCK_UN);
            ::close(fd_);
            throw source_error(path_, "cannot share the request limit: " + std::to_string(slot_count) +
                                          " processes already use");
        }
    }
    ~node_limit() {
        // Requests this process still counts (none once its workers have ended) leave.
        drop(slot_->in_flight.exchange(0));
        slot_->pid.store(0);
        ::munmap(s_, file_size);
        ::close(fd_);
    }
    node_limit(const node_limit&) = delete;
    node_limit& operator=(const node_limit&) = delete;

    const std::string& path() const noexcept { return path_; }
    /// Whether this process started the file afresh (no other process was attached).
    bool fresh() const noexcept { return fresh_; }

    /// A permit if the node has one free and is not backing off; `seq` gets the node's
    /// sequence number of the request (for release).
    bool try_take(std::uint64_t* seq) {
        if (now_ns() < s_->quiet_until.load()) return false;
        slot_->in_flight.fetch_add(1);  // before the count: a crash between over-frees, never leaks
        for (auto a = s_->active.load();;) {
            if (a >= allowed()) {
                drop_slot();
                reclaim_dead();
                return false;
            }
            if (s_->active.compare_exchange_weak(a, a + 1)) break;
        }
        *seq = s_->next_seq.fetch_add(1);
        return true;
    }
    /// A permit over the limit (see aimd_limit on when), counted all the same.
    void take_forced(std::uint64_t* seq) {
        slot_->in_flight.fetch_add(1);
        s_->active.fetch_add(1);
        *seq = s_->next_seq.fetch_add(1);
    }
    /// A request ended: 503/429 halves the node's limit once per round (not again for
    /// requests started before the last halving) and holds every process back for
    /// `quiet`; a success adds 1/limit.
    void release(std::uint64_t seq, bool ok, bool throttled) {
        drop(1);  // the node's count first: a crash between over-frees (reclaim drops the slot's), never leaks
        drop_slot();
        if (throttled) {
            s_->throttled.fetch_add(1);
            for (auto r = s_->round.load(); seq >= r;) {
                if (!s_->round.compare_exchange_weak(r, s_->next_seq.load())) continue;
                const std::uint64_t lowest = std::uint64_t{s_->floor.load()} << fx;
                for (auto l = s_->limit_fx.load(); !s_->limit_fx.compare_exchange_weak(l, std::max(lowest, l / 2));) {
                }
                s_->halvings.fetch_add(1);
                const std::int64_t until = now_ns() + quiet_ns_;
                for (auto q = s_->quiet_until.load(); q < until && !s_->quiet_until.compare_exchange_weak(q, until);) {
                }
                break;
            }
        } else if (ok) {
            const std::uint64_t highest = std::uint64_t{s_->ceiling.load()} << fx;
            for (auto l = s_->limit_fx.load();;) {
                const std::uint64_t up = std::min(highest, l + (std::uint64_t{1} << (2 * fx)) / std::max<std::uint64_t>(l, 1));
                if (s_->limit_fx.compare_exchange_weak(l, up)) break;
            }
        }
    }
    /// The node's limit now (at least 1).
    unsigned allowed() const {
        return std::max(1u, static_cast<unsigned>(std::min<std::uint64_t>(s_->limit_fx.load() >> fx, s_->ceiling.load())));
    }
    /// Requests in flight across the node.
    unsigned active() const { return s_->active.load(); }
    /// 503/429 answers every process has seen, and the halvings they caused.
    std::uint64_t throttled() const { return s_->throttled.load(); }
    std::uint64_t halvings() const { return s_->halvings.load(); }
    /// How long the node still backs off (zero when not).
    std::chrono::nanoseconds quiet_left() const {
        return std::chrono::nanoseconds(std::max<std::int64_t>(0, s_->quiet_until.load() - now_ns()));
    }
    /// Processes attached (live slots).
    unsigned processes() const {
        unsigned n = 0;
        for (auto& sl : s_->slots) n += sl.pid.load() > 0;
        return n;
    }

private:
    static constexpr char magic[8] = {'s', 'l', 'u', 'i', 'c', 'e', 'r', '1'};
    static constexpr unsigned fx = 16;  // the limit in fixed point: limit × 2^16
    static constexpr std::size_t file_size = 4096;
    struct slot {
        std::atomic<std::int32_t> pid;  // 0: free; -1: being reclaimed
        std::atomic<std::uint32_t> in_flight;
    };
    struct shared {
        char magic[8];
        std::atomic<std::uint64_t> limit_fx;
        std::atomic<std::uint32_t> ceiling, floor;
        std::atomic<std::uint32_t> active;
        std::atomic<std::uint32_t> pad;
        std::atomic<std::uint64_t> next_seq, round;
        std::atomic<std::int64_t> quiet_until;  // CLOCK_MONOTONIC, one clock for the whole boot
        std::atomic<std::uint64_t> throttled, halvings;
        slot slots[slot_count];
    };
    static_assert(sizeof(shared) <= file_size);
    static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::int32_t>::is_always_lock_free,
                  "processes share these atomics: they must not hide a lock");

    static std::int64_t now_ns() noexcept {
        struct timespec t {};
        ::clock_gettime(CLOCK_MONOTONIC, &t);
        return std::int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
    }
    void drop(std::uint32_t n) {  // never below zero (a count a crash left short)
        for (auto a = s_->active.load(); n && !s_->active.compare_exchange_weak(a, a - std::min(a, n));) {
        }
    }
    void drop_slot() {
        for (auto a = slot_->in_flight.load(); a && !slot_->in_flight.compare_exchange_weak(a, a - 1);) {
        }
    }
    /// A slot whose process is gone: its requests leave the node's count, the slot is free.
    void reclaim_if_dead(slot& sl) {
        std::int32_t pid = sl.pid.load();
        if (pid <= 0 || (::kill(pid, 0) != 0 ? errno != ESRCH : true)) return;
        if (!sl.pid.compare_exchange_strong(pid, -1)) return;  // another process reclaims it
        drop(sl.in_flight.exchange(0));
        sl.pid.store(0);
    }
    void reclaim_dead() {  // at most every 100 ms: kill(pid, 0) for each slot
        const auto now = now_ns();
        if (now - last_reclaim_ns_ < 100'000'000) return;
        last_reclaim_ns_ = now;
        for (auto& sl : s_->slots) reclaim_if_dead(sl);
    }

    std::string path_;
    int fd_ = -1;
    shared* s_ = nullptr;
    slot* slot_ = nullptr;
    std::int64_t quiet_ns_;
    std::int64_t last_reclaim_ns_ = 0;  // only under aimd_limit's mutex (every call is)
    bool fresh_ = false;
};

}  // namespace sluice::detail
