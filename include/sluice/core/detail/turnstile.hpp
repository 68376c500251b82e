#pragma once
// Turnstile: lets the N workers of an ordered stage emit in input order. Worker with
// ticket i waits until tickets 0..i-1 are done; done(i) lets ticket i+1 through.
// cancel() wakes every waiter with a stop, so shutdown never waits on a turn.

#include <sluice/core/channel.hpp>
#include <sluice/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

namespace sluice::detail {

class turnstile {
    struct turn_waiter : waiter {
        std::uint64_t ticket = 0;
        bool ok = false;
    };

public:
    class awaiter {
    public:
        awaiter(turnstile& t, std::uint64_t ticket) : t_(t) { w_.ticket = ticket; }
        // Locked from a false await_ready to the end of await_suspend; unlocking is the
        // last touch of *this (see channel's send_awaiter).
        bool await_ready() {
            t_.m_.lock();
            if (t_.cancelled_ || t_.next_ == w_.ticket) {
                w_.ok = !t_.cancelled_;
                t_.m_.unlock();
                return true;
            }
            return false;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            w_.h = h;
            w_.ex = h.promise().ex;
            t_.waiting_.push_back(&w_);
            t_.m_.unlock();
        }
        void await_resume() const {
            if (!w_.ok) throw stopped{};
        }

    private:
        turnstile& t_;
        turn_waiter w_;
    };

    awaiter wait(std::uint64_t ticket) { return awaiter{*this, ticket}; }

    /// The ticket whose turn it is now.
    std::uint64_t current() const {
        std::lock_guard lock(m_);
        return next_;
    }

    void done(std::uint64_t ticket) {
        wake_after_unlock wakes;
        std::lock_guard lock(m_);
        next_ = ticket + 1;
        // Usually one waiter holds the next ticket; several workers that all saw the end
        // of input with an error share the ticket after the last item.
        auto it = std::partition(waiting_.begin(), waiting_.end(),
                                 [&](turn_waiter* w) { return w->ticket != next_; });
        for (auto j = it; j != waiting_.end(); ++j) {
            (*j)->ok = true;
            (*j)->wake();
        }
        waiting_.erase(it, waiting_.end());
    }

    void cancel() {
        wake_after_unlock wakes;
        std::lock_guard lock(m_);
        cancelled_ = true;
        for (auto* w : waiting_) w->wake();  // ok stays false
        waiting_.clear();
    }

private:
    mutable std::mutex m_;
    std::uint64_t next_ = 0;
    bool cancelled_ = false;
    std::vector<turn_waiter*> waiting_;
};

}  // namespace sluice::detail
