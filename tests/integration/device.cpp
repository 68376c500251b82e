// sluice-probe's device sinks: --device host (the to_device path with the host engine),
// and --device N / --pinned on a machine without a GPU (a clear error at once).
#include "support/test_support.hpp"

#include <chrono>

#if defined(SLUICE_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

using sluice_test::json_u64;
using sluice_test::run;

namespace {
struct tfrecord_data {
    sluice_test::temp_dir dir;
    std::string summary;
    tfrecord_data() {
        auto r = run({SLUICE_GEN, dir.path().string(), "--files", "6", "--records", "500", "--record-size", "300",
                      "--vary", "--format", "tfrecord", "--seed", "5"});
        INFO(r.err);
        REQUIRE(r.status == 0);
        summary = r.out;
    }
    std::string glob() const { return dir / "shard-*.tfrecord"; }
};
}  // namespace

TEST_CASE("sluice-probe --device host: every record once, checked in the copy's memory", "[probe][device]") {
    tfrecord_data d;
    for (std::vector<std::string> extra : {std::vector<std::string>{"--ring", "1"},
                                           {"--ring", "3", "--collate-threads", "2", "--shuffle", "200"}}) {
        std::vector<std::string> argv{SLUICE_PROBE, "--json", "--quiet", "--format", "tfrecord", "--batch", "33",
                                      "--device", "host", d.glob()};
        argv.insert(argv.end(), extra.begin(), extra.end());
        auto r = run(argv);
        INFO(r.err << r.out);
        REQUIRE(r.status == 0);
        REQUIRE(json_u64(r.out, "records") == json_u64(d.summary, "records"));
        REQUIRE(json_u64(r.out, "crc_sum") == json_u64(d.summary, "crc_sum"));
        REQUIRE(r.out.find("\"sink\":\"host engine\"") != std::string::npos);
        REQUIRE(r.out.find("\"name\":\"to_device\"") != std::string::npos);
    }
}

TEST_CASE("sluice-probe --device 0 and --pinned without a GPU: exit 1 at once, naming the CUDA error",
          "[probe][device][errors]") {
#if !defined(SLUICE_HAVE_CUDA)
    WARN("[test skipped] built without the CUDA toolkit");
    return;
#else
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaErrorInsufficientDriver && e != cudaErrorNoDevice) {
        WARN("[test skipped] cudaGetDeviceCount returned " << cudaGetErrorName(e) << " (" << n
                                                             << " devices): this checks a machine without a GPU");
        return;
    }
    tfrecord_data d;
    for (std::string flag : {"--device", "--pinned"}) {
        std::vector<std::string> argv{SLUICE_PROBE, "--json", "--quiet", "--format", "tfrecord", flag, d.glob()};
        if (flag == "--device") argv.insert(argv.begin() + 6, "0");
        const auto t0 = std::chrono::steady_clock::now();
        auto r = run(argv);
        INFO(flag << "\n" << r.err << r.out);
        REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // process start included
        REQUIRE(r.status == 1);
        REQUIRE(r.err.find("no usable GPU: cudaGetDeviceCount returned CUDA error") != std::string::npos);
        REQUIRE(r.err.find("host sink") != std::string::npos);
        REQUIRE(r.out.find("\"ok\":false") != std::string::npos);
    }
#endif
}
