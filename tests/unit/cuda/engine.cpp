#include <sluice/cuda/engine.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <vector>

using namespace std::chrono_literals;

TEST_CASE("a host stream runs its work in order, and synchronize waits for it", "[engine]") {
    sluice::host_stream s;
    std::vector<int> order;
    for (int i = 0; i < 100; ++i)
        s.enqueue([&order, i] {
            if (i % 10 == 0) std::this_thread::sleep_for(1ms);
            order.push_back(i);
        });
    s.synchronize();
    REQUIRE(order.size() == 100);
    for (int i = 0; i < 100; ++i) REQUIRE(order[std::size_t(i)] == i);
}

TEST_CASE("a host engine copy completes its event when it has landed", "[engine]") {
    sluice::host_engine eng({.copy_delay = 1ms});
    sluice::host_stream gate_stream;
    std::promise<void> gate;
    auto opened = gate.get_future().share();
    gate_stream.enqueue([opened] { opened.wait(); });
    auto gate_event = eng.make_event();
    eng.record(gate_stream, *gate_event);
    std::vector<char> src(1000, 'x'), dst(1000, '.');
    auto done = eng.make_event();
    REQUIRE(done->ready());  // never recorded
    sluice::copy_event* after[] = {gate_event.get()};
    eng.copy(dst.data(), src.data(), src.size(), after, *done);
    REQUIRE_FALSE(done->ready());  // held by the gate, however slow this thread is
    gate.set_value();
    done->synchronize();
    REQUIRE(done->ready());
    REQUIRE(std::memcmp(dst.data(), src.data(), src.size()) == 0);
    REQUIRE(eng.copies() == 1);
}

TEST_CASE("a copy waits for the events it is ordered after", "[engine]") {
    sluice::host_engine eng;
    sluice::host_stream consumer;
    std::promise<void> gate;
    auto opened = gate.get_future().share();
    consumer.enqueue([opened] { opened.wait(); });  // the consumer's stream is busy
    auto released = eng.make_event();
    eng.record(consumer, *released);  // ready once the busy work is done
    std::vector<char> src(64, 'n'), dst(64, 'o');
    auto done = eng.make_event();
    sluice::copy_event* after[] = {released.get()};
    eng.copy(dst.data(), src.data(), src.size(), after, *done);
    std::this_thread::sleep_for(50ms);
    REQUIRE_FALSE(done->ready());
    REQUIRE(dst[0] == 'o');  // not overwritten while the consumer may read it
    gate.set_value();
    done->synchronize();
    REQUIRE(dst[0] == 'n');
}

TEST_CASE("a consumer stream made to wait runs its work after the copy", "[engine]") {
    sluice::host_engine eng({.copy_delay = 20ms});
    sluice::host_stream consumer;
    std::vector<char> src(4096, 'd'), dst(4096, 0);
    auto done = eng.make_event();
    eng.copy(dst.data(), src.data(), src.size(), {}, *done);
    eng.stream_wait(consumer, *done);  // returns at once
    std::atomic<bool> saw_data{false};
    consumer.enqueue([&] { saw_data = dst[4095] == 'd'; });
    consumer.synchronize();
    REQUIRE(saw_data);
}

TEST_CASE("the host engine rejects a CUDA stream with a clear error", "[engine]") {
    sluice::host_engine eng;
    auto e = eng.make_event();
    REQUIRE_THROWS_WITH(eng.stream_wait(static_cast<CUstream_st*>(nullptr), *e),
                        Catch::Contains("host engine: a CUDA stream was given"));
}
