#pragma once
// sluice::channel<T>: the bounded multi-producer multi-consumer queue between stages.
//
// Rules (each has a test in tests/unit/core/channel.cpp):
// - send suspends while the channel is full (in items, or in bytes when a byte budget is
//   set); receive suspends while it is empty.
// - Producers register with add_producer() and finish with producer_done(); when the last
//   one is done the channel closes. A closed channel still delivers everything it
//   buffered, then "end" (an empty optional). Asio 1.22's channel drops buffered items on
//   close, which is why this one is our own.
// - An error passed to producer_done()/close() reaches receivers after the buffered items,
//   as an exception thrown from receive.
// - cancel() is the consumer saying "stop": buffered items are destroyed, every waiting
//   sender and receiver wakes, later sends fail (return false) and later receives end.
// - One item larger than the byte budget is admitted when the channel is empty, so an
//   oversized item slows the pipeline down instead of deadlocking it.
//
// Suspended coroutines are resumed by posting to their own executor, once the mutex is
// released (detail::wake_after_unlock); ordinary threads
// (the trainer's) block on a condition variable with send_blocking/receive_blocking.
// Everything is guarded by one mutex: a hop costs one uncontended lock on the fast path.

#include <sluice/core/detail/span_log.hpp>
#include <sluice/core/task.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

/// How many bytes an item holds, for channels with a byte budget: the item's
/// `byte_size()` member if it has one, the length of a std::string, otherwise 0.
template <class T>
std::size_t byte_size_of(const T& v) {
    if constexpr (requires {
                      { v.byte_size() } -> std::convertible_to<std::size_t>;
                  })
        return static_cast<std::size_t>(v.byte_size());
    else if constexpr (std::is_same_v<T, std::string>)
        return v.size();
    else
        return 0;
}

/// Whether byte_size_of counts T's bytes (else a byte limit cannot bound a channel of T).
template <class T>
inline constexpr bool weighs_bytes = requires(const T& v) {
    { v.byte_size() } -> std::convertible_to<std::size_t>;
} || std::is_same_v<T, std::string>;

/// Capacity of a channel: at most `items` items and, when `bytes` is non-zero, at most
/// `bytes` bytes (as counted by byte_size_of).
struct channel_limits {
    std::size_t items = 64;
    std::size_t bytes = 0;
};

namespace detail {
inline std::uint64_t now_ns() noexcept {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
}
/// Holds the coroutine wake-ups a channel or turnstile decides under its mutex until the
/// mutex is released (declared before the lock, it ends after it): posting a resumption
/// may wake a sleeping pool thread (a futex call), and a woken coroutine that goes for the
/// same mutex at once would otherwise find it still held and sleep on it too. Per thread
/// and nested: the outermost one posts. A waiter, once popped from its queue, is resumed
/// only by this post, so it waits for it in place. A post that fails (memory exhausted)
/// ends the process from this destructor: its coroutine would otherwise wait for good.
class wake_after_unlock {
public:
    wake_after_unlock() noexcept { ++depth(); }
    wake_after_unlock(const wake_after_unlock&) = delete;
    wake_after_unlock& operator=(const wake_after_unlock&) = delete;
    ~wake_after_unlock() {
        if (--depth() != 0) return;
        auto& l = held();
        for (std::size_t i = 0; i < l.size(); ++i) resume_on(l[i].ex, l[i].h);
        l.clear();
    }
    /// Whether a wake-up now is held (else it is posted at once).
    static bool holding() noexcept { return depth() != 0; }
    static void hold(const executor& ex, std::coroutine_handle<> h) { held().push_back({ex, h}); }

private:
    struct wakeup {
        executor ex;
        std::coroutine_handle<> h;
    };
    static unsigned& depth() noexcept {
        thread_local unsigned d = 0;
        return d;
    }
    static std::vector<wakeup>& held() {
        thread_local std::vector<wakeup> l;
        return l;
    }
};

struct waiter {
    waiter* next = nullptr;
    std::coroutine_handle<> h;
    executor ex;
    std::condition_variable* cv = nullptr;
    bool woken = false;
    // Called with the channel's mutex held; the waiter may be gone as soon as the
    // coroutine resumes, so copy what we need before posting. A blocked thread is
    // notified under the mutex (its condition variable lives only while it waits); a
    // coroutine's resumption is held for the end of the lock where a wake_after_unlock is
    // in scope.
    void wake() {
        woken = true;
        if (cv) {
            cv->notify_one();
        } else if (wake_after_unlock::holding()) {
            wake_after_unlock::hold(ex, h);
        } else {
            auto handle = h;
            auto e = ex;
            detail::resume_on(e, handle);
        }
    }
};
template <class W>
struct waiter_queue {
    W* head = nullptr;
    W* tail = nullptr;
    bool empty() const noexcept { return head == nullptr; }
    void push(W* w) noexcept {
        w->next = nullptr;
        if (tail)
            tail->next = w;
        else
            head = w;
        tail = w;
    }
    W* pop() noexcept {
        W* w = head;
        head = static_cast<W*>(w->next);
        if (!head) tail = nullptr;
        return w;
    }
    void remove(W* w) noexcept {  // a waiter that gave up
        W* prev = nullptr;
        for (W* p = head; p; prev = p, p = static_cast<W*>(p->next)) {
            if (p != w) continue;
            if (prev) prev->next = p->next;
            else head = static_cast<W*>(p->next);
            if (tail == p) tail = prev;
            return;
        }
    }
};
}  // namespace detail

