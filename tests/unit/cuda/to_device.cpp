#include <sluice/cuda/to_device.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <tuple>

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
        // Each record in a buffer of its own (from() keeps its records and sends copies that
        // share them), as fetch or read give one: the kind the group stage would copy into
        // the CPU pool's memory on arrival, were the collator allocating from it.
        auto own = [](sluice::record r) {
            r.data = sluice::bytes::copy_of(r.data.span());
            return r;
        };
        sluice::pipeline p(sluice::from(make_records(300)) | sluice::map(own) |
                           sluice::batch({.size = 50, .concurrency = 2}) | sluice::to_device({}, eng));
        for (auto& b : p) {
            b.synchronize();
            // The host batch the copy read from lies in the staging pool: no staging copy.
            REQUIRE(eng->staging_pool()->owns(b.host().data.data()));
            REQUIRE(eng->destination_pool()->owns(b.data()));
            ++n;
        }
        REQUIRE(p.figures().stages.size() >= 4);
        // Nor were records copied on arrival into the CPU pool's memory (the group stage
        // asks at setup whether the collator allocates from it; here it does not).
        bool grouped = false;
        for (auto& s : p.figures().stages) {
            grouped = grouped || s.name == "group";
            for (auto& [name, v] : s.counters)
                if (name == "copied_on_arrival") REQUIRE(v == 0);
        }
        REQUIRE(grouped);
    }
    REQUIRE(n == 6);
    // Released: every staging and destination buffer is back in its pool.
    REQUIRE(eng->staging_pool()->figures().in_use_bytes == 0);
    REQUIRE(eng->destination_pool()->figures().in_use_bytes == 0);
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
    REQUIRE(eng->destination_pool()->figures().allocations <= 6);
    REQUIRE(eng->destination_pool()->figures().slabs == 1);
}

TEST_CASE("at most `ring` batches are ahead of the trainer, and releasing one lets the next copy go",
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
        auto second = *p.next_blocking();
        second.synchronize();  // the consumer waits on the copy before reading
        tensor = second.dlpack();
    }  // the pipeline and the second batch object are gone; its tensor is not
    kept.synchronize();
    REQUIRE(device_text(kept, 3) == record_text(3));
    REQUIRE(tensor->dl_tensor.ndim == 1);  // ragged: flat bytes
    const auto* t = static_cast<const char*>(tensor->dl_tensor.data);
    REQUIRE(std::string(t, t + record_text(10).size()) == record_text(10));
    kept.release();
    REQUIRE(kept.data() == nullptr);
    REQUIRE_THROWS_WITH(kept.synchronize(), Catch::Contains("used after release"));
    tensor.reset();
    REQUIRE(eng->destination_pool()->figures().in_use_bytes == 0);
    REQUIRE(eng->staging_pool()->figures().in_use_bytes == 0);
}

TEST_CASE("a DLPack tensor keeps its ring slot taken until its deleter runs", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(30)) | sluice::batch({.size = 10}) | sluice::to_device({.ring = 1}, eng));
    auto tensor = p.next_blocking()->dlpack();
    std::this_thread::sleep_for(100ms);
    REQUIRE(eng->copies() == 1);  // the slot is still the tensor's
    tensor.reset();
    auto second = p.next_blocking();  // held: its slot is the only one
    REQUIRE(second);
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
        bool staged(const void*) override { return false; }
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

