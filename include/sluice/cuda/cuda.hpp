#pragma once
// The CUDA engine: pinned host memory, device memory and asynchronous copies through the
// CUDA runtime API (no kernels). Needs the CUDA toolkit (target sluice::cuda).
//
//   sluice::to_device({.device = 0})   the device stage (sluice/cuda/to_device.hpp)
//   sluice::pinned_memory()            page-locked memory for a pinned host sink:
//                                      `| sluice::batch({.memory = sluice::pinned_memory()})`
//
// Without a usable GPU the CUDA runtime answers every call with error 35
// (cudaErrorInsufficientDriver: no driver) or 100 (cudaErrorNoDevice). Both make
// to_device fail at pipeline start, and pinned_memory() at once, with a sluice::error
// that names the CUDA error and points to the host sink; error::code() holds the CUDA
// error in cuda_category().

#include <sluice/core/error.hpp>
#include <sluice/cuda/engine.hpp>
#include <sluice/cuda/slab_pool.hpp>
#include <sluice/cuda/to_device.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <system_error>

namespace sluice {

/// The error category of CUDA runtime errors (cudaError_t values).
inline const std::error_category& cuda_category() noexcept {
    struct category final : std::error_category {
        const char* name() const noexcept override { return "cuda"; }
        std::string message(int e) const override { return cudaGetErrorString(cudaError_t(e)); }
    };
    static const category c;
    return c;
}

namespace detail {

inline std::string cuda_error_text(cudaError_t e) {
    return "CUDA error " + std::to_string(int(e)) + " " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

inline constexpr const char* host_sink_hint =
    "; without a GPU, end the pipeline at sluice::batch() and iterate its host batches (the host "
    "sink; sluice-probe without --device and --pinned)";

inline void cuda_check(cudaError_t e, const std::string& what) {
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear a non-sticky error so later calls report their own
        throw error("sluice: " + what + " failed: " + cuda_error_text(e), std::error_code(int(e), cuda_category()));
    }
}

/// The number of CUDA devices; throws when there is no usable one, naming the error.
inline int cuda_devices(const std::string& who) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        const bool none = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice;
        throw error("sluice: " + who + ": " + (none ? "no usable GPU: " : "") + "cudaGetDeviceCount returned " +
                        cuda_error_text(e) + host_sink_hint,
                    std::error_code(int(e), cuda_category()));
    }
    if (n <= 0)
        throw error("sluice: " + who + ": no usable GPU: the CUDA runtime reports no device" + host_sink_hint,
                    std::error_code(int(cudaErrorNoDevice), cuda_category()));
    return n;
}

