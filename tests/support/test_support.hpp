#pragma once
// Helpers shared by the tests: temporary directories, child processes and running
// programs, reading JSON numbers, and a type that counts its copies, moves and
// destructions.

#include <sluice/core/detail/random.hpp>
#include <sluice/core/pipeline.hpp>

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <thread>
#include <chrono>
#include <string>
#include <vector>

namespace sluice_test {

/// A fresh directory under the system temp dir, removed with everything in it.
class temp_dir {
public:
    temp_dir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-test-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
        std::filesystem::remove_all(path_, ec);
    }
    const std::filesystem::path& path() const { return path_; }
    std::string operator/(const std::string& name) const { return (path_ / name).string(); }
    std::string write(const std::string& name, const std::string& content) const {
        auto p = path_ / name;
        std::filesystem::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary) << content;
        return p.string();
    }

private:
    std::filesystem::path path_;
};

struct run_result {
    int status = -1;
    std::string out, err;
};

/// A child process, stopped (SIGTERM, then SIGKILL) and reaped by pid on destruction.
class child {
public:
    /// Starts argv with stdout to `out_path` (and stderr to `err_path`).
    child(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path) {
        pid_ = ::fork();
        if (pid_ == 0) {
            if (!std::freopen(out_path.c_str(), "w", stdout) || !std::freopen(err_path.c_str(), "w", stderr)) ::_exit(126);
            std::vector<char*> args;
            for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
            args.push_back(nullptr);
            ::execvp(args[0], args.data());
            ::_exit(127);
        }
    }
    ~child() { stop(); }
    child(const child&) = delete;
    child& operator=(const child&) = delete;
    pid_t pid() const { return pid_; }
    /// Waits for it to exit; its exit status (128 + signal when killed by one).
    int wait() {
        int st = 0;
        if (pid_ <= 0 || ::waitpid(pid_, &st, 0) != pid_) return -1;
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    bool running() {
        if (pid_ <= 0) return false;
        int st = 0;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            return false;
        }
        return true;
    }
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        for (int i = 0; i < 200; ++i) {
            int st = 0;
            if (::waitpid(pid_, &st, WNOHANG) == pid_) {
                pid_ = -1;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ::kill(pid_, SIGKILL);
        int st = 0;
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
    }

private:
    pid_t pid_ = -1;
};

/// 0, 1, ..., n - 1.
inline std::vector<int> iota(int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
}

inline std::string slurp_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

/// Run argv[0] (found on PATH unless it holds a '/') with arguments, capturing stdout
/// and stderr (through files: no deadlock on full pipes).
inline run_result run(const std::vector<std::string>& argv) {
    temp_dir d;
    child c(argv, d / "stdout", d / "stderr");
    run_result r;
    r.status = c.wait();
    r.out = slurp_file(d / "stdout");
    r.err = slurp_file(d / "stderr");
    return r;
}

#ifdef SLUICE_PROBE
/// sluice-probe with `args`, as a user runs it (the integration tests' binary names it).
inline run_result probe(std::vector<std::string> args) {
    args.insert(args.begin(), SLUICE_PROBE);
    return run(args);
}
#endif

/// The number (or string) value of "key" in a flat-enough JSON text.
inline std::optional<std::string> json_field(const std::string& json, const std::string& key) {
    std::smatch m;
    const std::regex re("\"" + key + "\":(\"[^\"]*\"|[-0-9.eE+]+|true|false)");
    if (!std::regex_search(json, m, re)) return std::nullopt;
    return m[1].str();
}
inline std::uint64_t json_u64(const std::string& json, const std::string& key) {
    auto v = json_field(json, key);
    INFO("JSON: " << json);
    REQUIRE(v);
    return std::stoull(*v);
}

/// Counts live instances, copies and moves: proves no leak and no double destruction.
struct counted {
    static inline std::atomic<long> live{0}, copies{0}, destroyed{0};
    int value = 0;
    bool alive = true;
    explicit counted(int v = 0) : value(v) { ++live; }
    counted(const counted& o) : value(o.value) {
        if (!o.alive) std::abort();  // copied after destruction
        ++live;
        ++copies;
    }
    counted(counted&& o) noexcept : value(o.value) { ++live; }
    counted& operator=(const counted& o) {
        value = o.value;
        ++copies;
        return *this;
    }
    counted& operator=(counted&& o) noexcept {
        value = o.value;
        return *this;
    }
    ~counted() {
        if (!alive) std::abort();  // destroyed twice
        alive = false;
        --live;
        ++destroyed;
    }
    static void reset() {
        live = 0;
        copies = 0;
        destroyed = 0;
    }
};

/// An assertion for code running on other threads (Catch2's REQUIRE is not thread-safe):
/// throws, and the test's runner rethrows on the test thread.
inline void must(bool ok, const char* what = "check failed") {
    if (!ok) throw std::runtime_error(what);
}

/// A seed printed with the test, overridable with SLUICE_TEST_SEED.
inline std::uint64_t test_seed() {
    static const std::uint64_t seed = [] {
        if (const char* s = std::getenv("SLUICE_TEST_SEED")) return std::uint64_t(std::stoull(s));
        return std::uint64_t(std::random_device{}());
    }();
    return seed;
}

/// n bytes from r.
inline std::string random_bytes(sluice::detail::rng& r, std::size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(r.next());
    return s;
}

/// The names of this process's threads now (/proc/self/task/*/comm), each as often as
/// threads carry it.
inline std::multiset<std::string> thread_names() {
    std::multiset<std::string> names;
    for (auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream comm(t.path() / "comm");
        std::string name;
        std::getline(comm, name);
        names.insert(name);
    }
    return names;
}

/// A stage's counter in a pipeline's figures (0 when absent).
inline std::uint64_t counter(const sluice::pipeline_figures& f, const std::string& stage, const std::string& name) {
    for (auto& s : f.stages)
        if (s.name == stage)
            for (auto& [n, v] : s.counters)
                if (n == name) return v;
    return 0;
}

/// Sets environment variables for a scope, restoring what was there.
class scoped_env {
public:
    scoped_env(std::vector<std::pair<std::string, std::optional<std::string>>> vars) {
        for (auto& [k, v] : vars) {
            const char* old = std::getenv(k.c_str());
            saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
            if (v) ::setenv(k.c_str(), v->c_str(), 1);
            else ::unsetenv(k.c_str());
        }
    }
    ~scoped_env() {
        for (auto& [k, v] : saved_) {
            if (v) ::setenv(k.c_str(), v->c_str(), 1);
            else ::unsetenv(k.c_str());
        }
    }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;

private:
    std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace sluice_test
