#pragma once
// What a decoder holds between chunks (a line, object or record cut by chunk boundaries):
// how it is counted in the stage's stats ("held_bytes" now, "held_bytes_peak"), the limit
// message every format gives, and a block that grows without doubling its peak.

#include <sluice/core/bytes.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

namespace sluice::detail {

/// The stage's "held_bytes" and "held_bytes_peak" counters (null: not counted). Several
/// shards' parsers of one stage share them.
struct held_meter {
    std::atomic<std::uint64_t>* now = nullptr;
    std::atomic<std::uint64_t>* peak = nullptr;

    void add(std::uint64_t n) const noexcept {
        if (!now || !n) return;
        const std::uint64_t v = now->fetch_add(n, std::memory_order_relaxed) + n;
        if (!peak) return;
        std::uint64_t p = peak->load(std::memory_order_relaxed);
        while (v > p && !peak->compare_exchange_weak(p, v, std::memory_order_relaxed)) {
        }
    }
    void sub(std::uint64_t n) const noexcept {
        if (now && n) now->fetch_sub(n, std::memory_order_relaxed);
    }
};

/// Bytes one parser holds, reflected in a held_meter; given back when it is destroyed.
class held_count {
public:
    held_count() = default;
    held_count(const held_count&) = delete;
    held_count& operator=(const held_count&) = delete;
    ~held_count() { set(0); }

    void use(const held_meter* m) noexcept { meter_ = m; }
    /// Now holding `n` bytes.
    void set(std::uint64_t n) noexcept {
        if (meter_) {
            if (n > n_) meter_->add(n - n_);
            else meter_->sub(n_ - n);
        }
        n_ = n;
    }
    std::uint64_t get() const noexcept { return n_; }

private:
    const held_meter* meter_ = nullptr;
    std::uint64_t n_ = 0;
};

/// " over the limit of N bytes (raise it with max_record_bytes)": every format's words.
inline std::string over_limit(std::uint64_t limit) {
    return " over the limit of " + std::to_string(limit) + " bytes (raise it with max_record_bytes)";
}

/// A record assembled from pieces: one malloc'd block grown with realloc, which glibc
/// does for large blocks by remapping pages (no copy, so the peak is the record plus
/// the piece being appended, not twice the record). Given out as bytes without a copy.
class growable_block {
public:
    growable_block() = default;
    growable_block(const growable_block&) = delete;
    growable_block& operator=(const growable_block&) = delete;
    ~growable_block() { std::free(p_); }

    std::size_t size() const noexcept { return len_; }

    /// Appends n bytes; the block never grows past `cap_limit` bytes (the caller checks
    /// the record limit before appending).
    void append(const std::byte* s, std::size_t n, std::size_t cap_limit) {
        if (!n) return;
        if (len_ + n > cap_) {
            std::size_t want = std::max<std::size_t>(cap_ * 2, 64u << 10);
            if (want > cap_limit) want = cap_limit;
            if (want < len_ + n) want = len_ + n;
            void* q = std::realloc(p_, want);
            if (!q) throw std::bad_alloc();
            p_ = static_cast<std::byte*>(q);
            cap_ = want;
        }
        std::memcpy(p_ + len_, s, n);
        len_ += n;
    }

    /// The bytes held, as one slice of a buffer of their own (trimmed to size); empties
    /// the block.
    bytes release() {
        if (!len_) {
            clear();
            return {};
        }
        if (cap_ > len_) {  // give back the slack (in place for large blocks)
            if (void* q = std::realloc(p_, len_)) {
                p_ = static_cast<std::byte*>(q);
                cap_ = len_;
            }
        }
        auto b = std::make_shared<buffer>(p_, cap_, [](std::byte* d, std::size_t) noexcept { std::free(d); });
        const std::size_t n = len_;
        p_ = nullptr;
        len_ = cap_ = 0;
        return bytes(std::move(b), n);
    }

    void clear() noexcept {
        std::free(p_);
        p_ = nullptr;
        len_ = cap_ = 0;
    }

private:
    std::byte* p_ = nullptr;
    std::size_t len_ = 0, cap_ = 0;
};

}  // namespace sluice::detail