template <class T>
class channel {
public:
    explicit channel(channel_limits limits = {})
        : limits_{limits.items ? limits.items : 1, limits.bytes}, items_(limits_.items), ring_(items_) {}
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;

    // ---- producer side -------------------------------------------------------------

    /// Register `n` more producers; the channel closes when as many producer_done() calls
    /// have been made.
    void add_producer(std::size_t n = 1) {
        std::lock_guard lock(m_);
        producers_ += n;
    }

    /// A producer has finished; `error`, if any, reaches receivers after the buffered
    /// items (the first error wins).
    void producer_done(std::exception_ptr error = nullptr) {
        detail::wake_after_unlock wakes;
        std::lock_guard lock(m_);
        if (error && !error_) error_ = error;
        if (producers_ > 0 && --producers_ == 0) close_locked();
    }

    /// Close now: no more sends; receivers get what is buffered, then end or `error`.
    void close(std::exception_ptr error = nullptr) {
        detail::wake_after_unlock wakes;
        std::lock_guard lock(m_);
        if (error && !error_) error_ = error;
        close_locked();
    }

    class send_awaiter;
    /// `co_await ch.send(v)`: true once the channel took the item, false when it was
    /// cancelled or closed (the item is then destroyed). `wait_ns`, if given, accumulates
    /// the time spent suspended waiting for room.
    send_awaiter send(T v, detail::wait_meter wait_ns = {}) {
        return send_awaiter{*this, std::move(v), wait_ns};
    }

    class drained_awaiter;
    /// `co_await ch.drained()`: true once the channel holds nothing, every item sent before
    /// it taken, without sending anything; false when it was cancelled or closed. It waits
    /// in line with senders: those queued after it wait for it. Whatever the capacity (the
    /// tuner may raise it), a producer that awaits it after each send has at most one item
    /// in the channel. `wait_ns` as for send.
    drained_awaiter drained(detail::wait_meter wait_ns = {}) { return drained_awaiter{*this, wait_ns}; }

    /// Blocking send for an ordinary thread.
    bool send_blocking(T v) {
        const std::size_t weight = weigh(v);
        detail::wake_after_unlock wakes;
        std::unique_lock lock(m_);
        if (int r = try_send_locked(v, weight); r >= 0) return r == 1;
        std::condition_variable cv;
        send_waiter w;
        w.cv = &cv;
        w.item = &v;
        w.weight = weight;
        senders_.push(&w);
        cv.wait(lock, [&] { return w.woken; });
        return w.ok;
    }

