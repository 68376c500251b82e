#pragma once
// libcurl's one-time global set-up, shared by the engine and the blocking calls, with
// memory functions that keep transfers' receive buffers for the next transfer.
//
// libcurl (7.88, Debian 12) allocates each transfer's receive buffer, CURLOPT_BUFFERSIZE
// + 1 bytes, when the transfer starts and frees it when it ends. Freed to glibc, the
// buffers of many short transfers go back and forth from the heap's top, which glibc trims
// (MADV_DONTNEED), so the next transfer's recv writes into pages the kernel must fault in
// and zero again: for 2,000 objects of 50-150 KB, about half of all the process's page
// faults (bench/RESULTS.md, issue 17). Blocks of that size are kept here instead, up to
// `kept_max`, and handed to the next request of that size.
//
// Kept, the buffers are still faulted in once each, 4 KiB at a time by the kernel's
// receive copy: with 64 transfers in flight about 2,200 faults, half of a one-pass
// process's, and on a VM with paravirtual paging each costs 12-23 µs.
// So where huge pages pay (offer_huge_pages), the receive buffers are lent from one region
// of kept_max of them offered transparent huge pages (the slab): its first touch is four
// faults. One pass over 2,000 objects took 0.87-0.88 x curl's CPU by medians against
// 1.03-1.05 before (bench/RESULTS.md, issue 17, twenty-ninth session). Huge pages are
// resident whole, so the buffer is 128 KiB less 64 bytes, not the 512 KiB it was: the
// same CPU in those rounds, and the slab resident at most 8 MiB (in steps of 2 MiB, for
// the process's life), about what 64 buffers of 512 KiB held with small bodies (a large
// plain-HTTP body is received directly, past this buffer: curl_engine.hpp). More
// transfers at once take theirs from malloc, kept as above (8 MiB more at most).
// AddressSanitizer builds make no slab: their receive buffers stay malloc's, checked.
//
// curl_global_init_mem takes effect only when it is the process's first set-up of
// libcurl, explicit or by a first curl_easy_init: sluice calls curl_global() before each
// of its own. Where the program set libcurl up before sluice, its memory functions stand
// and nothing is kept (the transfers work the same; keeper.used() says which). A program
// must not call curl_global_cleanup while sluice's transfers live: libcurl would go back
// to malloc's free for buffers the keeper lent (as it would for any memory functions).

#include <sluice/core/bytes.hpp>

