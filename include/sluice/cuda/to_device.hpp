#pragma once
// sluice::to_device: copies each host batch to the engine's memory (the GPU) on the
// engine's own stream, and gives the trainer a device_batch it can make its stream wait
// on without blocking the host.
//
// The ring: the stage owns `ring` slots (3 by default), each a destination buffer and two
// sets of events. A batch takes a slot; the stage waits (backpressure) while every slot
// is taken, so at most `ring` batches are copied ahead of the trainer, and device memory
// is `ring` buffers, allocated from the engine's pool and reused (a slot's buffer grows
// only when a larger batch arrives).
//
// Ordering without blocking the host:
//   - the copy into a slot is enqueued after the events recorded when the slot was last
//     released, so it cannot overwrite memory the trainer's stream still reads;
//   - b.wait(stream) makes the trainer's stream wait for the copy, and remembers the
//     stream: releasing the batch records an event there for the next copy to wait on;
//   - the host batch (pinned staging memory the copy reads from) goes back to its pool
//     when the batch is released and the copy is finished, or, if the copy is still
//     running then, when the slot is next taken.
// Releasing: destroying the device_batch (or release()), and every DLPack tensor made
// from it, returns its slot; a batch may outlive its pipeline.

#include <sluice/core/channel.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/cuda/dlpack.hpp>
#include <sluice/cuda/engine.hpp>
#include <sluice/ops/batch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace sluice {

struct to_device_options {
    /// CUDA device ordinal (used by the CUDA engine; the host engine ignores it).
    int device = 0;
    /// Batches copied ahead of the trainer (slots in the ring).
    unsigned ring = 3;
};

namespace detail {

struct device_slot {
    std::shared_ptr<buffer> memory;           // destination buffer (device memory)
    std::unique_ptr<copy_event> copied;       // recorded after the copy into `memory`
    std::vector<std::unique_ptr<copy_event>> released;  // on the streams that waited on it
    std::size_t released_n = 0;               // of which recorded at the last release
    host_batch host;                          // the staging copy: kept while leased (its size and offsets
                                              // are the batch's) and until the copy is done
    std::vector<stream_ref> waited;           // streams given to wait(), for release
    std::string release_error;                // why ordering the last release failed
    std::mutex m;                             // wait() and release may run on other threads
};

/// The slots of one running to_device stage.
struct device_ring : std::enable_shared_from_this<device_ring> {
    device_ring(std::shared_ptr<copy_engine> e, unsigned n) : engine(std::move(e)), free(channel_limits{n, 0}) {
        free.add_producer();
        for (unsigned i = 0; i < n; ++i) {
            slots.push_back(std::make_unique<device_slot>());
            slots.back()->copied = engine->make_event();
            free.send_blocking(slots.back().get());  // never blocks: room for all n
        }
    }
    device_ring(const device_ring&) = delete;
    device_ring& operator=(const device_ring&) = delete;
    ~device_ring() {
        // Nothing may still read or write a slot's memory when it goes. A failed device
        // (sticky CUDA errors) cannot be waited on; its memory goes regardless.
        for (auto& s : slots) {
            try {
                s->copied->synchronize();
                for (auto& r : s->released) r->synchronize();
            } catch (...) {
            }
        }
    }

    /// Return a slot: order its next copy after the work its consumers enqueued. With no
    /// stream given to wait() (the trainer synchronised on the host), a GPU engine records
    /// on the legacy default stream, which covers work on it and on blocking streams.
    void give_back(device_slot* s) noexcept {
        leased.fetch_sub(1, std::memory_order_acq_rel);
        {
            std::lock_guard lock(s->m);
            std::vector<stream_ref> streams = std::move(s->waited);
            s->waited.clear();
            if (streams.empty() && engine->device() >= 0) streams.push_back(static_cast<CUstream_st*>(nullptr));
            try {
                for (std::size_t i = 0; i < streams.size(); ++i) {
                    if (i == s->released.size()) s->released.push_back(engine->make_event());
                    engine->record(streams[i], *s->released[i]);
                }
                // Events are kept (a stream may still wait on one), and reused.
                s->released_n = streams.size();
                if (s->copied->ready()) s->host = {};
            } catch (const std::exception& e) {
                // The slot's memory cannot be reused safely: its next use fails the
                // pipeline with this (a stream destroyed before the batch, another device).
                s->release_error = e.what();
            } catch (...) {
                s->release_error = "unknown error";
            }
        }
        free.send_blocking(s);  // never blocks; fails (harmlessly) once the ring is stopped
    }

