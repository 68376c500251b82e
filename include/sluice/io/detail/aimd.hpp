#pragma once
// The request budget of a fetch stage: additive increase, multiplicative decrease (as TCP
// does with losses), with permits every request takes.

#include <sluice/core/task.hpp>
#include <sluice/io/detail/node_limit.hpp>

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace sluice::detail {

/// The stage's request budget: additive increase, multiplicative decrease. Every request
/// takes a permit — first requests, parts and retries, ordered or not — so under 503s the
/// requests in flight shrink for all of them. Permits go in the order asked. Two cases go
/// ahead over the limit rather than wait, since waiting could close a cycle: a request of
/// a worker that already holds permits (its other parts finish without it), and, in an
/// ordered stage, the object whose turn it is (later objects may hold every permit while
/// they wait for their turn). So the requests in flight exceed the limit by at most one
/// per worker, and only while those cases last.
/// With a node_limit shared (fetch_options::shared_limit), the limit, the halving and the
/// back-off are the node's: a permit needs room under this process's ceiling and in the
/// node's count, and waiters also look again every tick (other processes' releases wake
/// no one here).
/// A waiter's timer is touched by its handler, by release() (through a post) and by a
/// stop (through a post): every waiter must run on one single-threaded executor (fetch's
/// workers all await permits on the I/O loop).
class aimd_limit : public std::enable_shared_from_this<aimd_limit> {
    struct wait_state {
        std::coroutine_handle<> h;
        std::optional<asio::steady_timer> timer;
        std::uint64_t* seq = nullptr;
        std::function<bool()> go_ahead;  // asked every tick while waiting
        std::uint64_t priority = 0;      // lowest first
        bool granted = false, ended = false, stop = false;
    };

public:
    aimd_limit(unsigned max, unsigned min) : max_(std::max(1u, max)), min_(std::clamp(min, 1u, max_)), limit_(max_) {}

    /// Shares the limit with the other processes of the node (before any permit is taken).
    void share(std::unique_ptr<node_limit> node) {
        std::lock_guard lock(m_);
        node_ = std::move(node);
    }
    const node_limit* node() const noexcept { return node_.get(); }

    /// How often a waiter asks `go_ahead` (an ordered stage: is it my turn?).
    static constexpr std::chrono::milliseconds tick{20};
    /// How often the first waiter looks at a shared limit (other processes' releases do
    /// not wake it): a request at 20 ms of latency frees a permit about this often.
    static constexpr std::chrono::milliseconds node_tick{2};

    struct acquire_op {
        std::shared_ptr<aimd_limit> l;
        std::shared_ptr<wait_state> w;
        bool await_ready() {
            std::lock_guard lock(l->m_);
            if (!l->take(w->seq)) {
                if (!w->go_ahead || !w->go_ahead()) return false;
                l->take_unchecked(w->seq);
            }
            w->granted = true;
            w->ended = true;
            return true;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            w->h = h;
            w->timer.emplace(h.promise().ex);
            {
                std::lock_guard lock(l->m_);
                auto at = std::upper_bound(l->waiters_.begin(), l->waiters_.end(), w->priority,
                                           [](std::uint64_t p, const auto& x) { return p < x->priority; });
                l->waiters_.insert(at, w);
            }
            l->arm(w);
        }
        /// Whether a permit was taken (not when the wait ended by a stop).
        bool await_resume() const noexcept { return w->granted; }
    };
    /// `co_await acquire(&seq, go_ahead, cancel, ticket)`: a permit; `seq` gets the
    /// request's sequence number (for release). `go_ahead`, if given, is asked while
    /// waiting: true takes a permit over the limit. `cancel`, if given, receives a function
    /// that ends the wait without a permit (for a stop; call it on the waiter's executor).
    /// Waiters get permits in the order of `ticket` when given (an ordered stage: the
    /// object whose turn is nearest first), else in the order they asked.
    acquire_op acquire(std::uint64_t* seq, std::function<bool()> go_ahead = nullptr,
                       std::function<void()>* cancel = nullptr, std::optional<std::uint64_t> ticket = {}) {
        auto w = std::make_shared<wait_state>();
        w->seq = seq;
        w->go_ahead = std::move(go_ahead);
        {
            std::lock_guard lock(m_);
            w->priority = ticket ? *ticket : arrivals_++;
        }
        if (cancel)
            *cancel = [w] {
                w->stop = true;
                if (w->timer) w->timer->cancel();
            };
        return acquire_op{shared_from_this(), std::move(w)};
    }
    /// A permit over the limit, at once (see the class comment for when).
    void take_over(std::uint64_t* seq) {
        std::lock_guard lock(m_);
        take_unchecked(seq);
    }
    bool try_acquire(std::uint64_t* seq) {
        std::lock_guard lock(m_);
        return take(seq);
    }
    /// A request ended: `throttled` for 503/429 (halve, once per round: not again for
    /// requests started before the last halving), `ok` for a success (grow).
    void release(std::uint64_t seq, bool ok, bool throttled) {
        std::vector<std::shared_ptr<wait_state>> wake;
        {
            std::lock_guard lock(m_);
            if (active_) --active_;
            if (node_) {
                node_->release(seq, ok, throttled);
            } else if (throttled && seq >= round_) {
                limit_ = std::max<double>(min_, limit_ / 2);
                round_ = next_seq_;
            } else if (ok) {
                limit_ = std::min<double>(max_, limit_ + 1.0 / limit_);
            }
            grant_waiters(wake);
        }
        wake_up(wake);
    }
    unsigned limit() const {
        std::lock_guard lock(m_);
        return allowed();
    }
    /// The ceiling (the tuner moves it, pipeline_options::tune): AIMD's limit stays at or
    /// below it; a higher one lets waiting requests go at once.
    void set_max(unsigned m) {
        std::vector<std::shared_ptr<wait_state>> wake;
        {
            std::lock_guard lock(m_);
            const unsigned before = max_;
            max_ = std::max(1u, m);
            min_ = std::min(min_, max_);
            // Raised: the limit starts at the new ceiling. Lowered: the limit stays where AIMD
            // had it, if that is below (a backed-off limit is not undone).
            if (max_ > before || limit_ > max_) limit_ = max_;
            grant_waiters(wake);
        }
        wake_up(wake);
    }
    unsigned max() const {
        std::lock_guard lock(m_);
        return max_;
    }
    /// Gauges kept up to date with the limit and the requests holding permits (stats).
    void watch(std::atomic<std::uint64_t>* limit, std::atomic<std::uint64_t>* active) {
        std::lock_guard lock(m_);
        limit_gauge_ = limit;
        active_gauge_ = active;
        publish();
    }
    /// Requests holding a permit now.
    unsigned active() const {
        std::lock_guard lock(m_);
        return active_;
    }

private:
    // Permits for the first waiters while the limit allows (m_ held); they wake after.
    void grant_waiters(std::vector<std::shared_ptr<wait_state>>& wake) {
        while (!waiters_.empty() && active_ < local_cap()) {
            auto w = waiters_.front();
            if (node_) {
                if (!node_->try_take(w->seq)) break;
                ++active_;
            } else {
                take_unchecked(w->seq);
            }
            waiters_.pop_front();
            w->granted = true;
            wake.push_back(std::move(w));
        }
        publish();
    }
    // The waiter resumes from its timer's handler, which a cancel runs now.
    static void wake_up(const std::vector<std::shared_ptr<wait_state>>& wake) {
        for (auto& w : wake) asio::post(w->timer->get_executor(), [w] { w->timer->cancel(); });
    }
    void arm(const std::shared_ptr<wait_state>& w) {
        std::chrono::steady_clock::duration d = std::chrono::hours(24);
        {
            std::lock_guard lock(m_);
            if (node_ && !waiters_.empty() && waiters_.front() == w) d = node_tick;  // the next to go
            else if (w->go_ahead || node_) d = tick;
        }
        w->timer->expires_after(d);
        w->timer->async_wait([self = shared_from_this(), w](const std::error_code&) { self->on_tick(w); });
    }
    // The one place a waiter resumes: granted, stopped, allowed to go ahead, or waits on.
    void on_tick(const std::shared_ptr<wait_state>& w) {
        bool resume = false;
        std::vector<std::shared_ptr<wait_state>> wake;
        {
            std::lock_guard lock(m_);
            if (w->ended) return;
            if (node_ && !w->granted && !w->stop) {  // room another process freed, or the back-off over
                grant_waiters(wake);
                std::erase(wake, w);  // resumes below
            }
            if (!w->granted && (w->stop || (w->go_ahead && w->go_ahead()))) {
                std::erase(waiters_, w);
                if (!w->stop) {
                    take_unchecked(w->seq);
                    w->granted = true;
                }
            }
            resume = w->granted || w->stop;
            w->ended = resume;
        }
        wake_up(wake);
        if (resume) w->h.resume();
        else arm(w);
    }
    unsigned allowed() const {
        return node_ ? std::min(node_->allowed(), max_) : static_cast<unsigned>(std::min<double>(limit_, max_));
    }
    // This process's own bound: shared, the node's limit is checked by node_->try_take.
    unsigned local_cap() const { return node_ ? max_ : allowed(); }
    bool take(std::uint64_t* seq) {  // m_ held
        if (active_ >= local_cap() || !waiters_.empty()) return false;  // first come, first served
        if (node_) {
            if (!node_->try_take(seq)) return false;
            ++active_;
            publish();
            return true;
        }
        take_unchecked(seq);
        return true;
    }
    void take_unchecked(std::uint64_t* seq) {
        ++active_;
        if (node_) node_->take_forced(seq);
        else *seq = next_seq_++;
        publish();
    }
    void publish() {  // m_ held
        if (limit_gauge_) limit_gauge_->store(allowed(), std::memory_order_relaxed);
        if (active_gauge_) active_gauge_->store(active_, std::memory_order_relaxed);
    }
    mutable std::mutex m_;
    unsigned max_, min_;
    double limit_;
    unsigned active_ = 0;
    std::uint64_t next_seq_ = 0, round_ = 0;
    std::uint64_t arrivals_ = 0;
    std::deque<std::shared_ptr<wait_state>> waiters_;  // by priority
    std::unique_ptr<node_limit> node_;  // shared with the node's other processes, if asked
    std::atomic<std::uint64_t>* limit_gauge_ = nullptr;
    std::atomic<std::uint64_t>* active_gauge_ = nullptr;
};

}  // namespace sluice::detail
