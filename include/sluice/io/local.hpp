#pragma once
// sluice::read: local files, read in large chunks into recycled buffers.

#include <sluice/core/detail/shard_counting.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>

namespace sluice {

struct read_options {
    /// Bytes per chunk (and per read system call batch). 1-8 MiB keeps system-call
    /// overhead negligible and chunks few; records are slices of chunks.
    std::size_t chunk_size = 4u << 20;
    /// Files read at once. With more than one, chunks of different files interleave (each
    /// file's chunks stay in order), which decoders handle. Reads are blocking, so several
    /// files are read in parallel only on the CPU pool (`.on = pool::cpu`); on the I/O
    /// loop, its one thread takes turns.
    unsigned concurrency = 1;
    /// With several files in flight: ordered delivers each file whole, in plan order (each
    /// file reads ahead one chunk while it waits its turn), which a deterministic pipeline
    /// needs; unordered interleaves their chunks as they are read.
    ordering order = ordering::unordered;
    /// Where the blocking reads run. The I/O loop by default: page-cache reads take
    /// microseconds per chunk. The CPU pool for slow or network file systems, where a read
    /// that blocks would hold up the loop.
    pool on = pool::io;
    /// Map each regular file into memory instead of reading it (the default): chunks, and
    /// the records sliced from them, are views of the page cache, so no byte is copied
    /// before batch's collation and no fresh memory is touched (bench/RESULTS.md, issue
    /// 17: a shuffle of 10,000 records went from 0.15 to ~0.9 x cat). Held records pin
    /// only their own pages (detail::file_mapping). A file that shrinks while mapped does
    /// not end the process with SIGBUS: sluice's handler puts zeros in place of the lost
    /// pages, and the parsers and batch then fail with a sluice::source_error naming the
    /// file and the offset. `false`: read with pread into recycled buffers (one kernel
    /// copy, and a shuffle copies small records out of their chunks). Where a file cannot
    /// be mapped (not a regular file, mmap refused) it is read.
    bool map = true;
    /// With `map`, files smaller than this are read with pread all the same, unless a
    /// stage after read holds records (a shuffle of records or samples): a small file's
    /// map, populate and unmap cost more than one copy into a recycled, already-faulted
    /// buffer when its records go on at once (10,240 raw files of 100 KiB, unshuffled:
    /// 1.86-1.92 x cat read, 1.45 mapped, bench/RESULTS.md issue 17), while records a
    /// shuffle holds would each pin fresh memory where a mapping pins the page cache.
    /// 0: map every file.
    std::uint64_t map_min_bytes = 1u << 20;
    /// Capacity of the output channel, in chunks and bytes.
    channel_limits out = {16, 64u << 20};
};

namespace detail {
class fd_guard {
public:
    explicit fd_guard(int fd) : fd_(fd) {}
    ~fd_guard() {
        if (fd_ >= 0) ::close(fd_);
    }
    fd_guard(const fd_guard&) = delete;
    fd_guard& operator=(const fd_guard&) = delete;
    int get() const noexcept { return fd_; }

private:
    int fd_;
};

inline std::error_code errno_code() { return {errno, std::generic_category()}; }

/// An ordered stage's turn (see turnstile): a worker holding ticket `ticket` sends its
/// first output only once the items before it are done. Unordered: always its turn.
struct turn_gate {
    turnstile* turn = nullptr;
    std::uint64_t ticket = 0;
    bool mine = true;
    turn_gate(turnstile* t, std::uint64_t k) : turn(t), ticket(k), mine(t == nullptr) {}
    /// Before each send.
    template <class = void>  // a coroutine: compiled only where used
    task<void> wait() {
        if (!mine) {
            co_await turn->wait(ticket);
            mine = true;
        }
    }
    /// After the item's last output.
    void done() {
        if (turn) turn->done(ticket);
    }
};

/// `file:///data/x.tar` is the path `/data/x.tar`.
inline std::string local_path(const std::string& url) {
    return url.compare(0, 7, "file://") == 0 ? url.substr(7) : url;
}

/// Sends the open file `fd` (named `path` in messages) as chunks of `chunk_size` bytes,
/// named as `src` (the shard the bytes belong to: the file itself, or a cached copy of a
/// remote object). `length`: bytes to send (a cached copy ends in a trailer), or all.
/// `by_call`: which mapped files (by url and first bytes) the stages after read leave
/// unread but for headers (detail::headers_only_after): those are mapped by_call, their
/// windows not populated (file_mapping; a shuffle of small files holds thousands, each
/// kept open while the process has descriptors to spare, past that opened again by its
/// path when batch reads it).
template <class = void>  // a coroutine: compiled only where used (see make_stage)
task<void> read_file(stage_context<shard, chunk>& ctx, std::shared_ptr<const shard> src, const std::string& path,
                            const fd_guard& fd, std::size_t chunk_size, bool map, turn_gate& gate,
                            std::uint64_t length = ~0ull, std::uint64_t map_from = 0,
                            const passes_untouched& by_call = nullptr) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw source_error(path, "cannot stat", errno_code());
    if (S_ISDIR(st.st_mode)) throw source_error(path, "cannot read", std::make_error_code(std::errc::is_a_directory));
    if (S_ISREG(st.st_mode) && length != ~0ull) st.st_size = static_cast<off_t>(std::min<std::uint64_t>(length, st.st_size));
    std::shared_ptr<file_mapping> mapped;
    if (map && S_ISREG(st.st_mode) && st.st_size > 0 && static_cast<std::uint64_t>(st.st_size) >= map_from) {
        bool call = false;
        if (by_call) {
            std::byte head[3] = {};
            const ssize_t k = ::pread(fd.get(), head, sizeof head, 0);
            call = k >= 0 && by_call(src->url, std::span<const std::byte>(head, static_cast<std::size_t>(k)));
        }
        mapped = file_mapping::open(fd.get(), static_cast<std::size_t>(st.st_size), path, call,
                                    call ? file_reopen{local_path(path), st.st_dev, st.st_ino} : file_reopen{});
        if (mapped && mapped->by_call()) {
            ctx.stats.counter("files_by_call").fetch_add(1, std::memory_order_relaxed);
            // No descriptor to spare: opened again by its path when read (file_mapping).
            if (mapped->fd() < 0) ctx.stats.counter("files_by_path").fetch_add(1, std::memory_order_relaxed);
        }
    }
    // Read ahead more; not for a file read by call in one window, whose window asks for
    // itself (below).
    if (!mapped || !mapped->by_call() || mapped->size() > chunk_size) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    if (mapped) {  // else (no mapping could be made) read as below
        const std::size_t size = mapped->size();
        for (std::size_t off = 0; off < size; off += chunk_size) {
            const std::size_t n = std::min(chunk_size, size - off);
            // A named chunk, not `send(chunk{...})`: g++ 12 destroys the members of a
            // braced temporary in a co_await operand twice (seen as a shared_ptr
            // released twice under ASan).
            chunk c{src, off, bytes(std::make_shared<const buffer>(mapped, off, n), n), off + n == size, false};
            // By call: the window's bytes into the page cache, read ahead (a no-op where
            // they are there), and none mapped in; else its pages mapped in one call.
            // A file that shrank is seen here before its lost pages reach a parser (where
            // no page faults, within the last page, only this check sees it). By call,
            // every read is a pread that comes back short instead.
            if (mapped->by_call()) {
                ::posix_fadvise(fd.get(), static_cast<off_t>(off), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
            } else {
                mapped->populate(off, n);
                struct stat now {};
                if (::fstat(fd.get(), &now) == 0 && S_ISREG(now.st_mode) && static_cast<std::uint64_t>(now.st_size) < size)
                    mapped->mark_lost(static_cast<std::uint64_t>(now.st_size));
            }
            if (mapped->lost() != file_mapping::none_lost) throw_lost(*mapped);
            file_mapping::sweep_pending();  // what records let go of, out of the process
            co_await gate.wait();
            co_await ctx.out.send(std::move(c));
        }
        co_return;
    }
    // The size at open decides where the file ends: a file that grows while read is
    // read up to that size; one that shrinks ends early.
    const std::uint64_t size = S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : ~0ull;
    std::uint64_t offset = 0;
    for (;;) {
        // No bigger than what is left of the file: a record sliced from the chunk of a
        // small file must not pin a whole chunk_size buffer, which the channels' byte
        // budgets (counting record bytes) would not see.
        const std::size_t want =
            size == ~0ull ? chunk_size : static_cast<std::size_t>(std::min<std::uint64_t>(chunk_size, size - offset));
        auto buf = ctx.rt.buffers()->allocate(want);
        if (size != ~0ull) buf->will_write(want);  // a regular file's chunk is read whole
        std::size_t filled = 0;
        bool eof = false;
        while (filled < want) {
            const ssize_t n =
                ::pread(fd.get(), buf->data() + filled, want - filled, static_cast<off_t>(offset + filled));
            if (n < 0) {
                if (errno == EINTR) continue;
                throw source_error(path, "cannot read", errno_code(), offset + filled);
            }
            if (n == 0) {
                eof = true;
                break;
            }
            filled += static_cast<std::size_t>(n);
        }
        const bool last = eof || offset + filled >= size;
        chunk c{src, offset, bytes(std::move(buf), filled), last, false};
        offset += filled;
        co_await gate.wait();
        co_await ctx.out.send(std::move(c));
        if (last) break;
    }
}

/// A URL with a scheme other than file:// is no local path: read() would say "No such
/// file or directory"; say what reads it instead.
inline void check_local(const std::string& url) {
    const auto p = url.find("://");
    if (p == std::string::npos || p == 0 || url.compare(0, p + 3, "file://") == 0) return;
    for (std::size_t i = 0; i < p; ++i) {
        const char c = url[i];
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && ((c >= '0' && c <= '9') || c == '+' ||
                                                                                     c == '-' || c == '.'));
        if (!ok) return;  // not a scheme: a local path that happens to hold "://"
    }
    std::string scheme = url.substr(0, p);
    for (auto& c : scheme) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    const bool fetched = scheme == "http" || scheme == "https" || scheme == "s3";
    throw source_error(url,
                       fetched ? "use sluice::fetch(), not sluice::read() (which reads local files), for"
                               : "sluice::read() reads local files, not",
                       std::make_error_code(std::errc::protocol_not_supported));
}

/// read_options::chunk_size, 0 meaning the default.
inline std::size_t chunk_size_of(const read_options& o) { return o.chunk_size ? o.chunk_size : (4u << 20); }

/// read's access to files by offset, for plan's record counting
/// (core/detail/shard_counting.hpp): stat for the size and mtime, pread for bytes.
class local_access final : public shard_access {
public:
    shard_facts facts(const std::string& url) override {
        check_local(url);
        struct stat st {};
        if (::stat(local_path(url).c_str(), &st) != 0) throw source_error(url, "cannot count records: cannot stat", errno_code());
        return {static_cast<std::uint64_t>(st.st_size),
                std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec)};
    }
    std::size_t read(const std::string& url, std::uint64_t offset, std::byte* into, std::size_t n) override {
        if (url != url_) {
            fd_.reset();
            url_.clear();
            const int fd = ::open(local_path(url).c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) throw source_error(url, "cannot count records: cannot open", errno_code());
            fd_ = std::make_unique<fd_guard>(fd);
            url_ = url;
        }
        std::size_t got = 0;
        while (got < n) {
            const ssize_t k = ::pread(fd_->get(), into + got, n - got, static_cast<off_t>(offset + got));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0)
                throw source_error(url, "cannot count records: read failed at byte " + std::to_string(offset + got) + " of",
                                   errno_code());
            if (k == 0) break;
            got += static_cast<std::size_t>(k);
        }
        return got;
    }

