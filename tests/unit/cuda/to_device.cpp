#include <sluice/cuda/to_device.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>

using namespace std::chrono_literals;

namespace {
// Records "r<i>" padded to a size that varies with i (ragged batches).
std::vector<sluice::record> make_records(std::size_t n, std::size_t base = 100) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"mem", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < n; ++i) {
        std::string text = "r" + std::to_string(i) + ":";
        text.resize(base + (i * 37) % 200, char('a' + i % 26));
        out.push_back({sluice::bytes::copy_of(text), s, i, 0});
    }
    return out;
}
std::string record_text(std::size_t i, std::size_t base = 100) {
    std::string text = "r" + std::to_string(i) + ":";
    text.resize(base + (i * 37) % 200, char('a' + i % 26));
    return text;
}
std::string device_text(const sluice::device_batch& b, std::size_t i) {
    auto* p = static_cast<const char*>(b.data());
    return std::string(p + b.offsets()[i], p + b.offsets()[i + 1]);
}
}  // namespace

TEST_CASE("to_device delivers every record, in order, byte for byte", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>(sluice::host_engine_options{.copy_delay = 100us});
    sluice::pipeline p(sluice::from(make_records(1000)) | sluice::batch({.size = 64}) |
                       sluice::to_device({.ring = 3}, eng));
    std::size_t next = 0, batches = 0;
    for (auto& b : p) {
        b.synchronize();
        REQUIRE(b.device() == -1);
        for (std::size_t i = 0; i < b.size(); ++i, ++next) {
            REQUIRE(device_text(b, i) == record_text(next));
            REQUIRE(b.key(i) == "mem#" + std::to_string(next));
        }
        ++batches;
    }
    REQUIRE(next == 1000);
    REQUIRE(batches == 16);
    REQUIRE(eng->copies() == 16);
}

TEST_CASE("the batch stage collates straight into the engine's staging memory", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    std::size_t n = 0;
    {
        sluice::pipeline p(sluice::from(make_records(300)) | sluice::batch({.size = 50, .threads = 2}) |
                           sluice::to_device({}, eng));
        for (auto& b : p) {
            b.synchronize();
            // The host batch the copy read from lies in the staging pool: no staging copy.
            REQUIRE(eng->staging_pool()->owns(b.host().data.data()));
            REQUIRE(eng->destination_pool()->owns(b.data()));
            ++n;
        }
        REQUIRE(p.figures().stages.size() >= 4);
    }
    REQUIRE(n == 6);
    // Released: every staging and destination buffer is back in its pool.
    REQUIRE(eng->staging_pool()->in_use_bytes() == 0);
    REQUIRE(eng->destination_pool()->in_use_bytes() == 0);
}

TEST_CASE("device memory comes from the pool: a slot per ring entry, reused", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(2000, 1000)) | sluice::batch({.size = 10}) |
                       sluice::to_device({.ring = 3}, eng));
    std::size_t n = 0;
    for (auto& b : p) {
        b.synchronize();
        ++n;
    }
    REQUIRE(n == 200);
    // 200 batches of similar size: destination buffers were taken only when a slot first
    // filled or grew, never once per batch.
    REQUIRE(eng->destination_pool()->allocations() <= 6);
    REQUIRE(eng->destination_pool()->slabs() == 1);
}

TEST_CASE("at most `ring` batches are ahead of the trainer; releasing one lets the next copy go",
          "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(100)) | sluice::batch({.size = 5}) |
                       sluice::to_device({.ring = 3}, eng));
    std::vector<sluice::device_batch> held;
    for (int i = 0; i < 3; ++i) held.push_back(*p.next_blocking());
    std::this_thread::sleep_for(200ms);  // time enough for a broken ring to copy more
    REQUIRE(eng->copies() == 3);
    held.erase(held.begin());  // release the oldest
    auto fourth = p.next_blocking();
    REQUIRE(fourth);
    fourth->synchronize();
    REQUIRE(device_text(*fourth, 0) == record_text(15));
    REQUIRE(eng->copies() == 4);
    // The stage counted its wait for a free slot as waiting for room downstream.
    bool waited = false;
    for (auto& s : p.figures().stages)
        if (s.name == "to_device") waited = s.wait_output_s > 0.1;
    REQUIRE(waited);
}

TEST_CASE("a slot's next copy waits for the work the trainer's stream enqueued before release",
          "[to_device]") {
    // One slot, so every copy reuses the memory the previous batch's consumer work reads.
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::host_stream stream;
    sluice::pipeline p(sluice::from(make_records(40)) | sluice::batch({.size = 4}) |
                       sluice::to_device({.ring = 1}, eng));
    std::atomic<int> good{0}, bad{0};
    std::size_t first = 0;
    for (auto& b : p) {
        b.wait(stream);  // the host does not block
        // The "kernel": slow, and reads the batch after the host has released it.
        stream.enqueue([&, data = static_cast<const char*>(b.data()), offs = b.offsets(), first] {
            std::this_thread::sleep_for(20ms);
            for (std::size_t i = 0; i + 1 < offs.size(); ++i) {
                std::string got(data + offs[i], data + offs[i + 1]);
                (got == record_text(first + i) ? good : bad)++;
            }
        });
        first += b.size();
    }  // each batch is released as soon as its work is enqueued
    stream.synchronize();
    REQUIRE(bad == 0);
    REQUIRE(good == 40);
}

