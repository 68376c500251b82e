#pragma once
// sluice::slab_pool: memory obtained once in large slabs and recycled by size class.
//
// Page-locked host memory (cudaHostAlloc) and device memory (cudaMalloc) are slow to get:
// each call can take milliseconds and synchronise the device. The pool asks for a slab
// (64 MiB by default) at a time, carves buffers out of it, and keeps every freed buffer
// for later requests of its size class, so a pipeline in its steady state makes no such
// call at all. The memory itself comes from two functions given at construction, which is
// what makes the pool testable without a GPU (tests and the host engine pass plain
// aligned heap memory).
//
// Buffers keep their pool alive; slabs go back to the system when the pool and every
// buffer carved from it are gone. Freed buffers are never merged back into slabs, and
// the tail of a slab too short for the next request is left unused: simple, and for a
// pipeline whose batches are of a few sizes, close to what it needs. A request that no free buffer and no room left in the
// current slab can serve takes a new slab, unless `max_bytes` would be exceeded: then it
// fails with a sluice::error naming the memory and the limit.

#include <sluice/core/bytes.hpp>
#include <sluice/core/error.hpp>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice {

struct slab_pool_options {
    /// What the memory is, for error messages: "pinned host memory", "device memory".
    std::string what = "memory";
    /// Bytes asked of the system at a time; a larger request gets a slab of its own size.
    std::size_t slab_bytes = 64u << 20;
    /// Most bytes the pool may hold in slabs; 0: no limit.
    std::size_t max_bytes = 0;
    /// Alignment of every buffer (256: what cudaMalloc gives and DLPack consumers expect).
    std::size_t alignment = 256;
    /// Gets `n` bytes (throws, or returns null, on failure). Default: aligned operator new.
    std::function<std::byte*(std::size_t n)> allocate = nullptr;
    /// Gives back what `allocate` returned.
    std::function<void(std::byte* p, std::size_t n)> deallocate = nullptr;
};