#include <curl/curl.h>

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace sluice::detail {

/// The receive buffer sluice asks each transfer for (CURLOPT_BUFFERSIZE): 128 KiB less 64
/// bytes, so that with libcurl's byte more the slab's 64 buffers fill four huge pages.
inline constexpr long curl_receive_buffer = 128L * 1024 - 64;

class curl_buffer_keeper {
public:
    /// The size libcurl allocates for the receive buffer.
    static constexpr std::size_t block = static_cast<std::size_t>(curl_receive_buffer) + 1;
    /// Blocks kept at most: one per transfer of a fetch's default 64 in flight (their pages
    /// stay resident only where a transfer wrote).
    static constexpr std::size_t kept_max = 64;

    // Slots and a bit mask, not a locked list: a process that forks while another thread is
    // in here (a DataLoader's workers) must not inherit a held lock.
    /// `slab`: asked at the first receive buffer to make, whether receive buffers come from
    /// the slab (get(): offer_huge_pages); none, from malloc.
    explicit curl_buffer_keeper(bool (*slab)() = nullptr) : slab_wanted_(slab) {
        // What the allocator makes of a request for `block` (glibc: a few bytes more on the
        // heap, a page more when mapped; jemalloc: its next size class): a freed block
        // whose usable size lies between `block` and that is a receive buffer's.
        void* p = std::malloc(block);
        largest_ = std::max(p ? ::malloc_usable_size(p) : block, block + 8192);
        std::free(p);
    }
    ~curl_buffer_keeper() {
        for (auto& s : slots_) std::free(s.exchange(nullptr));
        if (std::byte* b = slab_.load()) unmap_buffer(b, slab_bytes);
    }
    curl_buffer_keeper(const curl_buffer_keeper&) = delete;
    curl_buffer_keeper& operator=(const curl_buffer_keeper&) = delete;

    /// The one libcurl's memory functions use.
    static curl_buffer_keeper& get() {
#if defined(SLUICE_DETAIL_ASAN)
        static curl_buffer_keeper* k = new curl_buffer_keeper;  // never destroyed: libcurl may free at exit
#else
        static curl_buffer_keeper* k = new curl_buffer_keeper(&offer_huge_pages);  // never destroyed: libcurl may free at exit
#endif
        return *k;
    }

    void* take(std::size_t n) {
        note_used();
        if (n == block) {
            if (void* p = slab_take()) return p;
            for (auto& s : slots_)
                if (s.load(std::memory_order_relaxed))
                    if (void* p = s.exchange(nullptr, std::memory_order_acquire)) {
                        kept_n_.fetch_sub(1, std::memory_order_relaxed);
                        reused_.fetch_add(1, std::memory_order_relaxed);
                        return p;
                    }
            minted_.fetch_add(1, std::memory_order_relaxed);  // a receive buffer none kept could serve
        }
        return std::malloc(n);
    }
    void give(void* p) {
        if (!p || slab_give(p)) return;
        // Any malloc'd block that holds `block` bytes serves a later take(block): the
        // receive buffers, from the heap or mapped whole pages. But no more are kept than
        // receive buffers were ever made fresh (about the most transfers at once): blocks
        // of that size that are not receive buffers (what a paused transfer had received,
        // kept by libcurl until it resumes) would otherwise fill every slot in time, 8
        // MiB resident that no transfer asks for (32 with the 512 KiB buffers of before).
        const std::size_t usable = ::malloc_usable_size(p);
        if (usable >= block && usable <= largest_ &&
            kept_n_.load(std::memory_order_relaxed) < minted_.load(std::memory_order_relaxed))
            for (auto& s : slots_) {
                void* none = nullptr;
                if (!s.load(std::memory_order_relaxed) && s.compare_exchange_strong(none, p, std::memory_order_release)) {
                    kept_n_.fetch_add(1, std::memory_order_relaxed);
                    return;
                }
            }
        std::free(p);
    }

    /// Whether `p` is one of the slab's receive buffers (lent or not).
    bool in_slab(const void* p) const noexcept {
        const std::byte* base = slab_.load(std::memory_order_acquire);
        const auto* b = static_cast<const std::byte*>(p);
        return base && b >= base && b < base + kept_max * slab_stride;
    }
    /// realloc for one of the slab's: `n` bytes from malloc with its first bytes, the slot
    /// given back (null, the slot still lent, where malloc fails; a realloc to 0 frees).
    void* move_out(void* p, std::size_t n) {
        if (n == 0) {
            give(p);
            return nullptr;
        }
        void* q = std::malloc(n);
        if (!q) return nullptr;
        std::memcpy(q, p, std::min(n, block));
        give(p);
        return q;
    }
    /// Blocks of malloc's kept now (not the slab's); take(block) calls served from kept
    /// blocks or from slab slots lent before; whether a slab is made; whether libcurl ever
    /// called in (false: the program set libcurl up before sluice, with its own memory
    /// functions).
    std::size_t kept() const {
        std::size_t n = 0;
        for (auto& s : slots_) n += s.load(std::memory_order_relaxed) != nullptr;
        return n;
    }
    std::size_t reused() const { return reused_.load(std::memory_order_relaxed); }
    bool has_slab() const { return slab_.load(std::memory_order_relaxed) != nullptr; }
    bool used() const { return used_.load(std::memory_order_relaxed); }
    void note_used() noexcept {
        if (!used_.load(std::memory_order_relaxed)) used_.store(true, std::memory_order_relaxed);  // no write per call
    }

private:
    // The slab: kept_max receive buffers side by side (64-byte aligned), the region on 2 MiB
    // boundaries, mapped at the first buffer to make and never unmapped while the process
    // lives (get()'s keeper is never destroyed). A slot is lent by clearing its bit in
    // slab_free_, the lowest first (the fewest huge pages touched), and given back by
    // setting it; the slab's slots are never freed to malloc.
    static constexpr std::size_t slab_stride = (block + 63) / 64 * 64;
    static constexpr std::size_t slab_bytes = kept_max * slab_stride;
    static_assert(kept_max == 64, "one bit of slab_free_ per slot");
    static_assert(slab_bytes % (std::size_t{2} << 20) == 0, "the slots fill whole huge pages");
    static_assert(slab_bytes >= huge_buffer_bytes, "map_buffer offers the slab huge pages");

    void* slab_take() {
        std::byte* base = slab_.load(std::memory_order_acquire);
        if (!base && !(base = slab_map())) return nullptr;
        std::uint64_t bits = slab_free_.load(std::memory_order_relaxed);
        while (bits) {
            const int i = std::countr_zero(bits);
            const std::uint64_t bit = std::uint64_t{1} << i;
            if (slab_free_.compare_exchange_weak(bits, bits & ~bit, std::memory_order_acquire)) {
                if (slab_lent_.fetch_or(bit, std::memory_order_relaxed) & bit) reused_.fetch_add(1, std::memory_order_relaxed);
                return base + static_cast<std::size_t>(i) * slab_stride;
            }
        }
        return nullptr;  // all lent: malloc's, as without a slab
    }
    bool slab_give(void* p) {
        if (!in_slab(p)) return false;
        const auto i = static_cast<std::size_t>(static_cast<std::byte*>(p) - slab_.load(std::memory_order_relaxed)) / slab_stride;
        slab_free_.fetch_or(std::uint64_t{1} << i, std::memory_order_release);
        return true;
    }
    // Once: a keeper without a slab, a process where huge pages do not pay, or a failed
    // map makes none (nullptr, and never asked again).
    std::byte* slab_map() {
        if (!slab_wanted_ || slab_off_.load(std::memory_order_relaxed)) return nullptr;
        if (!slab_wanted_()) {
            slab_off_.store(true, std::memory_order_relaxed);
            return nullptr;
        }
        std::byte* at = nullptr;
        try {
            at = map_buffer(slab_bytes, true);  // on 2 MiB boundaries, offered huge pages
        } catch (const std::bad_alloc&) {
            slab_off_.store(true, std::memory_order_relaxed);
            return nullptr;
        }
        // A child of fork() (a DataLoader's worker) gets the slab zeroed, not shared: a
        // huge page shared copy-on-write is split at the parent's next write into it, and
        // its receive buffers would fault in 4 KiB at a time again (Linux 4.14; advice).
#ifdef MADV_WIPEONFORK
        ::madvise(at, slab_bytes, MADV_WIPEONFORK);
#endif
        std::byte* none = nullptr;
        if (!slab_.compare_exchange_strong(none, at, std::memory_order_acq_rel)) {
            unmap_buffer(at, slab_bytes);  // another thread's stands
            return none;
        }
        return at;
    }

    bool (*slab_wanted_)() = nullptr;
    std::atomic<std::byte*> slab_{nullptr};       // the first slot
    std::atomic<bool> slab_off_{false};
    std::atomic<std::uint64_t> slab_free_{~std::uint64_t{0}};
    std::atomic<std::uint64_t> slab_lent_{0};     // slots lent at least once
    std::array<std::atomic<void*>, kept_max> slots_{};
    std::atomic<long> kept_n_{0};   // blocks in slots_ (approximate between threads)
    std::atomic<long> minted_{0};   // take(block) calls served by malloc
    std::size_t largest_ = block;
    std::atomic<std::size_t> reused_{0};
    std::atomic<bool> used_{false};
};

inline void* curl_keeper_malloc(std::size_t n) { return curl_buffer_keeper::get().take(n); }
inline void curl_keeper_free(void* p) { curl_buffer_keeper::get().give(p); }
inline void* curl_keeper_realloc(void* p, std::size_t n) {
    // A kept-size block grown or shrunk is libcurl's ordinary realloc; the result is any
    // malloc'd block, which give() tells apart by its usable size. One of the slab's is
    // not malloc's: moved out of it.
    auto& k = curl_buffer_keeper::get();
    k.note_used();
    return k.in_slab(p) ? k.move_out(p, n) : std::realloc(p, n);
}
inline char* curl_keeper_strdup(const char* s) {
    curl_buffer_keeper::get().note_used();
    return ::strdup(s);
}
inline void* curl_keeper_calloc(std::size_t n, std::size_t size) {
    curl_buffer_keeper::get().note_used();
    return std::calloc(n, size);
}

/// libcurl's global set-up, once per process: true when it succeeded.
inline bool curl_global() {
    static const bool ok = [] {
        return curl_global_init_mem(CURL_GLOBAL_DEFAULT, &curl_keeper_malloc, &curl_keeper_free, &curl_keeper_realloc,
                                    &curl_keeper_strdup, &curl_keeper_calloc) == CURLE_OK;
    }();
    return ok;
}

/// A new easy handle, libcurl set up first (sluice's every easy handle comes from here).
inline CURL* curl_easy() {
    curl_global();
    return curl_easy_init();
}

}  // namespace sluice::detail