    std::shared_ptr<copy_engine> engine;
    std::shared_ptr<buffer_source> memory;  // the engine's destination pool
    std::vector<std::unique_ptr<device_slot>> slots;
    channel<device_slot*> free;
    // For the consumer's deadlock check: slots out in batches, and whether the stage
    // waits for one. The stage clears `waiting` before it makes a lease, so both at
    // their limits means every batch is beyond the stage.
    std::atomic<unsigned> leased{0};
    std::atomic<bool> waiting{false};
    // Under a memory budget (pipeline_options::memory): the bytes of pinned staging memory
    // its batches may hold (0: none), and how many slots that allows now.
    std::uint64_t allowance = 0;
    std::atomic<unsigned> limit{0};
    /// Slots that batches of `bytes` may use: the ring, or as many as the allowance holds,
    /// never fewer than two (a trainer keeping one batch while it asks for the next).
    unsigned allowed(std::size_t bytes) const {
        const auto n = static_cast<unsigned>(slots.size());
        if (!allowance || !bytes) return n;
        return static_cast<unsigned>(std::clamp<std::uint64_t>(allowance / bytes, std::min(2u, n), n));
    }
};

/// A taken slot; the last reference (batch or DLPack tensor) gives it back.
struct device_lease {
    std::shared_ptr<device_ring> ring;
    device_slot* slot;
    device_lease(std::shared_ptr<device_ring> r, device_slot* s) : ring(std::move(r)), slot(s) {}
    device_lease(const device_lease&) = delete;
    device_lease& operator=(const device_lease&) = delete;
    ~device_lease() { ring->give_back(slot); }
};

}  // namespace detail

/// A batch in the engine's memory (on the GPU with the CUDA engine). Move-only; its slot
/// returns to the ring when it and every DLPack tensor made from it are gone.
class device_batch {
public:
    device_batch() = default;
    explicit device_batch(std::shared_ptr<detail::device_lease> l) : lease_(std::move(l)) {}
    device_batch(device_batch&&) noexcept = default;
    device_batch& operator=(device_batch&&) noexcept = default;
    device_batch(const device_batch&) = delete;
    device_batch& operator=(const device_batch&) = delete;

    explicit operator bool() const noexcept { return lease_ != nullptr; }
    /// Records in the batch.
    std::size_t size() const noexcept { return lease_ ? slot().host.size() : 0; }
    std::size_t byte_size() const noexcept { return lease_ ? slot().host.byte_size() : 0; }
    /// The batch's bytes in the engine's memory (a device pointer with CUDA).
    void* data() const noexcept { return lease_ ? slot().memory->data() : nullptr; }
    /// Record i is data()[offsets()[i] .. offsets()[i+1]).
    const std::vector<std::uint64_t>& offsets() const { return host().offsets; }
    /// "url#index" of record i.
    std::string key(std::size_t i) const { return host().key(i); }
    /// The CUDA device the batch is on; -1 for host memory.
    int device() const { return lease().ring->engine->device(); }
    /// The host copy it was made from (valid while the batch lives).
    const host_batch& host() const { return slot().host; }

