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
// `kept_max`; a block is reused only for a request of the size it was made for.
//
// curl_global_init_mem takes effect only when it is the process's first global set-up of
// libcurl; where the program set libcurl up before sluice, its memory functions stand and
// nothing is kept (the transfers work the same).

#include <curl/curl.h>

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

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

    curl_buffer_keeper() { kept_.reserve(kept_max); }
    ~curl_buffer_keeper() {
        for (void* p : kept_) std::free(p);
    }
    curl_buffer_keeper(const curl_buffer_keeper&) = delete;
    curl_buffer_keeper& operator=(const curl_buffer_keeper&) = delete;

    /// The one libcurl's memory functions use.
    static curl_buffer_keeper& get() {
        static curl_buffer_keeper* k = new curl_buffer_keeper;  // never destroyed: libcurl may free at exit
        return *k;
    }

    void* take(std::size_t n) {
        if (n == block) {
            std::lock_guard lock(m_);
            if (!kept_.empty()) {
                void* p = kept_.back();
                kept_.pop_back();
                ++reused_;
                return p;
            }
        }
        return std::malloc(n);
    }
    void give(void* p) {
        if (!p) return;
        // Any malloc'd block that holds `block` bytes serves a later take(block): the
        // receive buffers, from the heap or (the first few, before glibc raises its mmap
        // threshold) mapped whole pages.
        const std::size_t usable = ::malloc_usable_size(p);
        if (usable >= block && usable <= block + 8192) {
            std::lock_guard lock(m_);
            if (kept_.size() < kept_max) {
                kept_.push_back(p);
                return;
            }
        }
        std::free(p);
    }

    /// Blocks kept now, and how many take(block) calls were served from them.
    std::size_t kept() {
        std::lock_guard lock(m_);
        return kept_.size();
    }
    std::size_t reused() {
        std::lock_guard lock(m_);
        return reused_;
    }

private:
    std::mutex m_;
    std::vector<void*> kept_;
    std::size_t reused_ = 0;
};

inline void* curl_keeper_malloc(std::size_t n) { return curl_buffer_keeper::get().take(n); }
inline void curl_keeper_free(void* p) { curl_buffer_keeper::get().give(p); }
inline void* curl_keeper_realloc(void* p, std::size_t n) {
    // A kept-size block grown or shrunk is libcurl's ordinary realloc; the result is any
    // malloc'd block, which give() tells apart by its usable size.
    return std::realloc(p, n);
}
inline char* curl_keeper_strdup(const char* s) { return ::strdup(s); }
inline void* curl_keeper_calloc(std::size_t n, std::size_t size) { return std::calloc(n, size); }

/// libcurl's global set-up, once per process: true when it succeeded.
inline bool curl_global() {
    static const bool ok = [] {
        return curl_global_init_mem(CURL_GLOBAL_DEFAULT, &curl_keeper_malloc, &curl_keeper_free, &curl_keeper_realloc,
                                    &curl_keeper_strdup, &curl_keeper_calloc) == CURLE_OK;
    }();
    return ok;
}

}  // namespace sluice::detail
