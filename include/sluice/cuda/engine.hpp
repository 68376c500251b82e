#pragma once
// The copy engine behind sluice::to_device, and the host engine.
//
// to_device speaks to its engine in the CUDA runtime's terms: the engine has a stream of
// its own; a copy is enqueued on it after the events it must wait for and completes an
// event; a consumer's stream can be made to wait for an event without blocking the host;
// an event recorded on the consumer's stream completes when the work enqueued there so
// far is done. The CUDA engine (sluice/cuda/cuda.hpp) maps each of these to one runtime
// call. The host engine does the same with host threads: its stream is a thread running
// enqueued work in order, and a sluice::host_stream stands for the trainer's stream. It
// runs everywhere, so the ring, ordering, lifetimes, backpressure and release of
// to_device are tested without a GPU, and it is a working (if pointless) host sink.

#include <sluice/core/bytes.hpp>
#include <sluice/core/error.hpp>
#include <sluice/cuda/slab_pool.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*; no CUDA header is needed here

namespace sluice {

class host_stream;

/// The stream a consumer runs its work on: a CUDA stream (a cudaStream_t converts,
/// including 0 for the legacy default stream) or a host_stream.
struct stream_ref {
    stream_ref(CUstream_st* s) noexcept : cuda(s) {}  // NOLINT: implicit on purpose
    stream_ref(host_stream& s) noexcept : host(&s) {}  // NOLINT
    CUstream_st* cuda = nullptr;
    host_stream* host = nullptr;
};

/// An event on an engine's stream or a consumer's stream. Recording it again (by the
/// engine) makes it wait for the newer work, as cudaEventRecord does.
class copy_event {
public:
    virtual ~copy_event() = default;
    /// Whether the work it was last recorded after has finished (never blocks).
    virtual bool ready() = 0;
    /// Block the calling thread until it is ready.
    virtual void synchronize() = 0;
};

class copy_engine {
public:
    virtual ~copy_engine() = default;
    /// For messages and reports: "host engine", "CUDA device 0 (NVIDIA H100 80GB HBM3)".
    virtual std::string describe() const = 0;
    /// The CUDA device the batches land on; -1 for host memory.
    virtual int device() const noexcept = 0;
    /// Make the engine usable; throws a sluice::error that says why not (no GPU).
    /// to_device calls it when its pipeline starts.
    virtual void open() = 0;
    /// Host memory batches should be collated into (pinned for CUDA).
    virtual std::shared_ptr<buffer_source> staging() = 0;
    /// Whether `p` lies in the staging memory (else a copy from it is a pageable copy).
    virtual bool staged(const void* p) = 0;
    /// Memory the batches are copied into (device memory for CUDA).
    virtual std::shared_ptr<buffer_source> destination() = 0;
    virtual std::unique_ptr<copy_event> make_event() = 0;
    /// On the engine's stream: wait for each of `after`, copy `n` bytes, record `done`.
    virtual void copy(void* dst, const void* src, std::size_t n, std::span<copy_event* const> after,
                      copy_event& done) = 0;
    /// Make `s` wait for `e` without blocking the host.
    virtual void stream_wait(stream_ref s, copy_event& e) = 0;
    /// Record `e` on `s`: it becomes ready when the work enqueued on `s` so far is done.
    virtual void record(stream_ref s, copy_event& e) = 0;
};

/// A thread that runs enqueued work in order: the host's stand-in for a CUDA stream.
class host_stream {
public:
    host_stream() : thread_([this] { run(); }) {}
    host_stream(const host_stream&) = delete;
    host_stream& operator=(const host_stream&) = delete;
    /// Finishes the work enqueued so far, then joins.
    ~host_stream() {
        {
            std::lock_guard lock(m_);
            closing_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    /// Run `f` after everything enqueued before it.
    void enqueue(std::function<void()> f) {
        {
            std::lock_guard lock(m_);
            work_.push_back(std::move(f));
        }
        cv_.notify_all();
    }
    /// Block until everything enqueued so far has run; rethrows the first exception a
    /// piece of work threw (work that throws never ends the process).
    void synchronize() {
        std::unique_lock lock(m_);
        const std::uint64_t target = enqueued_ + work_.size();
        done_cv_.wait(lock, [&] { return ran_ >= target; });
        if (error_) std::rethrow_exception(error_);
    }

private:
    void run() {
        std::unique_lock lock(m_);
        for (;;) {
            cv_.wait(lock, [&] { return closing_ || !work_.empty(); });
            if (work_.empty()) return;  // closing and drained
            auto f = std::move(work_.front());
            work_.pop_front();
            ++enqueued_;
            lock.unlock();
            std::exception_ptr failed;
            try {
                f();
            } catch (...) {
                failed = std::current_exception();
            }
            lock.lock();
            if (failed && !error_) error_ = failed;
            ++ran_;
            done_cv_.notify_all();
        }
    }
    std::mutex m_;
    std::condition_variable cv_, done_cv_;
    std::deque<std::function<void()>> work_;
    std::uint64_t enqueued_ = 0;  // taken off the queue
    std::uint64_t ran_ = 0;
    bool closing_ = false;
    std::exception_ptr error_;
    std::thread thread_;
};

namespace detail {
/// The state of a host event: each record() takes a ticket; the stream completes tickets
/// in order; ready when the newest ticket recorded is complete. Work enqueued on host
/// streams holds the state, not the event: as with CUDA, an event may be destroyed while
/// a stream still has to wait for it or complete it.
struct host_event_state {
    std::mutex m;
    std::condition_variable cv;
    std::uint64_t recorded = 0, completed = 0;
    std::string failure;  // why a copy recorded on it failed (sticky, as CUDA's errors are)

    std::uint64_t record() {
        std::lock_guard lock(m);
        return ++recorded;
    }
    void complete(std::uint64_t ticket) {
        std::lock_guard lock(m);
        if (ticket > completed) completed = ticket;
        cv.notify_all();
    }
    void fail(std::uint64_t ticket, std::string why) {
        std::lock_guard lock(m);
        if (failure.empty()) failure = std::move(why);
        if (ticket > completed) completed = ticket;
        cv.notify_all();
    }
    void wait_for(std::uint64_t ticket) {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return completed >= ticket; });
    }
    void check() {  // m held
        if (!failure.empty()) throw error("sluice: host engine: a copy failed: " + failure);
    }
    std::uint64_t newest() {
        std::lock_guard lock(m);
        return recorded;
    }
};

class host_event final : public copy_event {
public:
    bool ready() override {
        std::lock_guard lock(s_->m);
        s_->check();
        return s_->completed >= s_->recorded;
    }
    void synchronize() override {
        s_->wait_for(s_->newest());
        std::lock_guard lock(s_->m);
        s_->check();
    }
    const std::shared_ptr<host_event_state>& state() const noexcept { return s_; }

private:
    std::shared_ptr<host_event_state> s_ = std::make_shared<host_event_state>();
};
}  // namespace detail

struct host_engine_options {
    /// Time each copy waits on the engine's stream before its memcpy: stands in for the
    /// bus in tests of backpressure and ordering (data lands only after it).
    std::chrono::microseconds copy_delay{0};
    /// Called on the engine's stream before each copy (after copy_delay): tests hold
    /// copies back with it.
    std::function<void()> before_copy = nullptr;
    /// Staging memory (what batches are collated into): a slab pool of heap memory.
    slab_pool_options staging = {.what = "staging memory"};
    /// Destination memory (the host engine's "device" memory).
    slab_pool_options destination = {.what = "destination memory"};
};

/// A copy engine on the host: copies run in order on a thread of their own (its stream),
/// with memcpy. Consumers use host_stream for their streams, or wait on the host.
class host_engine final : public copy_engine {
public:
    explicit host_engine(host_engine_options o = {})
        : o_(o), staging_(slab_pool::create(o.staging)), dest_(slab_pool::create(o.destination)) {}

