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
// buffer carved from it are gone. A request that no free buffer and no room left in the
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
    static std::shared_ptr<slab_pool> create(slab_pool_options o = {}) {
        if (!o.allocate) {
            const std::align_val_t al{o.alignment};
            o.allocate = [al](std::size_t n) { return static_cast<std::byte*>(::operator new(n, al)); };
            o.deallocate = [al](std::byte* p, std::size_t) { ::operator delete(p, al); };
        }
        return std::shared_ptr<slab_pool>(new slab_pool(std::move(o)));
    }
    slab_pool(const slab_pool&) = delete;
    slab_pool& operator=(const slab_pool&) = delete;
    ~slab_pool() override {
        for (auto& s : slabs_) o_.deallocate(s.first, s.second);
    }

    /// A buffer of at least `size` bytes (rounded up to a size class: at most 25% more).
    std::shared_ptr<buffer> allocate(std::size_t size) override {
        const std::size_t cap = size_class(size);
        std::byte* p = nullptr;
        std::size_t got = cap;
        {
            std::lock_guard lock(m_);
            // A free buffer of this class, or of a larger one up to twice the size.
            for (auto it = free_.lower_bound(cap); it != free_.end() && it->first <= 2 * cap; ++it) {
                if (it->second.empty()) continue;
                p = it->second.back();
                it->second.pop_back();
                got = it->first;
                break;
            }
            if (!p) p = carve_locked(cap);
            in_use_ += got;
            ++allocations_;
        }
        static constexpr buffer::release_fn keep = [](std::byte*, std::size_t) noexcept {};
        return std::shared_ptr<buffer>(new buffer(p, got, keep), [self = shared_from_this()](buffer* b) {
            self->recycle(b->data(), b->capacity());
            delete b;
        });
    }

    /// Bytes held in slabs (what the system gave).
    std::size_t reserved_bytes() const {
        std::lock_guard lock(m_);
        return reserved_;
    }
    /// Bytes in buffers handed out and not yet freed.
    std::size_t in_use_bytes() const {
        std::lock_guard lock(m_);
        return in_use_;
    }
    /// How many slabs were asked of the system.
    std::size_t slabs() const {
        std::lock_guard lock(m_);
        return slabs_.size();
    }
    /// How many buffers were handed out.
    std::size_t allocations() const {
        std::lock_guard lock(m_);
        return allocations_;
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
    explicit slab_pool(slab_pool_options o) : o_(std::move(o)) {
        if (o_.alignment == 0 || (o_.alignment & (o_.alignment - 1)) != 0) o_.alignment = 256;
    }

    std::size_t size_class(std::size_t size) const noexcept {
        std::size_t c = buffer_pool::size_class(size ? size : 1);
        return (c + o_.alignment - 1) / o_.alignment * o_.alignment;
    }

    std::byte* carve_locked(std::size_t cap) {
        if (cap <= o_.slab_bytes / 4) {
            if (cursor_ && left_ >= cap) {
                std::byte* p = cursor_;
                cursor_ += cap;
                left_ -= cap;
                return p;
            }
            std::byte* s = new_slab_locked(o_.slab_bytes, cap);
            cursor_ = s + cap;
            left_ = o_.slab_bytes - cap;
            return s;
        }
        return new_slab_locked(cap, cap);  // a large buffer is a slab of its own
    }

    std::byte* new_slab_locked(std::size_t n, std::size_t wanted) {
        if (o_.max_bytes && reserved_ + n > o_.max_bytes) {
            if (n == wanted || reserved_ + wanted > o_.max_bytes)
                throw error("sluice: cannot allocate " + std::to_string(wanted) + " bytes of " + o_.what +
                            ": the pool's limit of " + std::to_string(o_.max_bytes) + " bytes is reached (" +
                            std::to_string(in_use_) + " in use)");
            n = wanted;  // room for this buffer, not a whole slab
        }
        std::byte* p = nullptr;
        try {
            p = o_.allocate(n);
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw error("sluice: cannot allocate " + std::to_string(n) + " bytes of " + o_.what + ": " + e.what());
        }
        if (!p) throw error("sluice: cannot allocate " + std::to_string(n) + " bytes of " + o_.what);
        slabs_.emplace_back(p, n);
        reserved_ += n;
        return p;
    }

    void recycle(std::byte* p, std::size_t cap) {
        std::lock_guard lock(m_);
        in_use_ -= cap;
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
};

}  // namespace sluice