    /// Whether the copy has finished (never blocks).
    bool ready() const { return slot().copied->ready(); }
    /// Block the calling thread until the copy has finished.
    void synchronize() const { slot().copied->synchronize(); }
    /// Make `s` wait for the copy without blocking the host. The batch's memory is reused
    /// only after the work enqueued on `s` before the batch is released, so `s` must still
    /// exist then. Without any wait(), a GPU batch's memory is reused after the work on
    /// the legacy default stream (and blocking streams) at release: work on a
    /// non-blocking stream that reads the batch must be ordered by wait(), or finished.
    void wait(stream_ref s) {
        auto& sl = slot();
        lease().ring->engine->stream_wait(s, *sl.copied);
        std::lock_guard lock(sl.m);
        for (auto& w : sl.waited)
            if (w.cuda == s.cuda && w.host == s.host) return;
        sl.waited.push_back(s);
    }
    /// The batch as a DLPack tensor on its device (see sluice/cuda/dlpack.hpp), for the
    /// consumer's stream `s`: as DLPack's `__dlpack__(stream)`, `s` is made to wait for
    /// the copy, and the memory is reused only after the work enqueued on `s` before the
    /// tensor's deleter runs (PyTorch runs it when the tensor is collected, not when its
    /// kernels finish: this is what keeps that safe).
    dlpack_ptr dlpack(const tensor_layout& layout, stream_ref s) {
        wait(s);
        return dlpack(layout);
    }
    /// The same without a stream: the consumer waits on the copy itself (synchronize()),
    /// and see wait() for when the memory is reused.
    dlpack_ptr dlpack(const tensor_layout& layout = {}) const {
        const int dev = device();
        const DLDevice d = dev < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, dev};
        return detail::export_dlpack(data(), d, byte_size(), offsets(), detail::layout_for(host(), layout), lease_);
    }
    /// Give the slot back now (also done by the destructor).
    void release() noexcept { lease_.reset(); }

private:
    const detail::device_lease& lease() const {
        if (!lease_) throw error("sluice: device_batch: used after release");
        return *lease_;
    }
    detail::device_slot& slot() const { return *lease().slot; }
    std::shared_ptr<detail::device_lease> lease_;
};

