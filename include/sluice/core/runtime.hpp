#pragma once
// sluice::runtime: the two executors every pipeline runs on.
//   - the I/O loop: one thread running an asio::io_context; network and file I/O stages
//     run here (no thread per request), and raw() where it only hands records on to a
//     batch (format_defaults::hands_on);
//   - the CPU pool: an asio::thread_pool for parsing, user maps and collation.
// A pipeline owns its runtime. Shutdown order matters: the pipeline first makes every
// stage worker finish, then calls join(), so no coroutine is left suspended on an
// executor that is being destroyed.
// The I/O thread is named "sluice-io" (top -H, /proc/PID/task/*/comm), the CPU pool's
// threads "sluice-cpu". io_cpu_seconds() reads the CPU time the I/O thread has used
// (pipeline figures: io_loop_cpu_s): the loop should only wait on readiness, so this
// stays small next to the pipeline's seconds.

#include <sluice/core/bytes.hpp>
#include <sluice/core/detail/cpus.hpp>
#include <sluice/core/task.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/thread_pool.hpp>

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace sluice {

/// The CPUs this process may run on (its affinity mask: taskset, a container's cpuset),
/// at least 1: what the CPU pool and the `sluice-curl` threads are sized from by default.
/// Size a trainer's own thread counts (decoders, `.concurrency`) from it rather than from
/// std::thread::hardware_concurrency, which counts every CPU of the machine.
inline unsigned usable_cpus() noexcept { return detail::usable_cpus(); }

struct runtime_options {
    /// Threads in the CPU pool; 0 means one per CPU the process may run on (its affinity
    /// mask: taskset, a container's cpuset).
    unsigned cpu_threads = 0;
    /// Bytes of freed buffers kept for reuse by the runtime's buffer pool.
    std::size_t pool_cache_bytes = 256u << 20;
};

/// Which executor a stage runs on.
enum class pool { io, cpu };

class runtime {
public:
    explicit runtime(runtime_options o = {})
        : cpu_threads_(o.cpu_threads ? o.cpu_threads
                                     : detail::usable_cpus()),
          cpu_(cpu_threads_),
          work_(asio::make_work_guard(io_)),
          buffers_(buffer_pool::create(o.pool_cache_bytes)) {
        // Whether large buffers get huge pages is measured here, once a process, while
        // this runtime's threads are idle. Measured at the first large buffer, amid a
        // fetch's threads faulting and mapping on two cores, a huge page took 0.15-5.2 ms
        // to fault in (over 0.9 ms in 5 of 10 runs), and 1 run in 10 turned huge pages
        // off (2,000 objects over HTTP: 22,061 page faults and 0.45 s of CPU, where runs
        // with huge pages took 6,500-8,300 faults); measured here, 0.14-0.35 ms in 10 runs
        // of 12, 3.5 and 4.4 ms in the other two, which still chose huge pages
        // (bench/RESULTS.md, issue 17, twenty-sixth session).
        (void)detail::offer_huge_pages();
        io_thread_ = std::thread([this] {
            {
                std::lock_guard lock(io_cpu_m_);
                io_clock_ok_ = ::pthread_getcpuclockid(::pthread_self(), &io_clock_) == 0;
            }
            io_.run();
            std::lock_guard lock(io_cpu_m_);  // the last reading, while the thread still exists
            io_cpu_final_ = read_clock(CLOCK_THREAD_CPUTIME_ID);
            io_clock_ok_ = false;
            io_done_ = true;
        });
        ::pthread_setname_np(io_thread_.native_handle(), "sluice-io");
        // The CPU pool's threads are named "sluice-cpu" (they inherited the program's name,
        // so perf and top -H could not tell them from its own threads). asio makes them:
        // one task per thread names the thread it runs on, each held until all have
        // started, so no thread runs two of them.
        // (Shared: a thread may still be inside arrive_and_wait when this one returns.)
        auto started = std::make_shared<std::latch>(cpu_threads_);
        for (unsigned i = 0; i < cpu_threads_; ++i)
            asio::post(cpu_, [started] {
                ::pthread_setname_np(::pthread_self(), "sluice-cpu");
                started->arrive_and_wait();
            });
        started->wait();
    }
    runtime(const runtime&) = delete;
    runtime& operator=(const runtime&) = delete;
    ~runtime() { join(); }

    executor io_executor() { return io_.get_executor(); }
    executor cpu_executor() { return cpu_.get_executor(); }
    executor executor_for(pool p) { return p == pool::io ? io_executor() : cpu_executor(); }
    unsigned cpu_threads() const noexcept { return cpu_threads_; }
    /// Recycled buffers for chunks and batches.
    const std::shared_ptr<buffer_pool>& buffers() const noexcept { return buffers_; }
    /// CPU seconds the I/O thread has used so far (user + system); after join(), its total.
    /// The thread's busy time: it only waits for readiness when the work it does is small.
    double io_cpu_seconds() const {
        std::lock_guard lock(io_cpu_m_);  // held: the thread cannot finish under the reading
        if (io_done_) return io_cpu_final_;
        return io_clock_ok_ ? read_clock(io_clock_) : 0.0;
    }

    /// Stop both executors and join their threads. Call after all work has finished.
    void join() {
        if (joined_) return;
        joined_ = true;
        work_.reset();
        io_.stop();
        if (io_thread_.joinable()) io_thread_.join();
        cpu_.stop();
        cpu_.join();
    }

private:
    static double read_clock(clockid_t c) {
        struct timespec ts {};
        if (::clock_gettime(c, &ts) != 0) return 0.0;
        return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
    }

    mutable std::mutex io_cpu_m_;
    clockid_t io_clock_{};
    bool io_clock_ok_ = false;
    bool io_done_ = false;
    double io_cpu_final_ = 0;
    unsigned cpu_threads_;
    asio::io_context io_;
    asio::thread_pool cpu_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::thread io_thread_;
    std::shared_ptr<buffer_pool> buffers_;
    bool joined_ = false;
};

}  // namespace sluice
