// What fresh memory costs on first touch against memory already faulted in (issue 17):
// a pipeline that holds batches and chunks writes fresh memory in its first epoch, which a
// peer writing to /dev/null (curl) never does, and on a VM the first touch can cost several
// times the write itself. Maps SIZE bytes (2 MiB aligned), offered transparent huge pages
// as sluice's large buffers are (--huge) or not, writes them twice and prints each pass.
//
//   first_touch [--huge] [--populate] [--mib N]     (default 64 MiB)
//   first_touch --map FILE...           (files in the page cache, as sluice maps shards)
//   first_touch --pread FILE...         (the same files read with pread, as by_call reads them)
//
// Prints {"bytes", "huge", "populate", "first_s", "second_s", "first_s_per_gib",
// "second_s_per_gib"}.
// --populate faults the pages in with one call (MADV_POPULATE_WRITE, as sluice's buffer
// pool does for fresh memory) at the start of the first pass, which its time includes.
// --map maps each file read-only and populated (MADV_POPULATE_READ, as sluice's windows
// are), then reads every byte twice: what a process's first read of page-cache pages
// through its own mapping costs beside a second (bench/RESULTS.md, issue 17, 2026-12-05:
// 1.1 us a page on a VM whose second pass ran at 14-15 GB/s).
// --pread reads the same files with pread, 100 KiB at a time, into a 25 MiB buffer
// written once before (a batch of 256 records, recycled), twice: what collating mapped
// shards read by call costs (include/sluice/core/detail/file_mapping.hpp, by_call), which
// maps no page of the files into the process.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {
using clock = std::chrono::steady_clock;

void print(std::size_t n, bool huge, double first, double second, bool populate = false) {
    const double gib = double(n) / double(std::size_t{1} << 30);
    std::printf("{\"bytes\":%zu,\"huge\":%s,\"populate\":%s,\"first_s\":%.4f,\"second_s\":%.4f,"
                "\"first_s_per_gib\":%.3f,\"second_s_per_gib\":%.3f}\n",
                n, huge ? "true" : "false", populate ? "true" : "false", first, second, first / gib, second / gib);
}

#ifdef MADV_POPULATE_READ
constexpr int populate_read = MADV_POPULATE_READ;
#else
constexpr int populate_read = 22;  // Linux's value, where the headers predate it
#endif
#ifdef MADV_POPULATE_WRITE
constexpr int populate_write = MADV_POPULATE_WRITE;
#else
constexpr int populate_write = 23;
#endif

/// Opens `path` for reading and gives its size; -1 (said on stderr) when it cannot.
int open_sized(const char* path, std::size_t& size) {
    const int fd = ::open(path, O_RDONLY);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
        std::perror(path);
        if (fd >= 0) ::close(fd);
        return -1;
    }
    size = static_cast<std::size_t>(st.st_size);
    return fd;
}

int read_mapped(int argc, char** argv, int from) {
    std::vector<std::pair<const std::uint64_t*, std::size_t>> maps;  // words
    std::size_t n = 0;
    for (int i = from; i < argc; ++i) {
        std::size_t size = 0;
        const int fd = open_sized(argv[i], size);
        if (fd < 0) return 1;
        void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
        ::close(fd);
        if (p == MAP_FAILED) {
            std::perror(argv[i]);
            return 1;
        }
        if (p && ::madvise(p, size, populate_read) != 0) {
            std::perror("first_touch: MADV_POPULATE_READ (Linux 5.14 and later)");
            return 1;
        }
        maps.emplace_back(static_cast<const std::uint64_t*>(p), size / 8);
        n += size / 8 * 8;
    }
    if (n == 0) {
        std::fprintf(stderr, "first_touch: --map: no bytes to read\n");
        return 1;
    }
    std::uint64_t sum = 0;
    auto pass = [&] {
        const auto t0 = clock::now();
        for (auto [w, k] : maps)
            for (std::size_t j = 0; j < k; ++j) sum += w[j];
        asm volatile("" : : "r"(sum) : "memory");  // the reads are kept
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    const double first = pass(), second = pass();
    print(n, false, first, second);
    return 0;
}
int read_by_call(int argc, char** argv, int from) {
    constexpr std::size_t record = 100u << 10, batch = 256 * record;
    std::vector<char> into(batch, 1);  // faulted in before the passes
    std::vector<std::pair<int, std::size_t>> files;
    std::size_t n = 0;
    for (int i = from; i < argc; ++i) {
        std::size_t size = 0;
        const int fd = open_sized(argv[i], size);
        if (fd < 0) return 1;
        files.emplace_back(fd, size);
        n += size;
    }
    if (n == 0) {
        std::fprintf(stderr, "first_touch: --pread: no bytes to read\n");
        return 1;
    }
    int err = 0;
    auto pass = [&]() -> double {
        const auto t0 = clock::now();
        std::size_t at = 0;
        for (auto [fd, size] : files)
            for (std::size_t off = 0; off < size; off += record) {
                if (at + record > batch) at = 0;
                const ssize_t k = ::pread(fd, into.data() + at, std::min(record, size - off), static_cast<off_t>(off));
                if (k <= 0) {
                    err = k == 0 ? EIO : errno;  // EIO: the file shrank under the pass
                    return -1;
                }
                at += static_cast<std::size_t>(k);
            }
        asm volatile("" : : "r"(into.data()) : "memory");
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    const double first = pass(), second = pass();
    for (auto [fd, size] : files) ::close(fd);
    if (first < 0 || second < 0) {
        errno = err;
        std::perror("first_touch: pread");
        return 1;
    }
    print(n, false, first, second);
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    bool huge = false, populate = false;
    std::size_t mib = 64;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--huge") huge = true;
        else if (a == "--populate") populate = true;
        else if (a == "--mib" && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--map" && i + 1 < argc) return read_mapped(argc, argv, i + 1);
        else if (a == "--pread" && i + 1 < argc) return read_by_call(argc, argv, i + 1);
        else {
            std::fprintf(stderr, "usage: first_touch [--huge] [--populate] [--mib N] | --map FILE... | --pread FILE...\n");
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
    auto pass = [&](int v) {
        const auto t0 = clock::now();
        if (v == 1 && populate && ::madvise(p, n, populate_write) != 0) {
            std::perror("first_touch: MADV_POPULATE_WRITE (Linux 5.14 and later)");
            std::exit(1);
        }
        std::memset(p, v, n);
        asm volatile("" : : "r"(p) : "memory");  // the writes are kept
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    const double first = pass(1), second = pass(2);
    print(n, huge, first, second, populate);
    return 0;
}