/// Takes: host batches. Gives: device_batch, copied by `engine` (the CUDA engine from
/// sluice/cuda/cuda.hpp's to_device(options), or a host_engine).
/// Setup (at pipeline start): opens the engine, which fails the start when it cannot
/// work (no GPU), and asks the stage before it for the engine's staging memory, so a
/// batch stage collates straight into pinned memory.
/// Backpressure: at most `ring` batches exist between this stage and the trainer.
/// Errors: upstream errors pass through; a failed copy is an error naming the engine.
/// Counters: `unstaged`, batches that were not in the staging memory (a stage between
/// batch and to_device made new ones): copied from pageable memory, more slowly.
/// Cancellation: a stop wakes the wait for a free slot.
/// Example: `| sluice::to_device({.ring = 4}, std::make_shared<sluice::host_engine>())`
template <class = void>  // compiled only where used (see make_stage)
stage<host_batch, device_batch> to_device(to_device_options o, std::shared_ptr<copy_engine> engine) {
    const unsigned n = o.ring ? o.ring : 1;
    auto setup = [engine, n](stage_setup& s) {
        engine->open();
        if (s.internal.upstream_memory) *s.internal.upstream_memory = engine->staging();
        auto ring = std::make_shared<detail::device_ring>(engine, n);
        ring->memory = engine->destination();
        ring->limit = n;
        s.on_stop.push_back([r = ring.get()] { r->free.cancel(); });
        // The ring's host batches (pinned staging memory) take a share of the memory
        // budget: as many slots work as that share holds batches, at least two.
        if (s.internal.shares)
            s.internal.shares->push_back({"to_device: ring of " + std::to_string(n) +
                                              " batches of pinned staging memory, as many as fit (at least 2)",
                                          [r = ring.get()](std::uint64_t b) { r->allowance = b; }});
        // The consumer holds every slot and asks for another: nothing can ever come.
        s.internal.consumer_wait_check = [r = std::weak_ptr<detail::device_ring>(ring), n,
                                 what = engine->describe()]() -> std::string {
            auto ring = r.lock();  // a stop on another thread may be freeing it
            if (!ring) return {};
            const unsigned k = ring->limit.load(std::memory_order_acquire);
            const unsigned held = ring->leased.load(std::memory_order_acquire);
            if (!ring->waiting.load(std::memory_order_acquire) || held < k) return {};
            const std::string budget =
                k < n ? " (the memory budget's share for the ring holds " + std::to_string(k) + " of these batches; ring " +
                            std::to_string(n) + ")"
                      : "";
            return "sluice: to_device on " + what + ": the consumer holds all " + std::to_string(held) +
                   " ring batches" + budget + " and asks for another, which cannot come until one is released: release a "
                   "batch (destroy it, or release()) before taking the next, or build the stage with "
                   "to_device({.ring = N}) for N above the batches you keep (keeping k batches: ring >= k + 1)" +
                   (k < n ? " and give pipeline_options::memory room for them" : "");
        };
        return ring;
    };
    auto body = [](stage_context<host_batch, device_batch>& ctx, detail::device_ring& r) -> task<void> {
        // The ring is this run's state; leases keep it alive after the pipeline is gone.
        auto ring = r.shared_from_this();
        auto& w = ctx.stats.worker(ctx.worker);
        // Batches not in the engine's staging memory (a stage between batch and
        // to_device made new ones): copied all the same, from pageable memory (slower).
        auto& unstaged = ctx.stats.counter("unstaged");
        // Under a memory budget, slots past what its share holds of batches this size wait
        // here, their host batches let go; they come back when batches get smaller.
        std::vector<detail::device_slot*> parked;
        const auto n = static_cast<unsigned>(ring->slots.size());
        while (auto hb = co_await ctx.in.next()) {
            const unsigned allowed = ring->allowed(hb->byte_size());
            ring->limit.store(allowed, std::memory_order_release);
            while (!parked.empty() && n - parked.size() < allowed) {
                ring->free.send_blocking(parked.back());  // never blocks: room for all n
                parked.pop_back();
            }
            ring->waiting.store(true, std::memory_order_release);
            auto got = co_await ring->free.receive(w.output_meter());  // a free slot
            while (got && n - parked.size() > allowed) {  // one slot too many at work: set aside
                detail::device_slot* aside = *got;
                if (aside->host.data.data()) {  // its last copy must be done before its batch goes
                    aside->copied->synchronize();
                    aside->host = {};
                }
                parked.push_back(aside);
                got = co_await ring->free.receive(w.output_meter());
            }
            ring->waiting.store(false, std::memory_order_release);
            if (!got) throw detail::stopped{};
            detail::device_slot* s = *got;
            if (!s->release_error.empty())
                throw error("sluice: to_device on " + ring->engine->describe() +
                            ": a released batch's memory cannot be reused safely: " + s->release_error);
            if (!ring->engine->staged(hb->data.data())) ++unstaged;  // pageable: a slower copy
            if (s->host.data.data()) {  // the last copy from its staging memory must be done
                s->copied->synchronize();
                s->host = {};
            }
            const std::size_t bytes = hb->byte_size();
            if (!s->memory || s->memory->capacity() < bytes) {
                // The old buffer's next user copies on the same stream after this copy,
                // which waits for this slot's release: the order holds.
                s->memory.reset();
                s->memory = ring->memory->allocate(bytes);
            }
            s->host = std::move(*hb);
            std::vector<copy_event*> after;
            for (std::size_t i = 0; i < s->released_n; ++i) after.push_back(s->released[i].get());
            ring->engine->copy(s->memory->data(), s->host.data.data(), bytes, after, *s->copied);
            ring->leased.fetch_add(1, std::memory_order_acq_rel);
            co_await ctx.out.send(device_batch(std::make_shared<detail::device_lease>(ring, s)));
        }
    };
    return make_stage<host_batch, device_batch>("to_device", {.on = pool::cpu, .out = {n, 0}},
                                                std::move(setup), std::move(body));
}

}  // namespace sluice
