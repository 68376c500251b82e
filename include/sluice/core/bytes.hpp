#pragma once
// sluice::bytes: a reference-counted, read-only slice of a buffer.
// sluice::buffer_pool: recycles large buffers so steady-state reading allocates nothing.
//
// Fetched chunks are read once into pooled buffers; records are slices of those chunks
// (no copy), and the buffer goes back to its pool when the last slice referring to it is
// destroyed. A slice that would keep a big buffer alive for a long time for a few bytes
// (a shuffle buffer holding one small record of each chunk) is compacted: copied out into
// a buffer of its own, so memory stays bounded by what is actually held.

#include <sluice/core/detail/file_mapping.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <new>

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace sluice {

namespace detail {
/// Copies `n` bytes to `d` with non-temporal stores where the CPU has them (x86-64): the
/// destination is not read first nor kept in the cache. Collating a batch far larger
/// than the cache is the one copy a pipeline of mapped files makes, and plain stores read
/// every destination line before writing it (measured on the bench VM: 11.7 GB/s with
/// memcpy, 18 GB/s streaming, 100 KiB records from the page cache into a 25 MiB batch).
/// fetch streams what curl receives into its chunks the same way.
/// The caller orders the stores with stream_fence() before another thread reads them.
inline void stream_copy(std::byte* d, const std::byte* s, std::size_t n) noexcept {
#if defined(__x86_64__) || defined(_M_X64)
    const std::size_t head = std::min(n, (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
#endif
    if (n) std::memcpy(d, s, n);
}
inline void stream_fence() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_sfence();
#endif
}

/// Buffers of this size and more are mapped from the system directly, not taken from
/// malloc. malloc keeps what is freed for later (its threshold for mapping rises to the
/// largest block freed, up to 32 MiB), in arenas per thread that a buffer_pool cannot see:
/// under a memory budget that was up to 40 MB of resident memory beside the budget's,
/// more or less as threads happened to allocate and free (`tests/integration/probe.cpp`'s
/// budget test: 107-127 MB peak where the pipeline held 62-82). Mapped directly, the pool
/// is the one cache of large buffers, and what it does not keep goes back at once.
/// AddressSanitizer builds keep malloc, whose bounds it checks.
inline constexpr std::size_t mapped_buffer_bytes = std::size_t{1} << 20;
#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_DETAIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang says so this way only
#define SLUICE_DETAIL_ASAN 1
#endif
#endif
inline bool maps_buffer(std::size_t capacity) noexcept {
#if defined(SLUICE_DETAIL_ASAN)
    (void)capacity;
    return false;
#else
    return capacity >= mapped_buffer_bytes;
#endif
}
/// Buffers of this size and more are laid on 2 MiB boundaries and offered transparent huge
/// pages (MADV_HUGEPAGE; Debian's kernels give them to regions that ask, "madvise"): a batch
/// of 25 MB is then faulted in with a dozen faults rather than 6,000. First touch of fresh
/// memory is what a pipeline's first epoch pays for its batches (bench/RESULTS.md, issue
/// 17: 2,000 objects over HTTP, 19,000-20,800 page faults -> 6,500-8,500, and a median
/// 0.224 -> 0.188 s of CPU).
/// The kernel gives ordinary pages where it has no huge one free (or THP is "never"), and
/// a buffer holds at most the 2 MiB it touched last beyond what it wrote.
/// Where a VM's balloon reports free pages to its host, offered only where measured to pay
/// (offer_huge_pages).
inline constexpr std::size_t huge_buffer_bytes = std::size_t{4} << 20;

/// Whether a virtio balloon under `devices` (sysfs's virtio bus) reports free pages to
/// the host (VIRTIO_BALLOON_F_REPORTING, feature bit 5). Such a guest hands each free
/// 2 MiB block back to the host within seconds, and the host must back it again on its
/// next first touch (likely 4 KiB at a time): fresh huge pages then cost 14-18 s/GiB to
/// fault in, 4 KiB pages 0.7-1.0 (bench/RESULTS.md, issue 17, eighteenth session).
inline bool balloon_reports_free_pages(const char* devices = "/sys/bus/virtio/devices") {
    auto first_line = [](const std::string& path) {
        std::string line;
        if (std::FILE* f = std::fopen(path.c_str(), "r")) {
            char buf[512];
            if (std::fgets(buf, sizeof buf, f)) line = buf;
            std::fclose(f);
        }
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
        return line;
    };
    DIR* dir = ::opendir(devices);
    if (!dir) return false;
    bool reports = false;
    while (const dirent* e = ::readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        const std::string at = std::string(devices) + "/" + e->d_name;
        if (first_line(at + "/device") != "0x0005") continue;  // virtio device id 5: the balloon
        const std::string features = first_line(at + "/features");  // one '0' or '1' per bit, bit 0 first
        if (features.size() > 5 && features[5] == '1') reports = true;
    }
    ::closedir(dir);
    return reports;
}
/// What faulting in fresh memory costs on this machine now: seconds to write 2 MiB offered
/// a transparent huge page, the greater of two such pages, and to write 2 MiB of 4 KiB
/// pages, taken as eight times the lesser of two writes of 256 KiB (one store per 4 KiB,
/// as a batch's copy first touches it). Each pick leans against huge pages: one huge page
/// the host still backs (freed by a process just before) or a thread preempted while it
/// writes 4 KiB pages could make them look cheaper than they are. The 4 KiB pages are most
/// of the cost: with two writes of 1 MiB it was 6-9 ms of a process's CPU on a VM where
/// they cost 2.7 s/GiB (a third of the probe's whole start), with 256 KiB about a quarter
/// of that (bench/RESULTS.md, issue 17, twenty-eighth session). Once a process. Zeros
/// where the memory cannot be mapped.
struct fresh_touch_cost {
    double huge_s = 0, small_s = 0;
};
inline fresh_touch_cost measure_fresh_touch() {
    constexpr std::size_t huge = std::size_t{2} << 20;
    // Laid out from the first 2 MiB boundary: two huge pages, then two 256 KiB pieces of 4
    // KiB pages (each at the start of 2 MiB of their own); mapped with 2 MiB to spare for
    // the alignment.
    constexpr std::size_t mapped = 5 * huge;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return {};
    auto* at = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(std::uintptr_t{huge} - 1));
#ifdef MADV_HUGEPAGE
    ::madvise(at, 2 * huge, MADV_HUGEPAGE);
    ::madvise(at + 2 * huge, 2 * huge, MADV_NOHUGEPAGE);
#endif
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    auto touch = [](std::byte* from, std::size_t n) {
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < n; i += page) static_cast<volatile std::byte*>(from)[i] = std::byte{1};
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    fresh_touch_cost c;
    constexpr std::size_t small_bytes = huge / 8;
    const double small = touch(at + 2 * huge, small_bytes);
    c.huge_s = touch(at, huge);
    c.small_s = (huge / small_bytes) * std::min(small, touch(at + 3 * huge, small_bytes));
    c.huge_s = std::max(c.huge_s, touch(at + huge, huge));
    ::munmap(p, mapped);
    return c;
}
/// Whether huge pages pay where they were measured: a fresh huge page costs less than three
/// quarters of the same bytes in 4 KiB pages. Where THP is "never" or no huge page
/// is free, both are 4 KiB pages and cost the same: not offered, which changes nothing.
inline bool huge_pages_pay(const fresh_touch_cost& c) noexcept {
    return c.huge_s > 0 && c.small_s > 0 && c.huge_s * 4 < c.small_s * 3;
}

/// Whether buffers of huge_buffer_bytes and more are offered transparent huge pages:
/// `env` (SLUICE_HUGE_PAGES) "1" or "0" when set so; else yes where no virtio balloon
/// reports free pages; else as `measure` (measure_fresh_touch) finds them to pay. Such
/// balloons differ from one kind of VM to another: on one, a fresh huge page after a pause
/// cost 14-18 s/GiB against 0.7-1.0 for 4 KiB pages (a first epoch of tar shards 1.8-4.7 x
/// slower); on another (paravirtual paging), 1.5-1.8 against 2.6-2.8 after the same pause,
/// and a first epoch of tar shards 0.32 -> 0.27 s (bench/RESULTS.md, issue 17). The
/// measurement has run only on the second kind: that it keeps huge pages off on the first
/// is expected from the figures, not yet seen.
inline bool huge_pages_wanted(const char* env, const char* devices = "/sys/bus/virtio/devices",
                              fresh_touch_cost (*measure)() = measure_fresh_touch) {
    if (env && std::string_view(env) == "1") return true;
    if (env && std::string_view(env) == "0") return false;
    return !balloon_reports_free_pages(devices) || huge_pages_pay(measure());
}
/// huge_pages_wanted for this process, decided once: when its first runtime is made (its
/// threads idle; see runtime's constructor), or at its first buffer that map_buffer maps
/// (1 MiB or more: mapped_buffer_bytes) where that comes first.
inline bool offer_huge_pages() {
    static const bool yes = huge_pages_wanted(std::getenv("SLUICE_HUGE_PAGES"));
    return yes;
}
/// `huge_pages`: lay a buffer of huge_buffer_bytes or more on 2 MiB boundaries and offer it
/// huge pages (by default as offer_huge_pages says; tests ask for either).
inline std::byte* map_buffer(std::size_t capacity, bool huge_pages = offer_huge_pages()) {
    constexpr std::size_t huge = std::size_t{2} << 20;
    const std::size_t slack = capacity >= huge_buffer_bytes && huge_pages ? huge : 0;
    if (capacity > SIZE_MAX - 2 * huge) throw std::bad_alloc();
    void* p = ::mmap(nullptr, capacity + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (!slack) return static_cast<std::byte*>(p);
    // Keep the aligned `capacity` bytes (whole pages: munmap needs a page-aligned start),
    // give back the rest: unmap_buffer then unmaps exactly the buffer.
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t len = (capacity + page - 1) / page * page;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto b = (a + huge - 1) & ~(std::uintptr_t{huge} - 1);
    if (b > a) ::munmap(p, b - a);
    if (a + slack > b) ::munmap(reinterpret_cast<void*>(b + len), a + slack - b);  // mapped: a .. a + len + slack
#ifdef MADV_HUGEPAGE
    ::madvise(reinterpret_cast<void*>(b), len, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
    return reinterpret_cast<std::byte*>(b);
}
inline void unmap_buffer(std::byte* data, std::size_t capacity) noexcept { ::munmap(data, capacity); }

/// Faults in the whole pages of [p, p + n) by call (MADV_POPULATE_WRITE, Linux 5.14; on
/// older kernels, and where it failed once, nothing: the pages fault in as they are
/// written), for fresh memory about to be written in full (buffer::will_write). The
/// kernel zeroes the same pages either way, but without a trap per 4 KiB page: where a
/// fault is dear that is most of first touch's cost (bench/RESULTS.md, issue 17,
/// twenty-second session: 4 KiB pages 2.8-3.4 -> 1.75-1.85 s/GiB on a VM with
/// paravirtual paging, bench/first_touch --populate).
inline void populate(std::byte* p, std::size_t n) noexcept {
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;
#endif
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const auto a = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(std::uintptr_t{page} - 1);
    const auto b = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(std::uintptr_t{page} - 1);
    static std::atomic<bool> unsupported{false};
    // In pieces of 2 MiB: each call holds the process's mmap_lock for reading while it
    // faults, and a thread that maps or unmaps meanwhile waits (25 MB at once: about 35 ms).
    constexpr std::uintptr_t piece = std::uintptr_t{2} << 20;
    for (auto at = a; at < b && !unsupported.load(std::memory_order_relaxed); at += piece)
        if (::madvise(reinterpret_cast<void*>(at), std::min(piece, b - at), MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
            unsupported.store(true, std::memory_order_relaxed);  // this kernel has no such advice
}

}  // namespace detail

/// A block of memory of fixed capacity: heap memory (mapped directly from 1 MiB) handed
/// out by a buffer_pool, or memory owned elsewhere (a file mapping, pinned memory) with
/// the function that releases it.
class buffer {
public:
    using release_fn = void (*)(std::byte* data, std::size_t capacity) noexcept;

    /// Not zeroed (filled by I/O). Large ones are mapped directly (detail::maps_buffer).
    explicit buffer(std::size_t capacity)
        : buffer(capacity, detail::maps_buffer(capacity)) {}
    buffer(std::byte* data, std::size_t capacity, release_fn release) noexcept
        : data_(data), capacity_(capacity), release_(release) {}
    /// `n` bytes at `offset` of a mapped file, viewed in place: the pages stay in the
    /// process while this buffer lives (see detail::file_mapping).
    buffer(std::shared_ptr<detail::file_mapping> file, std::size_t offset, std::size_t n) noexcept
        : data_(file->data() + offset), capacity_(n), file_(std::move(file)) {
        file_->pin(offset, n);
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() {
        if (file_) file_->unpin(static_cast<std::size_t>(data_ - file_->data()), capacity_, file_.use_count() == 1);
        else if (release_) release_(data_, capacity_);
        else delete[] data_;
    }
    std::byte* data() noexcept { return data_; }
    const std::byte* data() const noexcept { return data_; }
    std::size_t capacity() const noexcept { return capacity_; }
    /// For a caller about to write the first `n` bytes, all of them: where this is fresh
    /// memory a buffer_pool has just made, their pages are faulted in at once
    /// (detail::populate), without a trap per 4 KiB page. Otherwise (memory used before,
    /// or owned elsewhere; a second call) nothing. A caller that may write less than it
    /// asked for (a guess, a chunk of unknown length) does not call it: it would make
    /// resident what nothing writes.
    void will_write(std::size_t n) noexcept {
        if (take_fresh()) detail::populate(data_, std::min(n, capacity_));
    }
    /// will_write for a caller that writes its bytes in parts, perhaps on several threads
    /// at once: true (once) where this is fresh memory a buffer_pool has just made; the
    /// caller then populates each part (detail::populate) just before it writes it, so
    /// that the threads share the faulting too (batch's collation).
    bool take_fresh() noexcept { return std::exchange(fresh_, false); }
    /// The mapped file this buffer views, or null.
    const std::shared_ptr<detail::file_mapping>& file() const noexcept { return file_; }

private:
    buffer(std::size_t capacity, bool mapped)
        : data_(mapped ? detail::map_buffer(capacity) : new std::byte[capacity]),
          capacity_(capacity),
          release_(mapped ? &detail::unmap_buffer : nullptr) {}

    std::byte* data_;
    std::size_t capacity_;
    release_fn release_ = nullptr;
    std::shared_ptr<detail::file_mapping> file_;
    bool fresh_ = false;  // made by a buffer_pool just now, not yet written (will_write)
    friend class buffer_pool;
};

/// Where buffers come from. The default recycles heap buffers; the cuda layer provides a
/// pinned pool with the same interface, so a stage that allocates through it (batch)
/// collates straight into page-locked memory.
class buffer_source {
public:
    virtual ~buffer_source() = default;
    /// A buffer of at least `size` bytes, returned to its source when the last owner drops
    /// it.
    virtual std::shared_ptr<buffer> allocate(std::size_t size) = 0;
    /// The same, for a size that varies from one request to the next (a batch of ragged
    /// records): a source may make fresh memory larger, so that it also serves the next,
    /// somewhat larger request. By default, allocate.
    virtual std::shared_ptr<buffer> allocate_varying(std::size_t size) { return allocate(size); }
    /// A buffer of at least `size` bytes from what the source keeps for reuse (already
    /// faulted in), as allocate_varying would find it; null when it keeps none that fits,
    /// and by default.
    virtual std::shared_ptr<buffer> allocate_kept(std::size_t size) {
        (void)size;
        return nullptr;
    }
};

/// Recycles freed buffers, by size class, up to `max_cached_bytes` of them.
///
/// Requests are rounded up to a size class (four classes per power of two, so at most 25%
/// is wasted) and a freed buffer serves later requests of its class; a request of 4 MiB
/// or more whose class has none may get one of up to twice its class, and fresh memory
/// for a varying size of 4 MiB or more is made one class larger (allocate_varying).
/// Recycling matters: a fresh large allocation costs a page fault per 4 KiB on first
/// touch, and glibc returns freed memory to the system and faults it in again when
/// records of a few hundred KiB churn (measured: the shuffle stage spent most of its time in page faults before it
/// allocated here). Requests below 16 KiB are not pooled (malloc serves them well).
/// Fresh memory is marked so (buffer::will_write): a caller that writes what it asked for
/// has those pages faulted in at once.
class buffer_pool final : public buffer_source, public std::enable_shared_from_this<buffer_pool> {
public:
    static constexpr std::size_t min_pooled = 16u << 10;
    /// From this size up a request may get a cached buffer of up to twice its class.
    static constexpr std::size_t larger_from = 4u << 20;

    static std::shared_ptr<buffer_pool> create(std::size_t max_cached_bytes = 256u << 20) {
        return std::shared_ptr<buffer_pool>(new buffer_pool(max_cached_bytes));
    }

    /// The capacity a request of `size` bytes gets.
    static std::size_t size_class(std::size_t size) noexcept {
        if (size < min_pooled) return size ? size : 1;
        std::size_t octave = std::size_t{1} << (63 - __builtin_clzll(size));  // <= size
        const std::size_t step = octave / 4;
        return (size + step - 1) / step * step;
    }

    std::shared_ptr<buffer> allocate(std::size_t size) override { return allocate(size, size_class(size)); }

    /// Fresh memory for a size of 4 MiB or more that is not itself a class is made one
    /// class larger, where two such buffers fit in the cache; cached buffers are served
    /// as by allocate. Only written pages are faulted in, so the headroom costs no
    /// resident memory, and the buffer then also serves the next class's requests.
    /// Batches of ragged records straddle class boundaries: 256 objects of 50-150 KB sum
    /// to 24-25 MiB, across the 24 MiB boundary, and without the headroom the batches of
    /// the 28 MiB class found only the 24 MiB class's buffers cached, and faulted in fresh
    /// ones.
    std::shared_ptr<buffer> allocate_varying(std::size_t size) override {
        const std::size_t cap = size_class(size);
        const std::size_t larger = size_class(cap + 1);
        if (cap < larger_from || cap == size || larger > max_cached_ / 2) return allocate(size);
        return allocate(size, larger);
    }

    std::shared_ptr<buffer> allocate_kept(std::size_t size) override { return allocate(size, 0); }

    std::size_t cached_bytes() const {
        std::lock_guard lock(m_);
        return cached_;
    }

private:
    explicit buffer_pool(std::size_t max_cached) : max_cached_(max_cached) {}
    // A request of `size` bytes; `fresh`: the capacity of new memory, if none is cached
    // (0: none, null then).
    std::shared_ptr<buffer> allocate(std::size_t size, std::size_t fresh) {
        const std::size_t cap = size_class(size);
        if (cap < min_pooled) return fresh ? std::make_shared<buffer>(cap) : nullptr;
        std::unique_ptr<buffer> b;
        {
            // Its own class first, else, from 4 MiB up, one of the next four (at most
            // twice the size): a batch a little smaller than the last (ragged records, an
            // epoch's last batch) reuses a buffer already faulted in rather than touching
            // fresh memory. Smaller requests (records a shuffle holds) keep their class,
            // so what they hold stays within a quarter of what they count.
            std::lock_guard lock(m_);
            for (std::size_t c = cap, k = 0; k < (cap >= larger_from ? 5u : 1u) && !b; ++k, c = size_class(c + 1))
                if (auto it = free_.find(c); it != free_.end() && !it->second.empty()) {
                    b = std::move(it->second.back());
                    it->second.pop_back();
                    cached_ -= c;
                }
        }
        if (!b && !fresh) return nullptr;
        if (!b) {
            b = std::make_unique<buffer>(fresh);
            b->fresh_ = true;
        }
        // The deleter holds a weak reference: buffers may outlive the pool.
        return std::shared_ptr<buffer>(b.release(), [w = weak_from_this()](buffer* p) {
            if (auto pool = w.lock()) pool->recycle(std::unique_ptr<buffer>(p));
            else delete p;
        });
    }

    void recycle(std::unique_ptr<buffer> b) {
        b->fresh_ = false;
        std::lock_guard lock(m_);
        if (cached_ + b->capacity() > max_cached_) return;  // b freed on return
        cached_ += b->capacity();
        free_[b->capacity()].push_back(std::move(b));
    }
    mutable std::mutex m_;
    std::unordered_map<std::size_t, std::vector<std::unique_ptr<buffer>>> free_;
    std::size_t cached_ = 0;
    const std::size_t max_cached_;
};

/// A read-only view of bytes that keeps its buffer alive.
class bytes {
public:
    bytes() = default;
    bytes(std::shared_ptr<const buffer> owner, const std::byte* data, std::size_t size) noexcept
        : owner_(std::move(owner)), data_(data), size_(size) {}
    /// The first `size` bytes of `owner`.
    bytes(std::shared_ptr<const buffer> owner, std::size_t size) noexcept
        : data_(owner ? owner->data() : nullptr), size_(size) {
        owner_ = std::move(owner);
    }

    /// A copy of `s` in a buffer of its own (from `from` when given).
    static bytes copy_of(std::span<const std::byte> s, buffer_source* from = nullptr) {
        auto b = from ? from->allocate(s.size()) : std::make_shared<buffer>(s.size() ? s.size() : 1);
        b->will_write(s.size());
        if (!s.empty()) std::memcpy(b->data(), s.data(), s.size());
        return bytes(std::move(b), s.size());
    }
    static bytes copy_of(std::string_view s) {
        return copy_of(std::as_bytes(std::span<const char>(s.data(), s.size())));
    }

    const std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    std::size_t byte_size() const noexcept { return size_; }
    std::span<const std::byte> span() const noexcept { return {data_, size_}; }
    std::string_view view() const noexcept {
        return {reinterpret_cast<const char*>(data_), size_};
    }
    const std::byte* begin() const noexcept { return data_; }
    const std::byte* end() const noexcept { return data_ + size_; }

    /// A sub-slice sharing the same buffer.
    bytes slice(std::size_t offset, std::size_t count) const noexcept {
        return bytes(owner_, data_ + offset, count);
    }
    /// Capacity of the buffer this slice keeps alive.
    std::size_t owner_capacity() const noexcept { return owner_ ? owner_->capacity() : 0; }
    /// The buffer this slice keeps alive (null for an empty view).
    const std::shared_ptr<const buffer>& owner() const noexcept { return owner_; }
    /// How many slices share the buffer (for tests and diagnostics).
    long owner_use_count() const noexcept { return owner_.use_count(); }

    /// Copy out (into a buffer from `from`, when given) when this slice holds less than
    /// `1/ratio` of its buffer, so a long-lived small slice does not pin a large chunk.
    /// A slice of a mapped file is not copied: it gets a view of its own pages instead
    /// (pinning only them), which costs no memory and no copy.
    bytes compact(buffer_source* from = nullptr, std::size_t ratio = 4) const {
        if (!owner_ || size_ * ratio >= owner_->capacity()) return *this;
        if (const auto& f = owner_->file())
            return bytes(std::make_shared<const buffer>(f, static_cast<std::size_t>(data_ - f->data()), size_), size_);
        return copy_of(span(), from);
    }

    /// The mapped file this slice views, or null.
    const detail::file_mapping* file() const noexcept { return owner_ ? owner_->file().get() : nullptr; }
    /// Whether it views a file mapped by call (detail::file_mapping::by_call), whose pages
    /// are meant to stay out of the process: read it with copy_to, not through data().
    bool by_call() const noexcept {
        const auto* f = file();
        return f && f->by_call();
    }
    /// Copies its bytes [from, from + n) to `d`: with pread where it is by_call() (bytes
    /// its file lost are zeros, and the mapping is marked: lost() says so), else memcpy.
    void copy_to(std::byte* d, std::size_t from, std::size_t n) const noexcept {
        if (n == 0) return;
        if (const auto* f = file(); f && f->by_call())
            f->read_at(d, static_cast<std::size_t>(data_ - f->data()) + from, n);
        else
            std::memcpy(d, data_ + from, n);
    }
    /// Whether bytes of this slice were lost (its mapped file shrank while it was read):
    /// the slice then holds zeros from the lost offset on.
    bool lost() const noexcept {
        const auto* f = file();
        return f && f->lost() < static_cast<std::uint64_t>(data_ - f->data()) + size_;
    }
    /// Several slices laid end to end in one mapped file, as one slice of it (no copy);
    /// empty when they are not.
    static bytes joined_in_place(std::span<const bytes> parts) {
        if (parts.empty() || !parts[0].file()) return {};
        const auto& f = parts[0].owner_->file();
        std::size_t n = parts[0].size_;
        for (std::size_t i = 1; i < parts.size(); ++i) {
            if (parts[i].file() != f.get() || parts[i].data_ != parts[i - 1].data_ + parts[i - 1].size_) return {};
            n += parts[i].size_;
        }
        return bytes(std::make_shared<const buffer>(f, static_cast<std::size_t>(parts[0].data_ - f->data()), n), n);
    }

private:
    std::shared_ptr<const buffer> owner_;
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace sluice