    // ---- consumer side -------------------------------------------------------------

    class receive_awaiter;
    /// `co_await ch.receive()`: the next item, or an empty optional at the end (after
    /// close or cancel). Throws the producer's error once the buffered items are drained.
    /// `index`, if given, receives the item's position in the order items left the
    /// channel (0, 1, 2, ...), which ordered stages use to restore input order; at the end
    /// (or error) it receives the number of items that left.
    receive_awaiter receive(detail::wait_meter wait_ns = {}, std::uint64_t* index = nullptr) {
        return receive_awaiter{*this, wait_ns, index};
    }

    /// Blocking receive for an ordinary thread (the trainer's).
    std::optional<T> receive_blocking(detail::wait_meter wait_ns = {}) {
        return receive_blocking_until(std::nullopt, wait_ns);
    }

    /// receive_blocking that gives up after `timeout`: empty then (and at the end).
    std::optional<T> receive_blocking_for(std::chrono::milliseconds timeout,
                                          detail::wait_meter wait_ns = {}) {
        return receive_blocking_until(std::chrono::steady_clock::now() + timeout, wait_ns);
    }

    /// The consumer stops: drop what is buffered and wake everyone; later sends fail.
    void cancel() {
        std::function<void()> hook;
        {
            detail::wake_after_unlock wakes;
            std::lock_guard lock(m_);
            if (cancelled_) return;
            cancelled_ = true;
            while (count_ > 0) pop_locked();
            while (!senders_.empty()) senders_.pop()->wake();  // ok stays false
            while (!receivers_.empty()) receivers_.pop()->wake();
            hook = std::move(on_cancel_);
        }
        if (hook) hook();
    }

    /// Runs `f` once, on the thread that first cancels the channel (outside its lock): the
    /// producing stage learns that its consumer is gone. Set before the channel is used.
    void on_cancel(std::function<void()> f) {
        std::lock_guard lock(m_);
        on_cancel_ = std::move(f);
    }

    // ---- observers -------------------------------------------------------------------
    bool cancelled() const {
        std::lock_guard lock(m_);
        return cancelled_;
    }
    bool closed() const {
        std::lock_guard lock(m_);
        return closed_;
    }
    std::size_t size() const {
        std::lock_guard lock(m_);
        return count_;
    }
    std::size_t buffered_bytes() const {
        std::lock_guard lock(m_);
        return bytes_;
    }
    channel_limits limits() const {
        std::lock_guard lock(m_);
        return {items_, limits_.bytes};
    }

    /// How many items it holds at most from now on (the tuner's, while it runs; the byte
    /// limit stays). Raising it admits waiting senders at once; lowering it drops nothing,
    /// it takes effect as items leave.
    void set_items(std::size_t n) {
        detail::wake_after_unlock wakes;
        std::lock_guard lock(m_);
        n = std::max<std::size_t>(n, 1);
        if (n > ring_.size()) {
            std::vector<std::optional<T>> bigger(n);
            for (std::size_t i = 0; i < count_; ++i) bigger[i] = std::move(ring_[(head_ + i) % ring_.size()]);
            ring_ = std::move(bigger);
            head_ = 0;
        }
        items_ = n;
        admit_senders();
    }

private:
    std::optional<T> receive_blocking_until(std::optional<std::chrono::steady_clock::time_point> deadline,
                                            detail::wait_meter wait_ns) {
        std::optional<T> out;
        detail::wake_after_unlock wakes;
        std::unique_lock lock(m_);
        std::exception_ptr err;
        if (try_receive_locked(out, nullptr, err)) {
            if (err) std::rethrow_exception(err);
            return out;
        }
        std::condition_variable cv;
        recv_waiter w;
        w.cv = &cv;
        w.slot = &out;
        receivers_.push(&w);
        const auto t0 = wait_ns ? detail::now_ns() : 0;
        if (!deadline) cv.wait(lock, [&] { return w.woken; });
        else if (!cv.wait_until(lock, *deadline, [&] { return w.woken; })) receivers_.remove(&w);  // gave up
        if (wait_ns) wait_ns.add(t0, detail::now_ns());
        if (!out && w.error) std::rethrow_exception(w.error);
        return out;
    }

