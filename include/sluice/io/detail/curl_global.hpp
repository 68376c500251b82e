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
// `kept_max`, and handed to the next request of that size. (A side effect: glibc raises
// its mmap threshold when a mapped block is freed, and kept blocks are not freed, so
// other allocations of 128-512 KiB stay mapped as glibc starts out; the benches showed
// no cost.)
//
// curl_global_init_mem takes effect only when it is the process's first set-up of
// libcurl, explicit or by a first curl_easy_init: sluice calls curl_global() before each
// of its own. Where the program set libcurl up before sluice, its memory functions stand
// and nothing is kept (the transfers work the same; keeper.used() says which).

#include <curl/curl.h>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace sluice::detail {

/// The receive buffer sluice asks each transfer for (CURLOPT_BUFFERSIZE).
inline constexpr long curl_receive_buffer = 512L * 1024;

class curl_buffer_keeper {
public:
    /// The size libcurl allocates for the receive buffer.
    static constexpr std::size_t block = static_cast<std::size_t>(curl_receive_buffer) + 1;
    /// Blocks kept at most: one per transfer of a fetch's default 64 in flight (their pages
    /// stay resident only where a transfer wrote).
    static constexpr std::size_t kept_max = 64;

    // Slots, not a locked list: a process that forks while another thread is in here (a
    // DataLoader's workers) must not inherit a held lock.
    curl_buffer_keeper() {
        // What the allocator makes of a request for `block` (glibc: a few bytes more on the
        // heap, a page more when mapped; jemalloc: its next size class): a freed block
        // whose usable size lies between `block` and that is a receive buffer's.
        void* p = std::malloc(block);
        largest_ = std::max(p ? ::malloc_usable_size(p) : block, block + 8192);
        std::free(p);
    }
    ~curl_buffer_keeper() {
        for (auto& s : slots_) std::free(s.exchange(nullptr));
    }
    curl_buffer_keeper(const curl_buffer_keeper&) = delete;
    curl_buffer_keeper& operator=(const curl_buffer_keeper&) = delete;

    /// The one libcurl's memory functions use.
    static curl_buffer_keeper& get() {
        static curl_buffer_keeper* k = new curl_buffer_keeper;  // never destroyed: libcurl may free at exit
        return *k;
    }

    void* take(std::size_t n) {
        note_used();
        if (n == block) {
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
        if (!p) return;
        // Any malloc'd block that holds `block` bytes serves a later take(block): the
        // receive buffers, from the heap or mapped whole pages. But no more are kept than
        // receive buffers were ever made fresh (about the most transfers at once): blocks
        // of that size that are not receive buffers (what a paused transfer had received,
        // kept by libcurl until it resumes) would otherwise fill every slot in time, 32
        // MiB resident that no transfer asks for.
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

    /// Blocks kept now; take(block) calls served from them; whether libcurl ever called in
    /// (false: the program set libcurl up before sluice, with its own memory functions).
    std::size_t kept() const {
        std::size_t n = 0;
        for (auto& s : slots_) n += s.load(std::memory_order_relaxed) != nullptr;
        return n;
    }
    std::size_t reused() const { return reused_.load(std::memory_order_relaxed); }
    bool used() const { return used_.load(std::memory_order_relaxed); }
    void note_used() noexcept {
        if (!used_.load(std::memory_order_relaxed)) used_.store(true, std::memory_order_relaxed);  // no write per call
    }

private:
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
    // malloc'd block, which give() tells apart by its usable size.
    curl_buffer_keeper::get().note_used();
    return std::realloc(p, n);
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
