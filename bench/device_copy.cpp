// device_copy: the cost of the device path, beside its peers, on the same batches.
//
//   device_copy [--total-bytes N] [--record-bytes N] [--batch N] [--ring R]
//               [--collate-threads C] [--device D]
//
// Records (slices of one buffer, so the source costs nothing) are batched and then:
//   host_sink     the trainer iterates host batches (no device stage): the baseline;
//   host_engine   | to_device with the host engine: the ring, events and a memcpy
//                 standing in for the bus; the trainer waits for each copy;
//   memcpy_loop   a plain loop copying batch-sized buffers: the host engine's peer.
// Built with the CUDA toolkit and run with a GPU, also:
//   cuda_pipeline | to_device({.device = D}): collated into pinned memory, copied on the
//                 engine's stream; the trainer's stream waits on each batch;
//   cuda_stage    the device stage alone, on batches collated beforehand into pinned
//                 memory;
//   cuda_pinned   a bare cudaMemcpyAsync loop from pinned memory, same sizes (the goal:
//                 the pipeline at >= 0.9 of it; cuda_stage shows what the stage costs,
//                 cuda_pipeline adds collation on the CPU);
//   cuda_pageable the same loop from ordinary (pageable) memory.
// One JSON object per line on stdout: {"bench":"device","mode":...,"gb_per_s":...}.

#include <sluice/sluice.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
    std::size_t total = 2ull << 30;
    std::size_t record = 64u << 10;
    std::size_t batch = 256;
    unsigned ring = 3;
    unsigned collate_threads = 1;
    int device = 0;
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void print(const char* mode, std::size_t bytes, double seconds, const std::string& extra = {}) {
    std::printf("{\"bench\":\"device\",\"mode\":\"%s\",\"bytes\":%zu,\"seconds\":%.4f,\"gb_per_s\":%.3f%s}\n", mode,
                bytes, seconds, double(bytes) / seconds / 1e9, extra.c_str());
    std::fflush(stdout);
}

std::vector<sluice::record> make_records(const options& o) {
    std::string block(o.record * 16, '\0');
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = char(i * 131 % 251);
    const sluice::bytes all = sluice::bytes::copy_of(block);
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"mem", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < o.total / o.record; ++i)
        out.push_back({all.slice((i % 16) * o.record, o.record), s, i, 0});
    return out;
}

template <class Source, class Sink, class Finish = void (*)()>
void run_pipeline(const char* mode, Source src, Sink sink, Finish finish = [] {}) {
    sluice::pipeline p(std::move(src));
    std::size_t bytes = 0;
    const double t0 = now_s();
    for (auto& b : p) bytes += sink(b);
    finish();
    const double t1 = now_s();
    print(mode, bytes, t1 - t0, ",\"bottleneck\":\"" + p.figures().bottleneck() + "\"");
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        auto value = [&]() -> std::size_t {
            if (i + 1 >= argc) {
                std::cerr << "device_copy: " << a << " needs a value\n";
                std::exit(2);
            }
            return std::strtoull(argv[++i], nullptr, 10);
        };
        if (a == "--total-bytes") o.total = value();
        else if (a == "--record-bytes") o.record = value();
        else if (a == "--batch") o.batch = value();
        else if (a == "--ring") o.ring = unsigned(value());
        else if (a == "--collate-threads") o.collate_threads = unsigned(value());
        else if (a == "--device") o.device = int(value());
        else {
            std::cerr << "usage: device_copy [--total-bytes N] [--record-bytes N] [--batch N] [--ring R] "
                         "[--collate-threads C] [--device D]\n";
            return 2;
        }
    }
    if (!o.record || !o.batch || o.total < o.record * o.batch) {
        std::cerr << "device_copy: --total-bytes must hold at least one batch\n";
        return 2;
    }
    const auto records = make_records(o);
    const std::size_t batch_bytes = o.record * o.batch;
    const sluice::batch_options bo{.size = o.batch, .concurrency = o.collate_threads};

    run_pipeline("host_sink", sluice::from(records) | sluice::batch(bo),
                 [](sluice::host_batch& b) { return b.byte_size(); });

    auto eng = std::make_shared<sluice::host_engine>();
    run_pipeline("host_engine", sluice::from(records) | sluice::batch(bo) | sluice::to_device({.ring = o.ring}, eng),
                 [](sluice::device_batch& b) {
                     b.synchronize();
                     return b.byte_size();
                 });

    {
        std::vector<char> src(batch_bytes, 1), dst(batch_bytes);
        const std::size_t n = o.total / batch_bytes;
        const double t0 = now_s();
        for (std::size_t i = 0; i < n; ++i) {
            std::memcpy(dst.data(), src.data(), batch_bytes);
            asm volatile("" : : "r"(dst.data()) : "memory");
        }
        print("memcpy_loop", n * batch_bytes, now_s() - t0);
    }