private:
    std::string url_;
    std::unique_ptr<fd_guard> fd_;
};

/// What read's setup decided for a run: its options (map_min_bytes decided), and which
/// files it maps by_call (passes_untouched from detail::headers_only_after; null: none).
struct read_run {
    read_options o;
    passes_untouched by_call;
};

/// `o`: the run's options, whose map_min_bytes the setup decided; `by_call`: which files
/// it maps by call (see read()).
template <class = void>  // a coroutine: compiled only where used (see make_stage)
task<void> read_worker(stage_context<shard, chunk>& ctx, read_options o, passes_untouched by_call) {
    const std::size_t chunk_size = chunk_size_of(o);
    for (;;) {
        co_await pass_gate(ctx);  // files in flight, when tuned
        std::uint64_t ticket = 0;
        std::optional<shard> s;
        std::exception_ptr failed;
        try {
            s = co_await ctx.in.next(ctx.turn ? &ticket : nullptr);
        } catch (...) {
            failed = std::current_exception();
        }
        turn_gate gate(ctx.turn, ticket);
        if (!failed && !s) break;
        if (!failed) {
            try {
                auto src = std::make_shared<const shard>(std::move(*s));
                check_local(src->url);
                fd_guard fd(::open(local_path(src->url).c_str(), O_RDONLY | O_CLOEXEC));
                if (fd.get() < 0) throw source_error(src->url, "cannot open", errno_code());
                co_await read_file(ctx, src, src->url, fd, chunk_size, o.map, gate, ~0ull, o.map_min_bytes, by_call);
            } catch (...) {
                failed = std::current_exception();
            }
        }
        if (failed) {
            // Ordered: an error follows every file before it.
            if (!gate.mine && !is_stop(failed)) co_await gate.wait();
            std::rethrow_exception(failed);
        }
        gate.done();
    }
}
}  // namespace detail