class slab_pool final : public buffer_source, public std::enable_shared_from_this<slab_pool> {
public:
    /// Throws std::invalid_argument for an alignment that is not a power of two, or an
    /// allocate without its deallocate (or the other way round).
    static std::shared_ptr<slab_pool> create(slab_pool_options o = {}) {
        if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) != 0)
            throw std::invalid_argument("sluice: slab_pool alignment must be a power of two");
        if (bool(o.allocate) != bool(o.deallocate))
            throw std::invalid_argument("sluice: slab_pool needs both allocate and deallocate, or neither");
        if (!o.allocate) {
            const std::align_val_t al{o.alignment};
            o.allocate = [al](std::size_t n) { return static_cast<std::byte*>(::operator new(n, al)); };
            o.deallocate = [al](std::byte* p, std::size_t) { ::operator delete(p, al); };
        }
        if (o.slab_bytes < o.alignment) o.slab_bytes = o.alignment;
        return std::shared_ptr<slab_pool>(new slab_pool(std::move(o)));
    }
    slab_pool(const slab_pool&) = delete;
    slab_pool& operator=(const slab_pool&) = delete;
    ~slab_pool() override {
        for (auto& s : slabs_) o_.deallocate(s.first, s.second);
    }

    /// A buffer of at least `size` bytes (rounded up to a size class: at most 25% more).
    /// The system is asked for a new slab outside the pool's lock, so buffers freed on
    /// other threads meanwhile are not held up by a slow cudaHostAlloc.
    std::shared_ptr<buffer> allocate(std::size_t size) override {
        const std::size_t cap = size_class(size);
        std::unique_lock lock(m_);
        std::byte* p = take_locked(cap);
        std::size_t got = p ? got_ : cap;
        if (!p) {
            const bool shared = cap <= o_.slab_bytes / 4;  // else a slab of its own
            std::size_t n = shared ? o_.slab_bytes : cap;
            if (o_.max_bytes && reserved_ + n > o_.max_bytes) {
                if (!shared || reserved_ + cap > o_.max_bytes)
                    throw error("sluice: cannot allocate " + std::to_string(cap) + " bytes of " + o_.what +
                                ": the pool's limit of " + std::to_string(o_.max_bytes) + " bytes is reached (" +
                                std::to_string(in_use_) + " in use)");
                n = cap;  // room for this buffer, not a whole slab
            }
            reserved_ += n;  // claimed before the lock is let go, so the limit holds
            lock.unlock();
            std::byte* slab = nullptr;
            try {
                slab = o_.allocate(n);
                if (!slab) throw error("sluice: cannot allocate " + std::to_string(n) + " bytes of " + o_.what);
            } catch (...) {
                lock.lock();
                reserved_ -= n;
                try {
                    throw;
                } catch (const error&) {
                    throw;
                } catch (const std::exception& e) {
                    throw error("sluice: cannot allocate " + std::to_string(n) + " bytes of " + o_.what + ": " +
                                e.what());
                }
            }
            lock.lock();
            slabs_.emplace_back(slab, n);
            p = slab;
            if (n > cap) {  // the rest of a shared slab serves later requests
                cursor_ = slab + cap;
                left_ = n - cap;
            }
        }
        in_use_ += got;
        ++allocations_;
        lock.unlock();
        static constexpr buffer::release_fn keep = [](std::byte*, std::size_t) noexcept {};
        return std::shared_ptr<buffer>(new buffer(p, got, keep), [self = shared_from_this()](buffer* b) {
            self->recycle(b->data(), b->capacity());
            delete b;
        });
    }

    /// What the pool holds, at one moment.
    struct figures_t {
        std::size_t reserved_bytes = 0;  // in slabs (what the system gave)
        std::size_t in_use_bytes = 0;    // in buffers handed out and not yet freed
        std::size_t free_bytes = 0;      // in freed buffers waiting for reuse
        std::size_t slabs = 0;           // asked of the system
        std::size_t allocations = 0;     // buffers handed out
    };
    figures_t figures() const {
        std::lock_guard lock(m_);
        return {reserved_, in_use_, free_bytes_, slabs_.size(), allocations_};
    }
    /// Whether `p` lies in one of this pool's slabs.
    bool owns(const void* p) const {
        std::lock_guard lock(m_);
        auto* b = static_cast<const std::byte*>(p);
        for (auto& s : slabs_)
            if (b >= s.first && b < s.first + s.second) return true;
        return false;
    }
    const slab_pool_options& options() const noexcept { return o_; }

private:
    explicit slab_pool(slab_pool_options o) : o_(std::move(o)) {}

    std::size_t size_class(std::size_t size) const noexcept {
        std::size_t c = buffer_pool::size_class(size ? size : 1);
        return (c + o_.alignment - 1) / o_.alignment * o_.alignment;
    }

    /// A free buffer of class `cap` (or larger, up to twice), or room in the current slab;
    /// null when a new slab is needed. Sets got_ to the buffer's capacity.
    std::byte* take_locked(std::size_t cap) {
        for (auto it = free_.lower_bound(cap); it != free_.end() && it->first <= 2 * cap; ++it) {
            if (it->second.empty()) continue;
            std::byte* p = it->second.back();
            it->second.pop_back();
            got_ = it->first;
            free_bytes_ -= got_;
            return p;
        }
        if (cap <= o_.slab_bytes / 4 && cursor_ && left_ >= cap) {
            std::byte* p = cursor_;
            cursor_ += cap;
            left_ -= cap;
            got_ = cap;
            return p;
        }
        return nullptr;
    }

    void recycle(std::byte* p, std::size_t cap) {
        std::lock_guard lock(m_);
        in_use_ -= cap;
        free_bytes_ += cap;
        free_[cap].push_back(p);
    }

    slab_pool_options o_;
    mutable std::mutex m_;
    std::vector<std::pair<std::byte*, std::size_t>> slabs_;
    std::map<std::size_t, std::vector<std::byte*>> free_;
    std::byte* cursor_ = nullptr;
    std::size_t left_ = 0;
    std::size_t reserved_ = 0;
    std::size_t in_use_ = 0;
    std::size_t allocations_ = 0;
    std::size_t got_ = 0;
    std::size_t free_bytes_ = 0;
};

}  // namespace sluice