#if defined(SLUICE_HAVE_CUDA)
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= o.device) {
        std::printf("{\"bench\":\"device\",\"mode\":\"cuda\",\"skipped\":\"no usable GPU\"}\n");
        return 0;
    }
    cudaSetDevice(o.device);
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    auto to_gpu = [stream](sluice::device_batch& b) {
        b.wait(stream);  // as a trainer does; the host does not block
        return b.byte_size();
    };
    auto finish = [stream] { cudaStreamSynchronize(stream); };  // timed: the last copies too
    run_pipeline("cuda_pipeline",
                 sluice::from(records) | sluice::batch(bo) | sluice::to_device({.device = o.device, .ring = o.ring}),
                 to_gpu, finish);
    {
        // The device stage alone: batches collated beforehand into pinned memory.
        auto pinned = sluice::pinned_memory();
        std::vector<sluice::host_batch> ready;
        for (unsigned i = 0; i < o.ring + 2; ++i) {
            sluice::host_batch b;
            auto buf = pinned->allocate(batch_bytes);
            std::memset(buf->data(), int(i), batch_bytes);
            b.data = sluice::bytes(std::move(buf), batch_bytes);
            for (std::size_t r = 0; r <= o.batch; ++r) b.offsets.push_back(r * o.record);
            b.sources.assign(o.batch, nullptr);
            b.indices.assign(o.batch, 0);
            ready.push_back(std::move(b));
        }
        std::vector<sluice::host_batch> all;
        for (std::size_t i = 0; i < o.total / batch_bytes; ++i) all.push_back(ready[i % ready.size()]);
        run_pipeline("cuda_stage", sluice::from(all, {4, 0}) | sluice::to_device({.device = o.device, .ring = o.ring}),
                     to_gpu, finish);
    }
    auto bare = [&](const char* mode, void* src) {
        void* dst = nullptr;
        cudaMalloc(&dst, batch_bytes);
        const std::size_t n = o.total / batch_bytes;
        cudaMemcpyAsync(dst, src, batch_bytes, cudaMemcpyHostToDevice, stream);  // warm up
        cudaStreamSynchronize(stream);
        const double t0 = now_s();
        for (std::size_t i = 0; i < n; ++i) cudaMemcpyAsync(dst, src, batch_bytes, cudaMemcpyHostToDevice, stream);
        cudaStreamSynchronize(stream);
        print(mode, n * batch_bytes, now_s() - t0);
        cudaFree(dst);
    };
    void* pinned = nullptr;
    cudaHostAlloc(&pinned, batch_bytes, cudaHostAllocPortable);
    std::memset(pinned, 1, batch_bytes);
    bare("cuda_pinned", pinned);
    cudaFreeHost(pinned);
    std::vector<char> pageable(batch_bytes, 1);
    bare("cuda_pageable", pageable.data());
    cudaStreamDestroy(stream);
#else
    std::printf("{\"bench\":\"device\",\"mode\":\"cuda\",\"skipped\":\"built without the CUDA toolkit\"}\n");
#endif
    return 0;
}
