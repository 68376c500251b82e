#pragma once
// sluice::detail::file_mapping: a file mapped read-only, whose pages records refer to in
// place (no copy), with two guarantees a plain mmap lacks:
//
// - Memory is what is held. Pages are pinned in blocks by the buffers that view them;
//   a block no buffer views any more is dropped from the process (MADV_DONTNEED: the page
//   cache keeps the data, our resident set forgets it), in sweeps once a mapping has
//   `sweep_bytes` of such blocks (see unpin). So a shuffle buffer holding one
//   record of each of many 4 MiB windows costs those records' pages, not the windows.
// - A file that shrinks while mapped does not kill the process. Touching a page past the
//   new end raises SIGBUS; sluice's handler (installed once, chained to any handler that
//   was there before, for faults outside our mappings) maps zero pages over the lost
//   part and marks the mapping `lost`. The stages that read mapped bytes (the parsers,
//   batch's collation) check the mark after they read and fail with a sluice::source_error
//   naming the file and the offset from which bytes were lost, instead of passing on the
//   zeros. Bytes a user's own function read before such a check are zeros, not garbage:
//   sluice reports the loss at the next check (bench/RESULTS.md, issue 17; README).
//
// A mapping opened `by_call` also keeps the file open, or, past the descriptors the
// process can spare, its path (opened again to read, where it still leads to the same
// file; else the bytes are read through the mapping, which holds the file as a
// descriptor would): its pages are meant never to be touched through the mapping (the
// reader does not populate them). The parsers read their headers, and batch's
// collation the records, with pread (read_at), a copy from the page cache that maps no
// page into the process. Where a VM makes each page mapped
// into a process dear (a fault about 20 us, a populated page 1.7-2.4 us: bench/RESULTS.md,
// issue 17, "Shards read by call"), that took a shuffle of tar shards from 1.04 s to
// 0.34 s (`cat`: 0.22-0.33 s). Bytes read through the mapping all the same still work
// (they fault in as for any mapping) and stay resident until it is unmapped.

#include <sluice/core/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

/// Where a fault inside a mapping is recognised: one slot per live mapping. Written by
/// the threads that map and unmap, read by the SIGBUS handler (lock-free atomics only).
struct mapping_slot {
    std::atomic<std::uintptr_t> begin{0};  // 0: free
    std::atomic<std::uintptr_t> end{0};
    std::atomic<std::atomic<std::uint64_t>*> lost{nullptr};  // the mapping's first lost offset
};

struct mapping_registry {
    static constexpr std::size_t slots = 1u << 16;
    mapping_slot slot[slots];
    std::atomic<std::size_t> hint{0};
    struct sigaction previous {};
    std::atomic<bool> installed{false};

    static mapping_registry& get() {
        static mapping_registry r;  // never destroyed before the mappings: static storage
        return r;
    }
};

inline void on_sigbus(int sig, siginfo_t* si, void* ctx) {
    auto& reg = mapping_registry::get();
    const auto a = reinterpret_cast<std::uintptr_t>(si->si_addr);
    if (si->si_code == BUS_ADRERR) {
        for (auto& s : reg.slot) {
            const std::uintptr_t b = s.begin.load(std::memory_order_acquire);
            if (b <= 1 || a < b) continue;  // free, or being claimed
            const std::uintptr_t e = s.end.load(std::memory_order_acquire);
            std::atomic<std::uint64_t>* lost = s.lost.load(std::memory_order_acquire);
            // The slot read whole: not freed and taken by another mapping meanwhile.
            if (a >= e || !lost || s.begin.load(std::memory_order_acquire) != b) continue;
            // Ours: zero pages from the faulting page to the mapping's end, so the access
            // that faulted (and the ones after) read zeros, and the mark says from where.
            const std::uintptr_t page = a & ~(static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)) - 1);
            void* z = ::mmap(reinterpret_cast<void*>(page), e - page, PROT_READ,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (z == MAP_FAILED) break;
            std::uint64_t seen = lost->load(std::memory_order_relaxed);
            const std::uint64_t off = page - b;
            while (off < seen && !lost->compare_exchange_weak(seen, off)) {
            }
            return;
        }
    }
    // Not ours: what the process had before sluice's handler.
    const struct sigaction& old = reg.previous;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) return old.sa_sigaction(sig, si, ctx);
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
        return old.sa_handler(sig);
    // The default (or ignored, which a fault cannot be): restore the default and raise
    // again, which ends the process as it would have without sluice.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGBUS, &dfl, nullptr);
    ::raise(SIGBUS);
}