/// Makes `device` current for a scope and restores the caller's device after: the engine
/// runs on the trainer's thread too (at start, at release), whose current device is its
/// own business.
class device_guard {
public:
    explicit device_guard(int device) {
        cuda_check(cudaGetDevice(&prev_), "cudaGetDevice");
        if (prev_ != device) {
            cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
            restore_ = true;
        }
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;
    ~device_guard() {
        if (restore_) cudaSetDevice(prev_);
    }

private:
    int prev_ = 0;
    bool restore_ = false;
};

class cuda_event final : public copy_event {
public:
    explicit cuda_event(int device) {
        device_guard on(device);
        cuda_check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate");
    }
    cuda_event(const cuda_event&) = delete;
    cuda_event& operator=(const cuda_event&) = delete;
    ~cuda_event() override { cudaEventDestroy(e_); }
    bool ready() override {
        const cudaError_t r = cudaEventQuery(e_);
        if (r == cudaErrorNotReady) return false;
        cuda_check(r, "cudaEventQuery");
        return true;
    }
    void synchronize() override { cuda_check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
    cudaEvent_t get() const noexcept { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

}  // namespace detail

struct pinned_options {
    /// Bytes of page-locked memory asked of the driver at a time.
    std::size_t slab_bytes = 64u << 20;
    /// Most bytes the pool may pin; 0: no limit.
    std::size_t max_bytes = 0;
};

/// A pool of page-locked host memory (cudaHostAlloc, portable across devices), allocated
/// in slabs and recycled. Throws at once when there is no usable GPU.
inline std::shared_ptr<slab_pool> pinned_memory(pinned_options o = {}) {
    detail::cuda_devices("pinned memory");
    return slab_pool::create({
        .what = "pinned host memory",
        .slab_bytes = o.slab_bytes,
        .max_bytes = o.max_bytes,
        .alignment = 256,
        .allocate =
            [](std::size_t n) {
                void* p = nullptr;
                detail::cuda_check(cudaHostAlloc(&p, n, cudaHostAllocPortable),
                                   "cudaHostAlloc of " + std::to_string(n) + " bytes of pinned host memory");
                return static_cast<std::byte*>(p);
            },
        .deallocate = [](std::byte* p, std::size_t) { cudaFreeHost(p); },
    });
}

/// The copy engine for one CUDA device: a non-blocking stream of its own, pinned staging
/// memory and device memory from slab pools (no cudaMalloc per batch).
class cuda_engine final : public copy_engine {
public:
    explicit cuda_engine(int device, pinned_options pinned = {}) : device_(device), pinned_opts_(pinned) {}
    cuda_engine(const cuda_engine&) = delete;
    cuda_engine& operator=(const cuda_engine&) = delete;
    ~cuda_engine() override {
        if (stream_) {
            int prev = 0;
            const bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
            cudaSetDevice(device_);
            cudaStreamSynchronize(stream_);
            cudaStreamDestroy(stream_);
            if (restore) cudaSetDevice(prev);
        }
    }

    std::string describe() const override {
        return "CUDA device " + std::to_string(device_) + (name_.empty() ? "" : " (" + name_ + ")");
    }
    int device() const noexcept override { return device_; }

    void open() override {
        std::lock_guard lock(m_);
        if (stream_) return;
        const std::string who = "to_device on CUDA device " + std::to_string(device_);
        const int n = detail::cuda_devices(who);
        if (device_ < 0 || device_ >= n)
            throw error("sluice: " + who + ": no such device (" + std::to_string(n) + " CUDA device" +
                            (n == 1 ? "" : "s") + ", numbered from 0)",
                        std::error_code(int(cudaErrorInvalidDevice), cuda_category()));
        detail::device_guard on(device_);
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) name_ = prop.name;
        detail::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), who + ": cudaStreamCreate");
        pinned_ = pinned_memory(pinned_opts_);
        const int dev = device_;
        device_mem_ = slab_pool::create({
            .what = "device memory on CUDA device " + std::to_string(dev),
            .slab_bytes = 64u << 20,
            .max_bytes = 0,
            .alignment = 256,
            .allocate =
                [dev](std::size_t n) {
                    detail::device_guard on(dev);
                    void* p = nullptr;
                    detail::cuda_check(cudaMalloc(&p, n), "cudaMalloc of " + std::to_string(n) +
                                                              " bytes on CUDA device " + std::to_string(dev));
                    return static_cast<std::byte*>(p);
                },
            .deallocate = [](std::byte* p, std::size_t) { cudaFree(p); },
        });
    }
    std::shared_ptr<buffer_source> staging() override { return pinned_; }
    std::shared_ptr<buffer_source> destination() override { return device_mem_; }
    bool staged(const void* p) override {
        if (pinned_ && pinned_->owns(p)) return true;
        cudaPointerAttributes a{};  // pinned elsewhere (another pool, the trainer's own)
        if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        return a.type == cudaMemoryTypeHost;
    }
    std::unique_ptr<copy_event> make_event() override { return std::make_unique<detail::cuda_event>(device_); }

    void copy(void* dst, const void* src, std::size_t n, std::span<copy_event* const> after,
              copy_event& done) override {
        detail::device_guard on(device_);
        for (auto* e : after) detail::cuda_check(cudaStreamWaitEvent(stream_, event(*e), 0), "cudaStreamWaitEvent");
        detail::cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_),
                           "to_device: cudaMemcpyAsync of " + std::to_string(n) + " bytes to " + describe());
        detail::cuda_check(cudaEventRecord(event(done), stream_), "cudaEventRecord");
    }
    void stream_wait(stream_ref s, copy_event& e) override {
        detail::device_guard on(device_);
        detail::cuda_check(cudaStreamWaitEvent(stream(s), event(e), 0), "cudaStreamWaitEvent on the consumer's stream");
    }
    void record(stream_ref s, copy_event& e) override {
        detail::device_guard on(device_);
        detail::cuda_check(cudaEventRecord(event(e), stream(s)), "cudaEventRecord on the consumer's stream");
    }
    /// The engine's copy stream (valid after open()).
    cudaStream_t copy_stream() const noexcept { return stream_; }

private:
    static cudaEvent_t event(copy_event& e) {
        auto* c = dynamic_cast<detail::cuda_event*>(&e);
        if (!c) throw error("sluice: CUDA engine: an event from another engine");
        return c->get();
    }
    static cudaStream_t stream(stream_ref s) {
        if (s.host) throw error("sluice: CUDA engine: a host_stream was given; pass a cudaStream_t");
        return s.cuda;
    }
    const int device_;
    const pinned_options pinned_opts_;
    std::mutex m_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<slab_pool> pinned_, device_mem_;
};

/// The device stage on a CUDA device (see sluice/cuda/to_device.hpp).
/// Example: `| sluice::to_device({.device = 0})`
template <class = void>  // compiled only where used (see make_stage)
stage<host_batch, device_batch> to_device(to_device_options o = {}) {
    return to_device(o, std::make_shared<cuda_engine>(o.device));
}

}  // namespace sluice