    struct send_waiter : detail::waiter {
        T* item = nullptr;
        std::size_t weight = 0;
        bool ok = false;
    };
    struct recv_waiter : detail::waiter {
        std::optional<T>* slot = nullptr;
        std::uint64_t* index = nullptr;
        std::exception_ptr error;
    };

    std::size_t weigh(const T& v) const { return limits_.bytes ? byte_size_of(v) : 0; }
    bool has_room(std::size_t w) const noexcept {
        return count_ < items_ &&
               (limits_.bytes == 0 || count_ == 0 || bytes_ + w <= limits_.bytes);
    }
    void push_locked(T&& v, std::size_t w) {
        ring_[(head_ + count_) % ring_.size()].emplace(std::move(v));
        ++count_;
        bytes_ += w;
    }
    T pop_locked() {
        auto& slot = ring_[head_];
        T v = std::move(*slot);
        slot.reset();
        head_ = (head_ + 1) % ring_.size();
        --count_;
        bytes_ -= weigh(v);
        return v;
    }
    void close_locked() {
        if (closed_) return;
        closed_ = true;
        // Senders still waiting cannot be admitted any more.
        while (!senders_.empty()) senders_.pop()->wake();
        if (count_ == 0) wake_receivers_at_end();
    }
    void wake_receivers_at_end() {
        while (!receivers_.empty()) {
            auto* w = receivers_.pop();
            if (!cancelled_) w->error = error_;
            if (w->index) *w->index = popped_;
            w->wake();
        }
    }
    // 1: sent, 0: failed (cancelled/closed), -1: must wait.
    int try_send_locked(T& v, std::size_t weight) {
        if (cancelled_ || closed_) return 0;
        if (!receivers_.empty()) {  // the buffer is empty: hand over directly
            auto* w = receivers_.pop();
            w->slot->emplace(std::move(v));
            if (w->index) *w->index = popped_;
            ++popped_;
            w->wake();
            return 1;
        }
        // Queue behind waiting senders, so a large item is not starved by small ones.
        if (senders_.empty() && has_room(weight)) {
            push_locked(std::move(v), weight);
            return 1;
        }
        return -1;
    }
    // true: done (out filled, or end with err possibly set); false: must wait.
    bool try_receive_locked(std::optional<T>& out, std::uint64_t* index,
                            std::exception_ptr& err) {
        if (count_ > 0) {
            out.emplace(pop_locked());
            if (index) *index = popped_;
            ++popped_;
            admit_senders();
            if (count_ == 0 && closed_) wake_receivers_at_end();
            return true;
        }
        if (closed_ || cancelled_) {
            if (!cancelled_) err = error_;
            if (index) *index = popped_;  // end and error come after every item
            return true;
        }
        return false;
    }
    void admit_senders() {
        while (!senders_.empty()) {
            auto* head = senders_.head;
            if (head->item ? !has_room(head->weight) : count_ != 0) break;  // no item: a drained() waiter
            auto* w = senders_.pop();
            if (w->item) push_locked(std::move(*w->item), w->weight);
            w->ok = true;
            w->wake();
        }
    }

public:
    // What send_awaiter and drained_awaiter share: a place in the senders' queue. The
    // mutex stays locked from a false await_ready to the end of await_suspend, so no
    // wake-up can slip in between. No unique_lock member: once the mutex is released the
    // coroutine may already run (and reuse this frame's memory) on another thread, so
    // releasing it must be the last thing that touches this object.
    class sender_slot {
    public:
        bool await_resume() {
            if (t0_) wait_ns_.add(t0_, detail::now_ns());
            return w_.ok;
        }

