#include <sluice/core/runtime.hpp>

#include "support/test_support.hpp"

#include <sched.h>

#include <chrono>
#include <future>
#include <thread>

TEST_CASE("the runtime runs work on its I/O loop and its CPU pool and names the pool's threads", "[runtime]") {
    sluice::runtime rt({.cpu_threads = 3});
    REQUIRE(rt.cpu_threads() == 3);
    std::promise<std::thread::id> io, cpu;
    asio::post(rt.io_executor(), [&] { io.set_value(std::this_thread::get_id()); });
    asio::post(rt.cpu_executor(), [&] { cpu.set_value(std::this_thread::get_id()); });
    const auto a = io.get_future().get(), b = cpu.get_future().get();
    REQUIRE(a != std::this_thread::get_id());
    REQUIRE(a != b);
    REQUIRE(rt.buffers() != nullptr);
    // Each of the pool's threads is named (perf and top -H tell them from the program's).
    const auto names = sluice_test::thread_names();
    INFO("threads: " << names.size());
    REQUIRE(names.count("sluice-cpu") == 3);
    rt.join();
    rt.join();  // idempotent
}

TEST_CASE("the runtime reports its I/O thread's CPU time, and names the thread", "[runtime]") {
    sluice::runtime rt({.cpu_threads = 1});
    std::promise<void> idle;
    asio::post(rt.io_executor(), [&] { idle.set_value(); });
    idle.get_future().get();
    const double before = rt.io_cpu_seconds();
    REQUIRE(before >= 0);
    REQUIRE(before < 0.2);  // an idle loop uses next to nothing
    // Work on the CPU pool is not the loop's.
    std::promise<void> cpu_done;
    asio::post(rt.cpu_executor(), [&] {
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (std::chrono::steady_clock::now() < end) {
        }
        cpu_done.set_value();
    });
    cpu_done.get_future().get();
    REQUIRE(rt.io_cpu_seconds() - before < 0.05);
    // 150 ms of spinning on the loop shows in it.
    std::promise<void> io_done;
    asio::post(rt.io_executor(), [&] {
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(150);
        while (std::chrono::steady_clock::now() < end) {
        }
        io_done.set_value();
    });
    io_done.get_future().get();
    const double after = rt.io_cpu_seconds();
    REQUIRE(after - before > 0.05);  // CPU time: less than wall time when the machine is loaded
    REQUIRE(sluice_test::thread_names().count("sluice-io") >= 1);
    rt.join();
    const double total = rt.io_cpu_seconds();  // kept after the thread is gone
    REQUIRE(total >= after);
    REQUIRE(rt.io_cpu_seconds() == total);
}

TEST_CASE("default thread counts follow the CPUs the process may run on, not the machine's", "[runtime]") {
    // A thread confined to one CPU (as `taskset -c 0` confines a process) sees one: the
    // CPU pool of a runtime it makes has one thread, whatever the machine has.
    std::size_t seen = 0, pool = 0;
    int rc = -1;
    std::thread([&] {
        cpu_set_t one;
        CPU_ZERO(&one);
        cpu_set_t mine;
        CPU_ZERO(&mine);
        if (::sched_getaffinity(0, sizeof mine, &mine) != 0) return;
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &mine)) {
                CPU_SET(c, &one);
                break;
            }
        rc = ::sched_setaffinity(0, sizeof one, &one);
        if (rc != 0) return;
        seen = sluice::usable_cpus();  // the public name of the count the runtime uses
        sluice::runtime rt;  // its threads inherit the mask; none of them outlives this one
        pool = rt.cpu_threads();
    }).join();
    REQUIRE(rc == 0);
    REQUIRE(seen == 1);
    REQUIRE(pool == 1);
    REQUIRE(sluice::usable_cpus() >= 1);  // this thread's mask is untouched
}
