// The CUDA engine. Without the toolkit this file has one test, reported skipped. With the
// toolkit and no GPU (error 35 or 100) the "no GPU" tests run and the [gpu] tests report
// themselves skipped; with a GPU it is the other way round.
#include <catch2/catch.hpp>

#if !defined(SLUICE_HAVE_CUDA)

TEST_CASE("the CUDA engine (built without the CUDA toolkit)", "[cuda]") {
    WARN("[test skipped] built without the CUDA toolkit: the CUDA engine is not compiled");
}

#else

#include <sluice/cuda/cuda.hpp>

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace {
bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
// The machine the "no GPU" tests are about: the runtime answers 35 or 100. Anything else
// (a GPU, or another failure such as ASan's shadow gap without protect_shadow_gap=0)
// makes them report themselves skipped, naming what the runtime said.
std::string not_the_no_gpu_case() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) return {};
    if (e == cudaSuccess && n == 0) return {};
    if (e == cudaSuccess) return "a GPU is present: this checks the machine without one";
    return std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(e) + ", neither 35 nor 100";
}
std::vector<sluice::record> records(std::size_t n, std::size_t size) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"mem", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < n; ++i) {
        std::string text(size, char('a' + i % 26));
        out.push_back({sluice::bytes::copy_of(text), s, i, 0});
    }
    return out;
}
}  // namespace

TEST_CASE("without a GPU, to_device fails at start within 1 s, naming the CUDA error and the host sink", "[cuda]") {
    if (auto why = not_the_no_gpu_case(); !why.empty()) {
        WARN("[test skipped] " << why);
        return;
    }
    sluice::pipeline p(sluice::from(records(10, 100)) | sluice::batch({.size = 5}) | sluice::to_device({.device = 0}));
    const auto t0 = std::chrono::steady_clock::now();
    try {
        p.next_blocking();
        FAIL("to_device started without a GPU");
    } catch (const sluice::error& e) {
        const std::string m = e.what();
        INFO(m);
        REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
        REQUIRE(m.find("to_device on CUDA device 0: no usable GPU") != std::string::npos);
        REQUIRE(m.find("cudaGetDeviceCount returned CUDA error ") != std::string::npos);
        const bool named = m.find("35 cudaErrorInsufficientDriver") != std::string::npos ||
                           m.find("100 cudaErrorNoDevice") != std::string::npos;
        REQUIRE(named);
        REQUIRE(m.find("host sink") != std::string::npos);
        REQUIRE(e.code().category() == sluice::cuda_category());
        REQUIRE((e.code().value() == 35 || e.code().value() == 100));
    }
}

TEST_CASE("without a GPU, pinned memory is refused at once with the CUDA error", "[cuda]") {
    if (auto why = not_the_no_gpu_case(); !why.empty()) {
        WARN("[test skipped] " << why);
        return;
    }
    REQUIRE_THROWS_WITH(sluice::pinned_memory(), Catch::Contains("pinned memory: no usable GPU") &&
                                                     Catch::Contains("cudaGetDeviceCount returned CUDA error"));
}

TEST_CASE("a CUDA error text names the number, the name and the description", "[cuda]") {
    const std::string t = sluice::detail::cuda_error_text(cudaErrorInsufficientDriver);
    REQUIRE(t.find("CUDA error 35 cudaErrorInsufficientDriver (") == 0);
    REQUIRE(sluice::cuda_category().name() == std::string("cuda"));
}

// ---- hardware-only: need a GPU ----------------------------------------------------------

TEST_CASE("[gpu] batches reach device memory byte for byte, in pinned staging memory", "[cuda][gpu]") {
    if (!have_gpu()) {
        WARN("[test skipped] no usable GPU (CUDA runtime reports none)");
        return;
    }
    auto eng = std::make_shared<sluice::cuda_engine>(0);
    sluice::pipeline p(sluice::from(records(100, 1000)) | sluice::batch({.size = 10}) | sluice::to_device({.ring = 3}, eng));
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
    std::size_t n = 0;
    for (auto& b : p) {
        REQUIRE(b.device() == 0);
        cudaPointerAttributes host{}, dev{};
        REQUIRE(cudaPointerGetAttributes(&host, b.host().data.data()) == cudaSuccess);
        REQUIRE(host.type == cudaMemoryTypeHost);  // pinned: the batch was collated into it
        REQUIRE(cudaPointerGetAttributes(&dev, b.data()) == cudaSuccess);
        REQUIRE(dev.type == cudaMemoryTypeDevice);
        b.wait(s);
        std::string back(b.byte_size(), '\0');
        REQUIRE(cudaMemcpyAsync(back.data(), b.data(), back.size(), cudaMemcpyDeviceToHost, s) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
        REQUIRE(back == std::string(b.host().data.view()));
        auto t = b.dlpack();
        REQUIRE(t->dl_tensor.device.device_type == kDLCUDA);
        REQUIRE(t->dl_tensor.shape[1] == 1000);
        ++n;
    }
    REQUIRE(n == 10);
    cudaStreamDestroy(s);
}

namespace {
void CUDART_CB hold_stream(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }
std::vector<sluice::record> uneven_records(std::size_t n) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"mem", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < n; ++i) {
        std::string text(100 + (i * 7919) % 20000, '\0');
        for (std::size_t j = 0; j < text.size(); ++j) text[j] = char((i * 31 + j * 7) & 0xff);
        out.push_back({sluice::bytes::copy_of(text), s, i, 0});
    }
    return out;
}
}  // namespace