    protected:
        sender_slot(channel& ch, detail::wait_meter wait_ns) : ch_(ch), wait_ns_(wait_ns) {}
        template <class P>
        void queue(std::coroutine_handle<P> h, T* item) {
            w_.h = h;
            w_.ex = h.promise().ex;
            w_.item = item;
            if (wait_ns_) t0_ = detail::now_ns();
            ch_.senders_.push(&w_);
            ch_.m_.unlock();  // last touch of *this
        }
        channel& ch_;
        detail::wait_meter wait_ns_;
        std::uint64_t t0_ = 0;
        send_waiter w_;
    };

    class send_awaiter : public sender_slot {
    public:
        send_awaiter(channel& ch, T&& v, detail::wait_meter wait_ns) : sender_slot(ch, wait_ns), item_(std::move(v)) {
            this->w_.weight = ch.weigh(item_);  // user code (byte_size) runs before locking
        }
        bool await_ready() {
            detail::wake_after_unlock wakes;  // a false return leaves it locked, having woken no one
            this->ch_.m_.lock();
            int r;
            try {  // an item's move may throw: never leave the channel locked
                r = this->ch_.try_send_locked(item_, this->w_.weight);
            } catch (...) {
                this->ch_.m_.unlock();
                throw;
            }
            if (r < 0) return false;
            this->w_.ok = r == 1;
            this->ch_.m_.unlock();
            return true;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            this->queue(h, &item_);
        }

    private:
        T item_;
    };

    class drained_awaiter : public sender_slot {
    public:
        drained_awaiter(channel& ch, detail::wait_meter wait_ns) : sender_slot(ch, wait_ns) {}
        bool await_ready() {
            auto& ch = this->ch_;
            ch.m_.lock();
            if (ch.cancelled_ || ch.closed_) {
                this->w_.ok = false;
            } else if (ch.senders_.empty() && ch.count_ == 0) {
                this->w_.ok = true;
            } else {
                return false;
            }
            ch.m_.unlock();
            return true;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            this->queue(h, nullptr);  // admit_senders wakes it once the channel is empty, pushing nothing
        }
    };

    class receive_awaiter {
    public:
        receive_awaiter(channel& ch, detail::wait_meter wait_ns, std::uint64_t* index)
            : ch_(ch), wait_ns_(wait_ns), index_(index) {}
        bool await_ready() {  // see sender_slot on the mutex
            detail::wake_after_unlock wakes;  // a false return leaves it locked, having woken no one
            ch_.m_.lock();
            bool done;
            try {
                done = ch_.try_receive_locked(out_, index_, w_.error);
            } catch (...) {
                ch_.m_.unlock();
                throw;
            }
            if (!done) return false;
            ch_.m_.unlock();
            return true;
        }
        template <class P>
        void await_suspend(std::coroutine_handle<P> h) {
            w_.h = h;
            w_.ex = h.promise().ex;
            w_.slot = &out_;
            w_.index = index_;
            if (wait_ns_) t0_ = detail::now_ns();
            ch_.receivers_.push(&w_);
            ch_.m_.unlock();  // last touch of *this
        }
        std::optional<T> await_resume() {
            if (t0_) wait_ns_.add(t0_, detail::now_ns());
            if (!out_ && w_.error) std::rethrow_exception(w_.error);
            return std::move(out_);
        }

    private:
        channel& ch_;
        detail::wait_meter wait_ns_;
        std::uint64_t* index_;
        std::uint64_t t0_ = 0;
        std::optional<T> out_;
        recv_waiter w_;
    };

private:
    mutable std::mutex m_;
    const channel_limits limits_;  // .items: the start; items_ is the capacity now
    std::size_t items_;
    std::vector<std::optional<T>> ring_;
    std::size_t head_ = 0;
    std::size_t count_ = 0;
    std::size_t bytes_ = 0;
    std::uint64_t popped_ = 0;
    std::size_t producers_ = 0;
    bool closed_ = false;
    bool cancelled_ = false;
    std::exception_ptr error_;
    std::function<void()> on_cancel_;
    detail::waiter_queue<send_waiter> senders_;
    detail::waiter_queue<recv_waiter> receivers_;
};

}  // namespace sluice