TEST_CASE("a device batch exports as DLPack with its device, dtype, shape and strides", "[to_device][dlpack]") {
    auto eng = std::make_shared<sluice::host_engine>();
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"mem", 0, 0});
    std::vector<sluice::record> rs;
    for (std::size_t i = 0; i < 8; ++i) rs.push_back({sluice::bytes::copy_of(std::string(24, char('0' + i))), s, i, 0});
    sluice::pipeline p(sluice::from(rs) | sluice::batch({.size = 4}) | sluice::to_device({}, eng));
    auto b = *p.next_blocking();
    b.synchronize();
    auto u8 = b.dlpack();
    REQUIRE(u8->dl_tensor.data == b.data());
    REQUIRE(u8->dl_tensor.device.device_type == kDLCPU);  // the host engine's memory
    REQUIRE(u8->dl_tensor.ndim == 2);
    REQUIRE(u8->dl_tensor.shape[0] == 4);
    REQUIRE(u8->dl_tensor.shape[1] == 24);
    REQUIRE(u8->dl_tensor.strides[0] == 24);
    REQUIRE(u8->dl_tensor.strides[1] == 1);
    auto f = b.dlpack({.dtype = sluice::dtypes::f32, .shape = {4, 2, -1}});
    REQUIRE(f->dl_tensor.dtype.code == kDLFloat);
    REQUIRE(f->dl_tensor.dtype.bits == 32);
    REQUIRE(f->dl_tensor.shape[2] == 3);
    REQUIRE(f->dl_tensor.strides[0] == 6);
    REQUIRE(f->dl_tensor.strides[1] == 3);
    REQUIRE(f->dl_tensor.strides[2] == 1);
}

TEST_CASE("dlpack(layout, stream) orders the tensor's memory after the stream's work", "[to_device][dlpack]") {
    auto eng = std::make_shared<sluice::host_engine>(sluice::host_engine_options{.copy_delay = 2ms});
    sluice::host_stream stream;
    sluice::pipeline p(sluice::from(make_records(30)) | sluice::batch({.size = 3}) | sluice::to_device({.ring = 1}, eng));
    std::atomic<int> good{0}, bad{0};
    std::size_t first = 0;
    for (auto& b : p) {
        auto t = b.dlpack({}, stream);  // the stream waits for the copy
        stream.enqueue([&, data = static_cast<const char*>(t->dl_tensor.data), offs = b.offsets(), first] {
            std::this_thread::sleep_for(10ms);
            for (std::size_t i = 0; i + 1 < offs.size(); ++i)
                (std::string(data + offs[i], data + offs[i + 1]) == record_text(first + i) ? good : bad)++;
        });
        first += b.size();
        t.reset();  // the "framework" drops the tensor as soon as its work is enqueued
    }
    stream.synchronize();
    REQUIRE(bad == 0);
    REQUIRE(good == 30);
}

TEST_CASE("batches waited on two streams are reused after the work on both", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::host_stream fast, slow;
    sluice::pipeline p(sluice::from(make_records(24)) | sluice::batch({.size = 4}) | sluice::to_device({.ring = 1}, eng));
    std::atomic<int> good{0}, bad{0};
    std::size_t first = 0;
    for (auto& b : p) {
        b.wait(fast);
        b.wait(slow);
        b.wait(slow);  // twice: remembered once
        auto check = [&, data = static_cast<const char*>(b.data()), offs = b.offsets(), first](auto delay) {
            return [&, data, offs, first, delay] {
                std::this_thread::sleep_for(delay);
                for (std::size_t i = 0; i + 1 < offs.size(); ++i)
                    (std::string(data + offs[i], data + offs[i + 1]) == record_text(first + i) ? good : bad)++;
            };
        };
        fast.enqueue(check(0ms));
        slow.enqueue(check(15ms));
        first += b.size();
    }
    fast.synchronize();
    slow.synchronize();
    REQUIRE(bad == 0);
    REQUIRE(good == 48);
}

TEST_CASE("a batch released before its copy finished keeps its staging memory until the copy is done",
          "[to_device]") {
    std::promise<void> gate;
    auto opened = gate.get_future().share();
    std::atomic<int> copies{0};
    auto eng = std::make_shared<sluice::host_engine>(sluice::host_engine_options{.before_copy = [opened, &copies] {
        if (copies++ == 0) opened.wait();  // the first copy stays "on the bus" until opened
    }});
    sluice::pipeline p(sluice::from(make_records(10, 1000)) | sluice::batch({.size = 5}) | sluice::to_device({.ring = 1}, eng));
    {
        auto b = p.next_blocking();
        REQUIRE_FALSE(b->ready());
    }  // released while its copy still runs
    // The staging buffer is still read by the copy: it is not back in the pool (nothing
    // else has been freed yet: the second batch is held by the stage or its channel).
    REQUIRE(eng->staging_pool()->figures().free_bytes == 0);
    gate.set_value();
    auto second = p.next_blocking();  // the slot's reuse waited for the first copy
    REQUIRE(eng->staging_pool()->figures().free_bytes > 0);  // and then freed its staging buffer
    second->synchronize();
    REQUIRE(device_text(*second, 0) == record_text(5, 1000));
    second.reset();
    REQUIRE_FALSE(p.next_blocking());
    p.stop();
    REQUIRE(eng->staging_pool()->figures().in_use_bytes == 0);
}

