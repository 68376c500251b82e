#pragma once
// How many of a stage's workers may take work (pipeline_options::tune). A tuned stage
// (map, decode_images, batch's collation, read) still starts all its `.concurrency`
// workers; before taking an item, worker i passes the gate only while i < active. The
// tuner moves `active` between 1 and `.concurrency` (a knob, core/detail/tuning.hpp).
//
// A worker waits at the gate holding nothing: no item, no turnstile ticket (an ordered
// stage hands out tickets as items are received), so lowering `active` cannot stall the
// workers that keep going, and raising it wakes the waiting ones on the stage's executor.
// The time a worker waits there is counted as waiting for input (the stage was given no
// work), and the tuner and the bottleneck divide the stage's busy time by its active
// workers (stage_figures::active).
// Once any worker ends (end of input, an error, a stop) the gate opens for good, so every
// worker reaches its input and ends the same way; a stop opens it too.

#include <sluice/core/channel.hpp>  // now_ns
#include <sluice/core/stats.hpp>
#include <sluice/core/task.hpp>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace sluice::detail {

class worker_gate {
public:
    worker_gate(unsigned workers, executor ex) : workers_(workers), active_(workers), ex_(std::move(ex)) {}

    unsigned active() const noexcept { return active_.load(std::memory_order_relaxed); }

    /// Lets the first `n` workers (1..workers) take work; wakes those now let through.
    void set(unsigned n) {
        n = n < 1 ? 1 : (n > workers_ ? workers_ : n);
        std::vector<std::coroutine_handle<>> wake;
        {
            std::lock_guard lock(m_);
            active_.store(n, std::memory_order_relaxed);
            take(wake);
        }
        for (auto h : wake) resume_on(ex_, h);
    }
    /// Every worker passes from now on.
    void open() {
        std::vector<std::coroutine_handle<>> wake;
        {
            std::lock_guard lock(m_);
            open_.store(true, std::memory_order_release);
            take(wake);
        }
        for (auto h : wake) resume_on(ex_, h);
    }

    struct pass_op {
        worker_gate* g;
        unsigned worker;
        worker_counters* c;
        std::uint64_t t0 = 0;
        bool await_ready() const noexcept {
            return !g || g->open_.load(std::memory_order_acquire) || worker < g->active();
        }
        bool await_suspend(std::coroutine_handle<> h) {
            std::lock_guard lock(g->m_);
            if (g->open_.load(std::memory_order_relaxed) || worker < g->active()) return false;
            t0 = now_ns();  // before the handle is visible to a waker
            c->gated_since_ns.store(t0, std::memory_order_relaxed);
            g->waiting_.push_back({worker, h});
            return true;
        }
        void await_resume() const {
            if (!t0) return;
            // No longer pending, then counted (release): a snapshot that sees it counted
            // (acquire) sees it no longer pending (snapshot in core/stats.hpp reads in the
            // other order), so a wait is counted short for an instant, never twice.
            const std::uint64_t t1 = now_ns();
            c->gated_since_ns.store(0, std::memory_order_relaxed);
            c->wait_in_ns.fetch_add(t1 - t0, std::memory_order_release);
            if (c->spans) c->spans->add(t0, t1, span_log::wait_input);
        }
    };
    /// `co_await worker_gate::pass(gate, i, counters)` before worker i takes an item; the wait counts as
    /// waiting for input. A null gate passes at once.
    static pass_op pass(worker_gate* g, unsigned worker, worker_counters& c) { return {g, worker, &c}; }

private:
    // Under m_: the waiting workers the gate now lets through.
    void take(std::vector<std::coroutine_handle<>>& wake) {
        const bool open = open_.load(std::memory_order_relaxed);
        const unsigned n = active_.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < waiting_.size();) {
            if (open || waiting_[i].first < n) {
                wake.push_back(waiting_[i].second);
                waiting_[i] = waiting_.back();
                waiting_.pop_back();
            } else {
                ++i;
            }
        }
    }

    const unsigned workers_;
    std::atomic<unsigned> active_;  // written under m_
    std::atomic<bool> open_{false};  // written under m_
    executor ex_;
    std::mutex m_;
    std::vector<std::pair<unsigned, std::coroutine_handle<>>> waiting_;
};

}  // namespace sluice::detail