TEST_CASE("a trainer stream made to wait reads the batch only after the copy", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>(sluice::host_engine_options{.copy_delay = 30ms});
    sluice::host_stream stream;
    sluice::pipeline p(sluice::from(make_records(12)) | sluice::batch({.size = 4}) | sluice::to_device({}, eng));
    std::atomic<int> good{0};
    std::size_t first = 0;
    for (auto& b : p) {
        b.wait(stream);
        stream.enqueue([&, data = static_cast<const char*>(b.data()), offs = b.offsets(), first] {
            for (std::size_t i = 0; i + 1 < offs.size(); ++i)
                if (std::string(data + offs[i], data + offs[i + 1]) == record_text(first + i)) ++good;
        });
        first += b.size();
        stream.synchronize();  // keep the batch alive while its work runs
    }
    REQUIRE(good == 12);
}

TEST_CASE("a batch and its DLPack tensor outlive the pipeline", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::device_batch kept;
    sluice::dlpack_ptr tensor;
    {
        sluice::pipeline p(sluice::from(make_records(20)) | sluice::batch({.size = 10}) | sluice::to_device({}, eng));
        kept = *p.next_blocking();
        tensor = p.next_blocking()->dlpack();  // the batch itself is gone at once
    }
    kept.synchronize();
    REQUIRE(device_text(kept, 3) == record_text(3));
    REQUIRE(tensor->dl_tensor.ndim == 1);  // ragged: flat bytes
    const auto* t = static_cast<const char*>(tensor->dl_tensor.data);
    REQUIRE(std::string(t, t + record_text(10).size()) == record_text(10));
    kept.release();
    REQUIRE(kept.data() == nullptr);
    REQUIRE_THROWS_WITH(kept.synchronize(), Catch::Contains("used after release"));
    tensor.reset();
    REQUIRE(eng->destination_pool()->in_use_bytes() == 0);
    REQUIRE(eng->staging_pool()->in_use_bytes() == 0);
}

TEST_CASE("a DLPack tensor keeps its ring slot taken until its deleter runs", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(30)) | sluice::batch({.size = 10}) | sluice::to_device({.ring = 1}, eng));
    auto tensor = p.next_blocking()->dlpack();
    std::this_thread::sleep_for(100ms);
    REQUIRE(eng->copies() == 1);  // the slot is still the tensor's
    tensor.reset();
    REQUIRE(p.next_blocking());
    REQUIRE(eng->copies() == 2);
}

TEST_CASE("stopping wakes a device stage waiting for a free slot", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    auto p = std::make_unique<sluice::pipeline<sluice::device_batch>>(
        sluice::from(make_records(200)) | sluice::batch({.size = 2}) | sluice::to_device({.ring = 2}, eng));
    auto a = p->next_blocking();
    auto b = p->next_blocking();
    std::this_thread::sleep_for(50ms);  // the stage now waits for a slot
    const auto t0 = std::chrono::steady_clock::now();
    p->stop();
    REQUIRE(std::chrono::steady_clock::now() - t0 < 2s);
    p.reset();
    a->synchronize();
    REQUIRE(device_text(*a, 1) == record_text(1));
}

TEST_CASE("upstream errors reach the trainer after the batches before them", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    auto failing = sluice::make_item_stage<sluice::record, sluice::record>(
        "fail at 25", {}, [](sluice::record&& r, std::vector<sluice::record>& out) {
            if (r.index == 25) throw sluice::error("sluice: bad record 25");
            out.push_back(std::move(r));
        });
    sluice::pipeline p(sluice::from(make_records(40)) | failing | sluice::batch({.size = 5}) |
                       sluice::to_device({}, eng));
    std::size_t batches = 0;
    REQUIRE_THROWS_WITH([&] { for (auto& b : p) { b.synchronize(); ++batches; } }(),
                        Catch::Contains("bad record 25"));
    REQUIRE(batches == 5);
}

TEST_CASE("an engine that cannot open fails the pipeline's start at once", "[to_device]") {
    struct broken_engine : sluice::copy_engine {
        std::string describe() const override { return "broken"; }
        int device() const noexcept override { return 0; }
        void open() override { throw sluice::error("sluice: to_device: no usable GPU (test)"); }
        std::shared_ptr<sluice::buffer_source> staging() override { return nullptr; }
        std::shared_ptr<sluice::buffer_source> destination() override { return nullptr; }
        std::unique_ptr<sluice::copy_event> make_event() override { return nullptr; }
        void copy(void*, const void*, std::size_t, std::span<sluice::copy_event* const>, sluice::copy_event&) override {}
        void stream_wait(sluice::stream_ref, sluice::copy_event&) override {}
        void record(sluice::stream_ref, sluice::copy_event&) override {}
    };
    std::atomic<int> mapped{0};
    auto count = sluice::make_item_stage<sluice::record, sluice::record>(
        "count", {}, [&mapped](sluice::record&& r, std::vector<sluice::record>& out) {
            ++mapped;
            out.push_back(std::move(r));
        });
    sluice::pipeline p(sluice::from(make_records(10)) | count | sluice::batch({.size = 5}) |
                       sluice::to_device({}, std::make_shared<broken_engine>()));
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("no usable GPU (test)"));
    REQUIRE(std::chrono::steady_clock::now() - t0 < 1s);
    REQUIRE(mapped == 0);  // nothing ran
}
