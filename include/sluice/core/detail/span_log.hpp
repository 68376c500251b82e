#pragma once
// Where a channel wait is counted (detail::wait_meter) and, when a pipeline is traced,
// the spans of time a worker spent waiting (detail::span_log), from which the Chrome
// trace draws each worker's busy and waiting time (core/detail/trace.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace sluice::detail {

/// The waits of one worker (or of the consumer), in the order they ended. Kept only
/// while a trace is asked for; at most `max` spans, then counted as dropped.
class span_log {
public:
    enum kind : std::uint8_t { wait_input = 0, wait_output = 1 };
    struct span {
        std::uint64_t start_ns, end_ns;
        std::uint8_t kind;
    };
    /// 65,536 spans (1.5 MiB) per worker at most: a minute of waits at 1,000 per second.
    static constexpr std::size_t default_max = 65536;
    /// 262,144 spans (6 MiB) for a whole pipeline, shared by its workers.
    static constexpr std::size_t pipeline_max = 262144;
    explicit span_log(std::size_t max = default_max) : max_(max) {}

    // Locked, though each worker writes its own log: the consumer's may be written by
    // more than one thread, and a wait that suspends has time to spare for a lock.
    void add(std::uint64_t start_ns, std::uint64_t end_ns, std::uint8_t k) {
        std::lock_guard lock(m_);
        if (spans_.size() < max_) {
            spans_.push_back({start_ns, end_ns, k});
        } else {
            ++dropped_;
        }
    }
    std::vector<span> spans() const {
        std::lock_guard lock(m_);
        return spans_;
    }
    std::uint64_t dropped() const {
        std::lock_guard lock(m_);
        return dropped_;
    }

private:
    mutable std::mutex m_;
    std::size_t max_;
    std::vector<span> spans_;
    std::uint64_t dropped_ = 0;
};

/// Where a channel operation counts the time it spent suspended: nanoseconds added to
/// `ns`, and the span kept in `log` when the pipeline is traced. Converts from a plain
/// counter (or nullptr: not counted).
struct wait_meter {
    std::atomic<std::uint64_t>* ns = nullptr;
    span_log* log = nullptr;
    std::uint8_t kind = span_log::wait_input;

    wait_meter() = default;
    wait_meter(std::nullptr_t) {}
    wait_meter(std::atomic<std::uint64_t>* n) : ns(n) {}
    wait_meter(std::atomic<std::uint64_t>* n, span_log* l, std::uint8_t k) : ns(n), log(l), kind(k) {}
    explicit operator bool() const noexcept { return ns != nullptr; }
    void add(std::uint64_t start_ns, std::uint64_t end_ns) const {
        ns->fetch_add(end_ns - start_ns, std::memory_order_relaxed);
        if (log) log->add(start_ns, end_ns, kind);
    }
};

}  // namespace sluice::detail
