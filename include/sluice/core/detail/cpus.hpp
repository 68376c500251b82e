#pragma once
// The CPUs a process may use, for the thread counts chosen by default (the CPU pool,
// libcurl's lanes, the batch stage's helper).

#include <sched.h>

#include <algorithm>
#include <thread>

namespace sluice::detail {

/// The CPUs this process may run on: its affinity mask (taskset, a container's cpuset),
/// not the machine's. std::thread::hardware_concurrency counts every online CPU, so a
/// process confined to 2 of 64 would start 64 threads that take turns on 2. At least 1.
inline unsigned usable_cpus() noexcept {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return static_cast<unsigned>(n);
    }
    return std::max(1u, std::thread::hardware_concurrency());  // a mask of more than 1,024 CPUs
}

}  // namespace sluice::detail