/// Installs the handler once per process. False when it could not be.
inline bool install_sigbus_handler() {
    auto& reg = mapping_registry::get();
    static const bool ok = [&] {
        struct sigaction sa {};
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (::sigaction(SIGBUS, &sa, &reg.previous) != 0) return false;
        reg.installed.store(true);
        return true;
    }();
    return ok;
}

/// Where a file read by call is opened again past the spare descriptors: its path in the
/// file system, and the file (device, inode: the caller's fstat of it) that path must
/// still lead to (file_mapping::open).
struct file_reopen {
    std::string path;
    dev_t dev = 0;
    ino_t ino = 0;
};

class file_mapping {
public:
    /// Bytes per pinned block (16 KiB, or the page size where pages are larger): a record
    /// pins at most two blocks beyond its own pages.
    static std::size_t block_bytes() noexcept {
        static const std::size_t b = std::max<std::size_t>(16u << 10, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
        return b;
    }
    static constexpr std::uint64_t none_lost = ~std::uint64_t{0};

    /// Maps `size` bytes of the open file `fd` (named `path`), or returns null when it
    /// cannot (mmap failed, no registry slot, no SIGBUS handler): the caller reads instead.
    /// `by_call`: read it with read_at (see above): the file kept open where the process
    /// has descriptors to spare (a quarter of its RLIMIT_NOFILE as it is now, at most
    /// 4,096, are kept at once), else opened again at each read_at as `again` says (an
    /// empty path: not by call past the descriptors). by_call() says whether it is read
    /// by call.
    static std::shared_ptr<file_mapping> open(int fd, std::size_t size, std::string path, bool by_call = false,
                                              file_reopen again = {}) {
        if (size == 0 || !install_sigbus_handler()) return nullptr;
        auto& reg = mapping_registry::get();
        // Not populated here: each window is, when read sends it (populate), so a file of
        // many GB costs the windows in flight, not its size.
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) return nullptr;
        std::shared_ptr<file_mapping> m(new file_mapping(static_cast<std::byte*>(p), size, std::move(path)));
        m->self_ = m;
        if (by_call && kept_fds().fetch_add(1, std::memory_order_relaxed) < fd_cap()) {
            m->fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
            if (m->fd_ < 0) kept_fds().fetch_sub(1, std::memory_order_relaxed);
        } else if (by_call) {
            kept_fds().fetch_sub(1, std::memory_order_relaxed);
        }
        if (by_call && m->fd_ < 0 && !again.path.empty()) {
            bool absolute = again.path.front() == '/';
            if (!absolute) {  // a later chdir must not move it
                char cwd[4096];
                absolute = ::getcwd(cwd, sizeof cwd) != nullptr;
                if (absolute) again.path = std::string(cwd) + "/" + again.path;
            }
            if (absolute) m->again_ = std::move(again);  // else not by call: populated as read sends it
        }
        const std::size_t start = reg.hint.fetch_add(1, std::memory_order_relaxed);
        for (std::size_t i = 0; i < mapping_registry::slots; ++i) {
            auto& s = reg.slot[(start + i) % mapping_registry::slots];
            std::uintptr_t expect = 0;
            if (s.begin.load(std::memory_order_relaxed) != 0) continue;
            // Claimed with a sentinel first, so the handler never sees a half-written slot.
            if (!s.begin.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) continue;
            s.lost.store(&m->lost_, std::memory_order_release);
            s.end.store(reinterpret_cast<std::uintptr_t>(p) + size, std::memory_order_release);
            s.begin.store(reinterpret_cast<std::uintptr_t>(p), std::memory_order_release);
            m->slot_ = &s;
            if (!m->by_call()) ::madvise(p, size, MADV_SEQUENTIAL);  // by call: no page is touched
            return m;
        }
        return nullptr;  // unmapped by the destructor
    }