    std::string describe() const override { return "host engine"; }
    int device() const noexcept override { return -1; }
    void open() override {}
    std::shared_ptr<buffer_source> staging() override { return staging_; }
    std::shared_ptr<buffer_source> destination() override { return dest_; }
    bool staged(const void* p) override { return staging_->owns(p); }
    const std::shared_ptr<slab_pool>& staging_pool() const noexcept { return staging_; }
    const std::shared_ptr<slab_pool>& destination_pool() const noexcept { return dest_; }
    std::unique_ptr<copy_event> make_event() override { return std::make_unique<detail::host_event>(); }

    void copy(void* dst, const void* src, std::size_t n, std::span<copy_event* const> after,
              copy_event& done) override {
        std::vector<std::pair<std::shared_ptr<detail::host_event_state>, std::uint64_t>> waits;
        for (auto* e : after) {
            auto st = host(*e);
            const auto t = st->newest();  // as cudaStreamWaitEvent: the newest record now
            waits.emplace_back(std::move(st), t);
        }
        {
            std::lock_guard lock(failed_m_);
            if (!failed_.empty()) throw error("sluice: host engine: an earlier copy failed: " + failed_);
        }
        auto d = host(done);
        const auto ticket = d->record();
        ++copies_;
        stream_.enqueue([=, this] {
            // An exception here (from before_copy, say) fails this copy's event and every
            // later copy, as a sticky CUDA error does; it never ends the process.
            try {
                for (auto& [e, t] : waits) e->wait_for(t);
                if (o_.copy_delay.count() > 0) std::this_thread::sleep_for(o_.copy_delay);  // the "bus"
                if (o_.before_copy) o_.before_copy();
                if (n) std::memcpy(dst, src, n);
                d->complete(ticket);
            } catch (const std::exception& x) {
                fail(*d, ticket, x.what());
            } catch (...) {
                fail(*d, ticket, "unknown exception");
            }
        });
    }
    void stream_wait(stream_ref s, copy_event& e) override {
        auto st = host(e);
        const auto t = st->newest();
        consumer(s).enqueue([st, t] {
            st->wait_for(t);
            std::lock_guard lock(st->m);
            st->check();  // a failed copy fails the consumer's stream too (its synchronize throws)
        });
    }
    void record(stream_ref s, copy_event& e) override {
        auto st = host(e);
        const auto t = st->record();
        consumer(s).enqueue([st, t] { st->complete(t); });
    }
    /// Copies enqueued so far.
    std::uint64_t copies() const noexcept { return copies_.load(); }

private:
    static std::shared_ptr<detail::host_event_state> host(copy_event& e) {
        auto* h = dynamic_cast<detail::host_event*>(&e);
        if (!h) throw error("sluice: host engine: an event from another engine");
        return h->state();
    }
    static host_stream& consumer(stream_ref s) {
        if (!s.host)
            throw error("sluice: host engine: a CUDA stream was given; host batches are waited on with a "
                        "sluice::host_stream or synchronize()");
        return *s.host;
    }
    void fail(detail::host_event_state& d, std::uint64_t ticket, const std::string& why) {
        {
            std::lock_guard lock(failed_m_);
            if (failed_.empty()) failed_ = why;
        }
        d.fail(ticket, why);
    }
    host_engine_options o_;
    std::mutex failed_m_;
    std::string failed_;
    std::shared_ptr<slab_pool> staging_, dest_;
    std::atomic<std::uint64_t> copies_{0};
    host_stream stream_;  // last: joined first, while the pools are still alive
};

}  // namespace sluice
