#pragma once
// The one retry policy of the network layer, shared by fetch and S3 listing: which
// failures are transient, and capped exponential backoff with full jitter.

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>

namespace sluice::detail {

/// Connection errors, timeouts, cut bodies, HTTP/2 and TLS handshake failures.
inline bool retryable_curl(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
        return true;
    default:
        return false;
    }
}
/// 408, 429, 500, 502, 503 (S3's SlowDown), 504.
inline bool retryable_status(long s) { return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504; }

/// `retries` more attempts after the first, each after a wait drawn uniformly from
/// [0, min(cap, base * 2^attempt)] ("full jitter": many clients backing off at once spread
/// out instead of returning together).
struct backoff_policy {
    unsigned retries = 8;
    std::chrono::milliseconds base{100};
    std::chrono::milliseconds cap{5000};

    /// The wait before retry number `attempt` (0 for the first retry).
    template <class Rng>
    std::chrono::milliseconds delay(unsigned attempt, Rng& rng) const {
        const long long ceiling = std::min<long long>(cap.count(), base.count() << std::min(attempt, 20u));
        if (ceiling <= 0) return std::chrono::milliseconds(0);
        return std::chrono::milliseconds(static_cast<long long>(rng() % static_cast<unsigned long long>(ceiling + 1)));
    }
};

/// A seed for a backoff's jitter: the process's one draw from std::random_device, mixed
/// with a count, so workers and processes back off apart. (std::random_device is opened
/// once: on these VMs each construction cost about 10 us of CPUID and a file, 64 of them
/// per fetch stage.)
inline std::uint32_t jitter_seed() {
    static const std::uint64_t base = [] {
        std::random_device rd;
        return (std::uint64_t{rd()} << 32) | rd();
    }();
    static std::atomic<std::uint64_t> count{0};
    // The pid too: a process forked after the first call (a DataLoader's workers) shares
    // base and count with its parent and siblings.
    std::uint64_t z = base ^ (std::uint64_t(::getpid()) << 32);
    z += 0x9e3779b97f4a7c15ull * (count.fetch_add(1, std::memory_order_relaxed) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's finaliser
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<std::uint32_t>(z ^ (z >> 31));
}

}  // namespace sluice::detail