    file_mapping(const file_mapping&) = delete;
    file_mapping& operator=(const file_mapping&) = delete;
    ~file_mapping() {
        if (slot_) {
            slot_->begin.store(0, std::memory_order_release);
            slot_->end.store(0, std::memory_order_release);
            slot_->lost.store(nullptr, std::memory_order_release);
        }
        ::munmap(base_, size_);
        if (fd_ >= 0) {
            ::close(fd_);
            kept_fds().fetch_sub(1, std::memory_order_relaxed);
        }
    }

    std::byte* data() const noexcept { return base_; }
    std::size_t size() const noexcept { return size_; }
    const std::string& path() const noexcept { return path_; }
    /// The offset from which the file's bytes were lost (it shrank while mapped), or
    /// none_lost.
    std::uint64_t lost() const noexcept { return lost_.load(std::memory_order_acquire); }
    /// Marks the bytes from `offset` on as lost (the file was seen to shrink to `offset`).
    void mark_lost(std::uint64_t offset) const noexcept {
        std::uint64_t seen = lost_.load(std::memory_order_relaxed);
        while (offset < seen && !lost_.compare_exchange_weak(seen, offset)) {
        }
    }

    /// Maps the pages of [off, off + n) in now, in one system call, rather than one fault
    /// per few pages as they are first read (MADV_POPULATE_READ, Linux >= 5.14; older
    /// kernels fault them in as read). A range past the file's end is left to fault.
    void populate(std::size_t off, std::size_t n) const noexcept {
#ifndef MADV_POPULATE_READ
        constexpr int MADV_POPULATE_READ = 22;
#endif
        if (n == 0) return;
        const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), from = off / page * page;
        ::madvise(base_ + from, off + n - from, MADV_POPULATE_READ);
    }

    /// Whether the file is read with read_at (kept open, or opened again by its path),
    /// and the mapping's pages left untouched.
    bool by_call() const noexcept { return fd_ >= 0 || !again_.path.empty(); }
    /// The file kept open for read_at (-1 where it is not: not by call, or by its path).
    int fd() const noexcept { return fd_; }
    /// The error of read_at's first failed pread (0: none; bytes lost by a read that came
    /// back short were lost to a file that shrank).
    int read_error() const noexcept { return read_errno_.load(std::memory_order_acquire); }
    /// Copies the file's bytes [off, off + n) to `d` with pread (by_call() only). Bytes
    /// the file no longer has (it shrank, or a read failed: read_error()) are zeros and
    /// marked lost from there, as a fault in the mapping would: the same checks then
    /// report them (throw_lost).
    ///
    /// By its path, it reads what a descriptor kept open would: the path opened again
    /// (about 5 us a call more; non-blocking, so a FIFO put there cannot hold the caller)
    /// where it still leads to the same file (device and inode: a file written in place
    /// reads as written, as through a kept descriptor); where it does not (the file was
    /// replaced or removed, or cannot be opened now: no descriptor left), the bytes are
    /// copied through the mapping, which still holds the file the reader opened, its pages
    /// then mapped in (a shrink there faults, and is marked lost, as for any mapping).
    void read_at(std::byte* d, std::size_t off, std::size_t n) const noexcept {
        if (fd_ >= 0 || n == 0) return read_from(fd_, d, off, n);
        const int fd = ::open(again_.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        struct stat st {};
        if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_dev == again_.dev && st.st_ino == again_.ino) {
            read_from(fd, d, off, n);
        } else {
            const std::size_t k = off < size_ ? std::min(n, size_ - off) : 0;
            if (k) std::memcpy(d, base_ + off, k);  // SIGBUS past a new end: zeros, marked (on_sigbus)
            if (k < n) {
                std::memset(d + k, 0, n - k);
                mark_lost(off + k);
            }
        }
        if (fd >= 0) ::close(fd);
    }

    void pin(std::size_t off, std::size_t n) noexcept {
        if (n == 0) return;
        for (std::size_t b = off / block_bytes(), e = (off + n - 1) / block_bytes(); b <= e; ++b)
            pins_[b].fetch_add(1, std::memory_order_relaxed);
    }
    /// `last_owner`: no other buffer views the mapping (it is about to be unmapped whole,
    /// so dropping blocks would be wasted system calls).
    ///
    /// Blocks no buffer views are dropped in sweeps, not one by one, and not by the thread
    /// that lets them go (batch, the stage a pipeline of mapped files waits on): each drop
    /// makes the kernel flush the TLBs of every thread of the process, which, done per
    /// record on batch's thread, cost a shuffle about a sixth of its rate (bench/RESULTS.md,
    /// issue 17). Once a mapping has `sweep_bytes` of idle blocks it is queued, and the next
    /// read of a window (any file's) sweeps the queue (sweep_pending).
    void unpin(std::size_t off, std::size_t n, bool last_owner) noexcept {
        if (n == 0) return;
        if (by_call()) {  // nothing was mapped in to drop (what was read through the mapping anyway stays till unmapped)
            for (std::size_t b = off / block_bytes(), e = (off + n - 1) / block_bytes(); b <= e; ++b)
                pins_[b].fetch_sub(1, std::memory_order_relaxed);
            return;
        }
        std::size_t idle = 0;
        for (std::size_t b = off / block_bytes(), e = (off + n - 1) / block_bytes(); b <= e; ++b)
            if (pins_[b].fetch_sub(1, std::memory_order_acq_rel) == 1) {
                idle_[b].store(true, std::memory_order_relaxed);
                ++idle;
            }
        if (last_owner || idle == 0) return;
        if (idle_blocks_.fetch_add(idle, std::memory_order_acq_rel) + idle < sweep_bytes / block_bytes()) return;
        if (queued_.exchange(true, std::memory_order_acq_rel)) return;
        auto& q = sweep_queue::get();
        try {
            std::lock_guard lock(q.m);
            q.maps.push_back(self_);
        } catch (...) {  // no memory for the queue: sweep here
            queued_.store(false);
            sweep();
        }
    }

    /// Sweeps the mappings queued by unpin.
    static void sweep_pending() {
        auto& q = sweep_queue::get();
        std::vector<std::weak_ptr<file_mapping>> todo;
        {
            std::lock_guard lock(q.m);
            if (q.maps.empty()) return;
            todo.swap(q.maps);
        }
        for (auto& w : todo)
            if (auto m = w.lock()) {
                m->queued_.store(false, std::memory_order_release);
                m->sweep();
            }
    }

    /// Idle bytes a mapping keeps resident before it sweeps them out.
    static constexpr std::size_t sweep_bytes = 4u << 20;

