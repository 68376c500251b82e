// Bounded memory on any input (issue 14): a record over max_record_bytes fails with the
// shard and offset instead of growing without bound, and what a decoder holds stays
// within what the README states. Each case runs its pipeline in a forked child and
// measures that child's peak RSS growth (VmHWM minus VmRSS at the start).
#include "support/test_support.hpp"

#include <sluice/formats/lines.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/io/local.hpp>
#include <sluice/ops/from.hpp>

#include <fstream>

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool measured = false;  // shadow memory and quarantines make RSS meaningless
#else
constexpr bool measured = true;
#endif

std::uint64_t status_kib(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::string(key).size()));
    return 0;
}

// `n` bytes of `fill` (no newline), written a block at a time.
std::string big_file(const sluice_test::temp_dir& d, const std::string& name, std::size_t n, char fill) {
    const std::string path = d / name;
    std::ofstream f(path, std::ios::binary);
    const std::string block(4 * MiB, fill);
    for (std::size_t done = 0; done < n; done += block.size())
        f.write(block.data(), static_cast<std::streamsize>(std::min(block.size(), n - done)));
    return path;
}

struct child_result {
    std::string text;  // what the child reported (its error message or its record)
    std::uint64_t growth = 0;
};

// Runs `body` in a forked child; it returns a line of text; the parent gets it and the
// child's peak RSS growth.
template <class F>
child_result in_child(F body) {
    int fd[2];
    REQUIRE(::pipe(fd) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fd[0]);
        const std::uint64_t start = status_kib("VmRSS:");
        std::string text;
        try {
            text = body();
        } catch (const std::exception& e) {
            text = std::string("exception: ") + e.what();
        }
        const std::uint64_t growth = (status_kib("VmHWM:") - std::min(start, status_kib("VmHWM:"))) * 1024;
        const std::string msg = std::to_string(growth) + "\n" + text;
        std::size_t off = 0;
        while (off < msg.size()) {
            const auto w = ::write(fd[1], msg.data() + off, msg.size() - off);
            if (w <= 0) break;
            off += static_cast<std::size_t>(w);
        }
        ::_exit(0);
    }
    ::close(fd[1]);
    std::string all;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd[0], buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(n));
    ::close(fd[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    const auto nl = all.find('\n');
    REQUIRE(nl != std::string::npos);
    return {all.substr(nl + 1), std::stoull(all.substr(0, nl))};
}
}  // namespace

TEST_CASE("a newline-free 400 MB file through read() | lines() fails with the shard and offset in bounded memory",
          "[bounded_memory][lines][limit]") {
    sluice_test::temp_dir d;
    const auto path = big_file(d, "no-newlines.txt", 400'000'000, 'x');
    // The budget: the two channels' bytes plus the one line lines() may hold.
    const std::size_t channels = 64 * MiB + 64 * MiB, max_line = 64 * MiB, budget = channels + max_line;
    auto r = in_child([&] {
        sluice::pipeline p(sluice::from(std::vector<sluice::shard>{{path, 0, 0}}) |
                           sluice::read({.chunk_size = 4 * MiB, .out = {16, 64 * MiB}}) |
                           sluice::lines({.max_record_bytes = max_line, .out = {1024, 64 * MiB}}));
        std::size_t n = 0;
        try {
            while (p.next_blocking()) ++n;
        } catch (const sluice::source_error& e) {
            return std::string(e.what());
        }
        return "no error after " + std::to_string(n) + " records";
    });
    REQUIRE(r.text == "sluice: line over the limit of 67108864 bytes (raise it with max_record_bytes) in '" + path +
                          "' at byte 0");
    INFO("peak RSS growth " << r.growth / MiB << " MiB, budget " << budget / MiB << " MiB");
    if (measured) REQUIRE(r.growth <= budget + 64 * MiB);
}

TEST_CASE("a 600 MB raw object streams in with max_record_bytes raised, in the object plus one chunk",
          "[bounded_memory][raw][limit]") {
    sluice_test::temp_dir d;
    const std::size_t n = 600'000'000;
    const auto path = big_file(d, "object.bin", n, 'o');
    // Over the (lowered) limit: an error naming the file, counted in memory as the limit.
    auto e = in_child([&] {
        sluice::pipeline p(sluice::from(std::vector<sluice::shard>{{path, 0, 0}}) |
                           sluice::read({.chunk_size = 4 * MiB, .out = {16, 64 * MiB}}) |
                           sluice::raw({.max_record_bytes = 256 * MiB}));
        try {
            while (p.next_blocking()) {
            }
        } catch (const sluice::source_error& x) {
            return std::string(x.what());
        }
        return std::string("no error");
    });
    REQUIRE(e.text.starts_with("sluice: object of at least "));
    REQUIRE(e.text.ends_with("bytes over the limit of 268435456 bytes (raise it with max_record_bytes) in '" + path +
                             "' at byte 0"));
    if (measured) REQUIRE(e.growth <= 256 * MiB + 64 * MiB + 64 * MiB);
    // Raised: one record of n bytes; raw holds the object plus one chunk while assembling,
    // then the consumer holds the record: n + the read channel + one chunk, not 2n.
    auto r = in_child([&] {
        sluice::pipeline p(sluice::from(std::vector<sluice::shard>{{path, 0, 0}}) |
                           sluice::read({.chunk_size = 4 * MiB, .out = {16, 64 * MiB}}) |
                           sluice::raw({.max_record_bytes = 640 * MiB}));
        std::string got;
        while (auto rec = p.next_blocking()) {
            const auto v = rec->data.view();
            const bool all_o = v.size() == n && v.front() == 'o' && v.back() == 'o' && v[n / 2] == 'o';
            got += std::to_string(v.size()) + (all_o ? " ok" : " bad") + ";";
        }
        for (auto& st : p.figures().stages)
            for (auto& [name, value] : st.counters)
                if (st.name == "raw" && name == "held_bytes_peak") got += " held_peak " + std::to_string(value);
        return got;
    });
    REQUIRE(r.text == std::to_string(n) + " ok; held_peak " + std::to_string(n));
    INFO("peak RSS growth " << r.growth / MiB << " MiB for a " << n / MiB << " MiB object");
    if (measured) REQUIRE(r.growth <= n + 64 * MiB + 64 * MiB);
}