/// Takes: shards whose url is a local path. Gives: each file's bytes as chunks of
/// `chunk_size` bytes (the last one flagged), in order per file.
/// Backpressure: at most `concurrency` chunks being filled plus the output channel
/// (bounded in chunks and bytes); buffers are recycled through the runtime's pool.
/// Errors: a file that cannot be opened or read is a sluice::source_error naming the path
/// (and the byte offset of a failed read); chunks already sent are delivered first. A URL
/// (http://, https://, s3://) is an error naming it and saying to use sluice::fetch();
/// `file://` prefixes are dropped.
/// Cancellation: stops at the next send; the file is closed.
/// Reads are blocking preads, on the I/O loop unless `on` says otherwise.
/// Example: `sluice::list("data/*.txt") | sluice::plan() | sluice::read({.chunk_size = 8 << 20})`
template <class = void>  // compiled only where used (see make_stage)
stage<shard, chunk> read(read_options o = {}) {
    // Under pipeline_options::tune, how many files are in flight is the tuner's (up to
    // .concurrency); each holds a chunk being filled (none when mapped: page cache).
    // Small files are mapped only when a stage after read holds records (read_options::
    // map_min_bytes); the stages after it set up first (core/state.hpp).
    // Mapped shards whose bytes the stages after read leave to batch's collation but for
    // their headers are mapped by_call (detail::file_mapping): no page of them is mapped
    // into the process, and the records are read from the page cache once, into the batch.
    auto setup = [o](stage_setup& st) {
        auto run = std::make_shared<detail::read_run>(detail::read_run{o, nullptr});
        if (detail::records_held_after(st.internal.run, st.internal.at)) run->o.map_min_bytes = 0;
        run->by_call = detail::headers_only_after(st.internal.run, st.internal.at);
        return run;
    };
    auto s = make_stage<shard, chunk>("read", {.concurrency = o.concurrency, .order = o.order, .on = o.on, .out = o.out},
                                      setup, [](stage_context<shard, chunk>& ctx, detail::read_run& run) {
                                          return detail::read_worker(ctx, run.o, run.by_call);
                                      });
    // Plan may count records through it (core/detail/shard_counting.hpp).
    s = detail::also_at_setup(std::move(s), [](stage_setup& st) {
        detail::offer_access(st.internal.run, st.internal.at, "read", [](std::stop_token) -> std::unique_ptr<detail::shard_access> {
            return std::make_unique<detail::local_access>();
        });
    });
    // A file in flight holds a chunk being filled; none when mapping (page cache), but for
    // the small files read instead: at most map_min_bytes each, left out of the budget.
    return detail::gated_stage(std::move(s), o.map ? 0 : detail::chunk_size_of(o));
}
template <class A>
stage<A, chunk> read(stage<A, shard> upstream, read_options o = {}) {
    return std::move(upstream) | read(o);
}

}  // namespace sluice