private:
    void read_from(int fd, std::byte* d, std::size_t off, std::size_t n) const noexcept {
        std::size_t got = 0;
        while (got < n && off + got < size_) {
            const ssize_t k = ::pread(fd, d + got, std::min(n - got, size_ - off - got), static_cast<off_t>(off + got));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) {
                int none = 0;
                read_errno_.compare_exchange_strong(none, errno);
            }
            if (k <= 0) break;
            got += static_cast<std::size_t>(k);
        }
        if (got < n) {
            std::memset(d + got, 0, n - got);
            mark_lost(off + got);
        }
    }
    static std::atomic<std::size_t>& kept_fds() {
        static std::atomic<std::size_t> n{0};
        return n;
    }
    /// Read at each file mapped by call (one system call), so a limit raised or lowered
    /// while the process runs counts from its next file on.
    static std::size_t fd_cap() {
        rlimit r{};
        if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return std::size_t{256};
        if (r.rlim_cur == RLIM_INFINITY) return std::size_t{4096};
        return std::min<std::size_t>(4096, static_cast<std::size_t>(r.rlim_cur) / 4);
    }
    struct sweep_queue {
        std::mutex m;
        std::vector<std::weak_ptr<file_mapping>> maps;
        static sweep_queue& get() {
            static auto* q = new sweep_queue;  // never destroyed: mappings may die at exit
            return *q;
        }
    };
    void sweep() noexcept {
        idle_blocks_.store(0, std::memory_order_relaxed);
        iovec runs[64];
        std::size_t n = 0;
        std::size_t run_begin = 0, run_end = 0;  // idle blocks, as one range
        auto add = [&](std::size_t b, std::size_t e) {
            if (b == e) return;
            const std::size_t from = b * block_bytes(), to = std::min(e * block_bytes(), size_);
            runs[n++] = {base_ + from, to - from};
            if (n == std::size(runs)) drop(runs, std::exchange(n, 0));
        };
        for (std::size_t b = 0, blocks = (size_ + block_bytes() - 1) / block_bytes(); b < blocks; ++b) {
            // A block pinned again since it went idle is in use (a drop would only cost a
            // refault: the mapping is private and read-only, so the data comes back from
            // the page cache); skip it.
            if (!idle_[b].load(std::memory_order_relaxed) || pins_[b].load(std::memory_order_acquire) != 0) continue;
            idle_[b].store(false, std::memory_order_relaxed);
            if (run_end != b) {
                add(run_begin, run_end);
                run_begin = b;
            }
            run_end = b + 1;
        }
        add(run_begin, run_end);
        drop(runs, n);
    }
    /// MADV_DONTNEED on each range: in one process_madvise call where the kernel takes
    /// it for the calling process (Linux >= 6.13 accepts any advice there, and since 6.16
    /// flushes the TLBs once per call instead of once per range), else one madvise each.
    static void drop(const iovec* runs, std::size_t n) noexcept {
        if (n == 0) return;
#if defined(SYS_process_madvise) && defined(SYS_pidfd_open)
        static const pid_t pid = ::getpid();  // a forked child has another: its drops go one by one
        static const int self = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // close-on-exec
        static std::atomic<bool> batched{true};
        if (self >= 0 && batched.load(std::memory_order_relaxed) && ::getpid() == pid) {
            const long r = ::syscall(SYS_process_madvise, self, runs, n, MADV_DONTNEED, 0u);
            std::size_t done = r > 0 ? static_cast<std::size_t>(r) : 0, i = 0;
            if (r >= 0) {
                while (i < n && done >= runs[i].iov_len) done -= runs[i++].iov_len;
                drop_each(runs + i, n - i);  // what a short count left (nothing, normally)
                return;
            }
            if (errno == EINVAL || errno == ENOSYS || errno == EPERM) batched.store(false, std::memory_order_relaxed);
        }
#endif
        drop_each(runs, n);
    }
    static void drop_each(const iovec* runs, std::size_t n) noexcept {
        for (std::size_t i = 0; i < n; ++i) ::madvise(runs[i].iov_base, runs[i].iov_len, MADV_DONTNEED);
    }

    file_mapping(std::byte* base, std::size_t size, std::string path)
        : base_(base),
          size_(size),
          path_(std::move(path)),
          pins_(new std::atomic<std::uint32_t>[(size + block_bytes() - 1) / block_bytes()]),
          idle_(new std::atomic<bool>[(size + block_bytes() - 1) / block_bytes()]) {
        for (std::size_t i = 0, n = (size + block_bytes() - 1) / block_bytes(); i < n; ++i) {
            pins_[i].store(0, std::memory_order_relaxed);
            idle_[i].store(false, std::memory_order_relaxed);
        }
    }

    std::byte* base_;
    std::size_t size_;
    std::string path_;
    std::unique_ptr<std::atomic<std::uint32_t>[]> pins_;
    std::unique_ptr<std::atomic<bool>[]> idle_;  // went unpinned since the last sweep
    std::atomic<std::size_t> idle_blocks_{0};
    std::atomic<bool> queued_{false};
    std::weak_ptr<file_mapping> self_;
    mutable std::atomic<std::uint64_t> lost_{none_lost};
    mutable std::atomic<int> read_errno_{0};
    mapping_slot* slot_ = nullptr;
    int fd_ = -1;  // by_call: the file, kept open
    file_reopen again_;  // by call past the descriptors: opened again at each read_at
};

/// Bytes of the mapped file `path` from `offset` on were lost while sluice read them (it
/// shrank): the error every check throws. `record`: the record that held zeros, if known.
[[noreturn]] inline void throw_lost(const std::string& path, std::uint64_t offset, const std::string& record = {}) {
    throw source_error(path,
                       "the file shrank while it was read (mapped), so its bytes from this offset on were lost" +
                           (record.empty() ? std::string() : " (record " + record + ")") + ":",
                       std::make_error_code(std::errc::io_error), offset);
}

/// The same for the mapping `f`, whose mark says from where: where a by-call read failed
/// (file_mapping::read_error), the error names that failure instead of a shrunk file.
[[noreturn]] inline void throw_lost(const file_mapping& f, const std::string& record = {}) {
    if (const int e = f.read_error())
        throw source_error(f.path(), "cannot read" + (record.empty() ? std::string() : " (record " + record + ")") + ":",
                           std::error_code(e, std::generic_category()), f.lost());
    throw_lost(f.path(), f.lost(), record);
}

}  // namespace sluice::detail
