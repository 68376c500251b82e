// What fresh memory costs on first touch against memory already faulted in (issue 17):
// a pipeline that holds batches and chunks writes fresh memory in its first epoch, which a
// peer writing to /dev/null (curl) never does, and on a VM the first touch can cost several
// times the write itself. Maps SIZE bytes (2 MiB aligned), offered transparent huge pages
// as sluice's large buffers are (--huge) or not, writes them twice and prints each pass.
//
//   first_touch [--huge] [--mib N]     (default 64 MiB)
//
// Prints {"bytes", "huge", "first_s", "second_s", "first_s_per_gib", "second_s_per_gib"}.
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
    bool huge = false;
    std::size_t mib = 64;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--huge") huge = true;
        else if (a == "--mib" && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
        else {
            std::fprintf(stderr, "usage: first_touch [--huge] [--mib N]\n");
            return 2;
        }
    }
    constexpr std::size_t align = std::size_t{2} << 20;
    const std::size_t n = mib << 20;
    void* m = ::mmap(nullptr, n + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || n == 0) {
        std::perror("first_touch: mmap");
        return 1;
    }
    auto* p = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(m) + align - 1) & ~(std::uintptr_t{align} - 1));
#ifdef MADV_HUGEPAGE
    if (huge) ::madvise(p, n, MADV_HUGEPAGE);
#endif
    using clock = std::chrono::steady_clock;
    auto pass = [&](int v) {
        const auto t0 = clock::now();
        std::memset(p, v, n);
        asm volatile("" : : "r"(p) : "memory");  // the writes are kept
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    const double first = pass(1), second = pass(2);
    const double gib = double(n) / double(std::size_t{1} << 30);
    std::printf("{\"bytes\":%zu,\"huge\":%s,\"first_s\":%.4f,\"second_s\":%.4f,\"first_s_per_gib\":%.3f,"
                "\"second_s_per_gib\":%.3f}\n",
                n, huge ? "true" : "false", first, second, first / gib, second / gib);
    return 0;
}