TEST_CASE("a release that cannot be ordered fails the pipeline instead of reusing the memory", "[to_device][errors]") {
    // The host engine, except that recording on the trainer's stream fails (as CUDA does
    // for a stream destroyed before the batch was released).
    struct failing_record : sluice::copy_engine {
        sluice::host_engine inner;
        std::string describe() const override { return "failing engine"; }
        int device() const noexcept override { return -1; }
        void open() override {}
        std::shared_ptr<sluice::buffer_source> staging() override { return inner.staging(); }
        bool staged(const void* p) override { return inner.staged(p); }
        std::shared_ptr<sluice::buffer_source> destination() override { return inner.destination(); }
        std::unique_ptr<sluice::copy_event> make_event() override { return inner.make_event(); }
        void copy(void* d, const void* s, std::size_t n, std::span<sluice::copy_event* const> a,
                  sluice::copy_event& e) override {
            inner.copy(d, s, n, a, e);
        }
        void stream_wait(sluice::stream_ref s, sluice::copy_event& e) override { inner.stream_wait(s, e); }
        void record(sluice::stream_ref, sluice::copy_event&) override {
            throw sluice::error("sluice: cudaEventRecord on the consumer's stream failed: invalid resource handle");
        }
    };
    sluice::host_stream stream;
    sluice::pipeline p(sluice::from(make_records(20)) | sluice::batch({.size = 5}) |
                       sluice::to_device({.ring = 1}, std::make_shared<failing_record>()));
    auto first = p.next_blocking();
    first->wait(stream);
    first.reset();
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("failing engine: a released batch's memory cannot be reused "
                                                           "safely: sluice: cudaEventRecord on the consumer's stream failed"));
}

TEST_CASE("batches not in staging memory are copied and counted as unstaged", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    // A stage between batch and to_device that makes new (heap) batches.
    auto rebuild = sluice::make_item_stage<sluice::host_batch, sluice::host_batch>(
        "rebuild", {}, [](sluice::host_batch&& b, std::vector<sluice::host_batch>& out) {
            b.data = sluice::bytes::copy_of(b.data.span());
            out.push_back(std::move(b));
        });
    sluice::pipeline p(sluice::from(make_records(20)) | sluice::batch({.size = 5}) | rebuild | sluice::to_device({}, eng));
    std::size_t next = 0;
    for (auto& b : p) {
        b.synchronize();
        for (std::size_t i = 0; i < b.size(); ++i, ++next) REQUIRE(device_text(b, i) == record_text(next));
    }
    REQUIRE(next == 20);
    std::uint64_t unstaged = 0;
    for (auto& s : p.figures().stages)
        for (auto& [name, v] : s.counters)
            if (s.name == "to_device" && name == "unstaged") unstaged = v;
    REQUIRE(unstaged == 4);
}

TEST_CASE("holding every ring batch and asking for another is an error naming the ring, not a hang",
          "[to_device][errors]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(100)) | sluice::batch({.size = 5}) |
                       sluice::to_device({.ring = 3}, eng));
    std::vector<sluice::device_batch> held;  // gradient accumulation that keeps them all
    for (int i = 0; i < 3; ++i) held.push_back(*p.next_blocking());
    try {
        (void)p.next_blocking();
        FAIL("a fourth batch arrived while the trainer held all three");
    } catch (const sluice::error& e) {
        const std::string what = e.what();
        REQUIRE(what.find("holds all 3 ring batches") != std::string::npos);
        REQUIRE(what.find(".ring = N") != std::string::npos);
    }
    held.erase(held.begin());  // the fix: give one back; the pipeline goes on
    auto fourth = p.next_blocking();
    REQUIRE(fourth);
    fourth->synchronize();
    REQUIRE(device_text(*fourth, 0) == record_text(15));
}

