#pragma once
// sluice::task<T>: the coroutine type every stage body is written in.
//
// A task is lazy: it starts when awaited (or handed to spawn / sync_wait). Each running
// coroutine knows the executor it runs on (the I/O loop or the CPU pool); an awaited task
// inherits its caller's executor, and a channel that wakes a suspended coroutine posts the
// resumption to that executor, never resuming it inline on the waker's thread. That keeps
// stack depth flat and keeps CPU work off the I/O loop.
//
// We use our own coroutine type instead of asio::awaitable because channel operations are
// the hot path: a custom awaiter costs no allocation when it does not suspend, while every
// asio::awaitable call allocates a frame (see bench/channel_hop.cpp).

#include <asio/any_io_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice {

/// Where a coroutine runs: the runtime's I/O loop or its CPU pool.
using executor = asio::any_io_executor;

namespace detail {

struct promise_base {
    std::coroutine_handle<> continuation;
    executor ex;
    std::exception_ptr error;

    struct final_awaiter {
        bool await_ready() const noexcept { return false; }
        template <class P>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) const noexcept {
            auto c = h.promise().continuation;
            return c ? c : std::noop_coroutine();
        }
        void await_resume() const noexcept {}
    };
    std::suspend_always initial_suspend() const noexcept { return {}; }
    final_awaiter final_suspend() const noexcept { return {}; }
    void unhandled_exception() noexcept { error = std::current_exception(); }
};

/// Resume `h` on `ex` (never inline): the wake-up path of every suspended coroutine.
inline void resume_on(const executor& ex, std::coroutine_handle<> h) {
    asio::post(ex, [h] { h.resume(); });
}

}  // namespace detail

template <class T = void>
class [[nodiscard]] task;

namespace detail {
template <class T>
struct task_promise : promise_base {
    std::optional<T> value;
    task<T> get_return_object() noexcept;
    template <class U>
    void return_value(U&& v) {
        value.emplace(std::forward<U>(v));
    }
    T take() {
        if (error) std::rethrow_exception(error);
        return std::move(*value);
    }
};
template <>
struct task_promise<void> : promise_base {
    task<void> get_return_object() noexcept;
    void return_void() const noexcept {}
    void take() const {
        if (error) std::rethrow_exception(error);
    }
};
}  // namespace detail

/// A lazily started coroutine producing a T. Await it from another task, or run it with
/// spawn() or sync_wait().
template <class T>
class [[nodiscard]] task {
public:
    using promise_type = detail::task_promise<T>;
    using handle_type = std::coroutine_handle<promise_type>;

    task() = default;
    explicit task(handle_type h) noexcept : h_(h) {}
    task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
    task& operator=(task&& o) noexcept {
        if (this != &o) {
            if (h_) h_.destroy();
            h_ = std::exchange(o.h_, {});
        }
        return *this;
    }
    task(const task&) = delete;
    task& operator=(const task&) = delete;
    ~task() {
        if (h_) h_.destroy();
    }

    class awaiter {
    public:
        explicit awaiter(handle_type h) noexcept : h_(h) {}
        bool await_ready() const noexcept { return false; }
        template <class P>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<P> caller) noexcept {
            h_.promise().continuation = caller;
            h_.promise().ex = caller.promise().ex;
            return h_;
        }
        T await_resume() { return h_.promise().take(); }

    private:
        handle_type h_;
    };
    awaiter operator co_await() && noexcept { return awaiter{h_}; }

    handle_type release() noexcept { return std::exchange(h_, {}); }

private:
    handle_type h_;
};

namespace detail {
template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
    return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}
inline task<void> task_promise<void>::get_return_object() noexcept {
    return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}

// The root of a spawned coroutine tree: owns itself and frees its frame at the end.
struct detached {
    struct promise_type : promise_base {
        detached get_return_object() noexcept {
            return {std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() const noexcept {}
        void unhandled_exception() const noexcept { std::terminate(); }  // bodies catch all
    };
    std::coroutine_handle<promise_type> h;
};

template <class T, class F>
detached run_detached(task<T> t, F on_done) {
    std::exception_ptr err;
    if constexpr (std::is_void_v<T>) {
        try {
            co_await std::move(t);
        } catch (...) {
            err = std::current_exception();
        }
        on_done(err);
    } else {
        std::optional<T> v;
        try {
            v.emplace(co_await std::move(t));
        } catch (...) {
            err = std::current_exception();
        }
        on_done(std::move(v), err);
    }
}
}  // namespace detail

/// Start `t` on `ex`. `on_done(std::exception_ptr)` (or `on_done(std::optional<T>,
/// std::exception_ptr)` for a value task) runs on that executor when it finishes. The
/// caller keeps whatever the task references alive until then.
template <class T, class F>
void spawn(const executor& ex, task<T> t, F on_done) {
    auto d = detail::run_detached(std::move(t), std::move(on_done));
    d.h.promise().ex = ex;
    detail::resume_on(ex, d.h);
}

/// Run `t` to completion on a private event loop driven by the calling thread; return its
/// value or rethrow its exception. For tests, tools and `main`.
template <class T>
T sync_wait(task<T> t) {
    asio::io_context ctx;
    // The task may finish on another executor. That thread must not touch `ctx` (it could
    // still be inside a post when this function returns and destroys it), so it only sets
    // `done`, and this thread runs the loop in short slices until it sees it.
    auto guard = asio::make_work_guard(ctx);
    std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> result;
    std::exception_ptr error;
    std::atomic<bool> done{false};
    if constexpr (std::is_void_v<T>) {
        spawn(ctx.get_executor(), std::move(t), [&](std::exception_ptr e) {
            error = e;
            result.emplace(true);
            done.store(true, std::memory_order_release);
        });
    } else {
        spawn(ctx.get_executor(), std::move(t), [&](std::optional<T> v, std::exception_ptr e) {
            error = e;
            if (v) result.emplace(std::move(*v));
            done.store(true, std::memory_order_release);
        });
    }
    while (!done.load(std::memory_order_acquire)) ctx.run_one_for(std::chrono::milliseconds(1));
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<T>) return std::move(*result);
}

/// `co_await sluice::current_executor()` gives the executor the coroutine runs on.
struct current_executor {
    executor ex;
    bool await_ready() const noexcept { return false; }
    template <class P>
    bool await_suspend(std::coroutine_handle<P> h) noexcept {
        ex = h.promise().ex;
        return false;
    }
    executor await_resume() const noexcept { return ex; }
};

/// `co_await sluice::switch_to(ex)` moves the rest of the coroutine onto `ex`. The task
/// that awaited this one resumes where this one finishes (on `ex`) until it next suspends.
struct switch_to {
    executor ex;
    bool await_ready() const noexcept { return false; }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
        h.promise().ex = ex;
        detail::resume_on(ex, h);
    }
    void await_resume() const noexcept {}
};

}  // namespace sluice