TEST_CASE("[gpu] a slot is not copied into while the trainer's stream still reads it, batch sizes growing and shrinking",
          "[cuda][gpu]") {
    if (!have_gpu()) {
        WARN("[test skipped] no usable GPU (CUDA runtime reports none)");
        return;
    }
    // The trainer reads each batch on its own stream, late (a host function holds the
    // stream 2 ms before the read), and lets the batch go at once, before the read ran. The
    // next copy into that slot must wait for the read: each read sees its own batch's bytes.
    auto eng = std::make_shared<sluice::cuda_engine>(0);
    sluice::pipeline p(sluice::from(uneven_records(600)) | sluice::batch({.size = 6}) | sluice::to_device({.ring = 2}, eng));
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    static int hold_ms = 2;
    std::vector<std::string> expected;
    std::vector<void*> reads;
    for (auto& b : p) {
        expected.emplace_back(b.host().data.view());
        void* d = nullptr;
        REQUIRE(cudaMalloc(&d, b.byte_size()) == cudaSuccess);
        reads.push_back(d);
        b.wait(s);
        REQUIRE(cudaLaunchHostFunc(s, hold_stream, &hold_ms) == cudaSuccess);
        REQUIRE(cudaMemcpyAsync(d, b.data(), b.byte_size(), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
        b.release();  // the read above has not run yet
    }
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    REQUIRE(expected.size() == 100);
    std::size_t same = 0;
    for (std::size_t i = 0; i < reads.size(); ++i) {
        std::string back(expected[i].size(), '\0');
        REQUIRE(cudaMemcpy(back.data(), reads[i], back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
        same += back == expected[i];
        cudaFree(reads[i]);
    }
    CHECK(same == reads.size());
    cudaStreamDestroy(s);
}

TEST_CASE("[gpu] a trainer that stops early: copies in flight end cleanly, a batch kept outlives its pipeline, and a "
          "DLPack tensor keeps its memory",
          "[cuda][gpu]") {
    if (!have_gpu()) {
        WARN("[test skipped] no usable GPU (CUDA runtime reports none)");
        return;
    }
    sluice::device_batch kept;
    sluice::dlpack_ptr tensor;
    std::string kept_bytes, tensor_bytes;
    {
        sluice::pipeline p(sluice::from(records(4000, 4096)) | sluice::batch({.size = 40}) | sluice::to_device({.ring = 3}));
        auto first = p.next_blocking();
        REQUIRE(first);
        tensor = first->dlpack();
        tensor_bytes = std::string(first->host().data.view());
        first->release();  // the tensor still holds the slot
        auto second = p.next_blocking();
        REQUIRE(second);
        kept = std::move(*second);
        kept_bytes = std::string(kept.host().data.view());
        REQUIRE(kept_bytes != tensor_bytes);
    }  // the pipeline stops with copies in flight and a full ring
    kept.synchronize();
    std::string back(kept_bytes.size(), '\0');
    REQUIRE(cudaMemcpy(back.data(), kept.data(), back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back == kept_bytes);
    std::string tback(tensor_bytes.size(), '\0');
    REQUIRE(tensor->dl_tensor.device.device_type == kDLCUDA);
    REQUIRE(cudaMemcpy(tback.data(), tensor->dl_tensor.data, tback.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(tback == tensor_bytes);
    kept.release();
    tensor.reset();
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    // And the next pipeline on the same device runs.
    sluice::pipeline again(sluice::from(records(20, 100)) | sluice::batch({.size = 10}) | sluice::to_device({}));
    std::size_t n = 0;
    for (auto& b : again) n += b.size();
    CHECK(n == 20);
}

TEST_CASE("[gpu] a device that does not exist is named", "[cuda][gpu]") {
    if (!have_gpu()) {
        WARN("[test skipped] no usable GPU (CUDA runtime reports none)");
        return;
    }
    sluice::pipeline p(sluice::from(records(4, 10)) | sluice::batch({.size = 2}) | sluice::to_device({.device = 999}));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("CUDA device 999: no such device"));
}

#endif
