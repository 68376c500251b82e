#include <sluice/core/runtime.hpp>

#include "support/test_support.hpp"

#include <future>

TEST_CASE("the runtime runs work on its I/O loop and its CPU pool", "[runtime]") {
    sluice::runtime rt({.cpu_threads = 3});
    REQUIRE(rt.cpu_threads() == 3);
    std::promise<std::thread::id> io, cpu;
    asio::post(rt.io_executor(), [&] { io.set_value(std::this_thread::get_id()); });
    asio::post(rt.cpu_executor(), [&] { cpu.set_value(std::this_thread::get_id()); });
    const auto a = io.get_future().get(), b = cpu.get_future().get();
    REQUIRE(a != std::this_thread::get_id());
    REQUIRE(a != b);
    REQUIRE(rt.buffers() != nullptr);
    rt.join();
    rt.join();  // idempotent
}