TEST_CASE("under a memory budget the ring holds as many batches as its share does, at least two", "[to_device][budget]") {
    // 16 MiB: a quarter goes to settings and to the ring (the only taker here): 4 MiB, which
    // holds two batches of 64 records of about 25 KiB (1.6 MiB) of a ring of 5.
    auto eng = std::make_shared<sluice::host_engine>();
    auto run = [&](std::uint64_t memory) {
        sluice::pipeline p(sluice::from(make_records(640, 25000)) | sluice::batch({.size = 64}) |
                               sluice::to_device({.ring = 5}, eng),
                           {.memory = memory});
        std::vector<sluice::device_batch> held;
        std::string what;
        try {
            for (int i = 0; i < 6; ++i) held.push_back(*p.next_blocking());
        } catch (const sluice::error& e) {
            what = e.what();
        }
        std::string budget;
        for (auto& [line, bytes] : p.figures().budget) budget += line + " " + std::to_string(bytes) + "\n";
        return std::tuple{held.size(), what, budget};
    };
    auto [kept, what, budget] = run(16u << 20);
    INFO(budget);
    CHECK(kept == 2);
    CHECK(what.find("holds all 2 ring batches (the memory budget's share for the ring holds 2 of these batches; ring 5)") !=
          std::string::npos);
    CHECK(what.find("pipeline_options::memory") != std::string::npos);
    CHECK(budget.find("to_device: ring of 5 batches of pinned staging memory") != std::string::npos);
    CHECK(budget.find("4194304") != std::string::npos);
    // A budget that holds them all, and none: the ring's five.
    CHECK(std::get<0>(run(std::uint64_t{1} << 30)) == 5);
    CHECK(std::get<0>(run(0)) == 5);

    // Every record arrives, in order, through the budgeted ring (batches let go at once).
    sluice::pipeline p(sluice::from(make_records(640, 25000)) | sluice::batch({.size = 64}) |
                           sluice::to_device({.ring = 5}, eng),
                       {.memory = 16u << 20});
    std::size_t next = 0;
    for (auto& b : p) {
        b.synchronize();
        for (std::size_t i = 0; i < b.size(); ++i, ++next) REQUIRE(device_text(b, i) == record_text(next, 25000));
    }
    CHECK(next == 640);
}

TEST_CASE("a batch released from another thread is not mistaken for a deadlock", "[to_device]") {
    auto eng = std::make_shared<sluice::host_engine>();
    sluice::pipeline p(sluice::from(make_records(40)) | sluice::batch({.size = 5}) |
                       sluice::to_device({.ring = 2}, eng));
    std::vector<sluice::device_batch> held;
    for (int i = 0; i < 2; ++i) held.push_back(*p.next_blocking());
    std::thread releaser([&] {
        std::this_thread::sleep_for(100ms);
        held.clear();
    });
    REQUIRE(p.next_blocking());  // waits for the release instead of failing
    releaser.join();
}

TEST_CASE("an exception in the host engine's copy work ends the pipeline with that error", "[to_device][errors]") {
    std::atomic<int> copies{0};
    auto eng = std::make_shared<sluice::host_engine>(sluice::host_engine_options{.before_copy = [&] {
        if (++copies == 3) throw std::runtime_error("the bus fell over");
    }});
    sluice::pipeline p(sluice::from(make_records(200)) | sluice::batch({.size = 5}) |
                       sluice::to_device({.ring = 3}, eng));
    std::string what;
    int good = 0;
    try {
        for (auto& b : p) {
            b.synchronize();
            ++good;
        }
    } catch (const sluice::error& e) {
        what = e.what();
    }
    REQUIRE(good == 2);
    REQUIRE(what.find("the bus fell over") != std::string::npos);
}
