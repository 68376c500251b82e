// The request limit shared by the processes of a node (io/detail/node_limit.hpp): one
// count, one AIMD limit and one back-off for every process naming the directory, and what
// a killed process held comes back.
#include <sluice/io/detail/aimd.hpp>
#include <sluice/io/detail/node_limit.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <thread>

using sluice::detail::node_limit;
using namespace std::chrono_literals;

TEST_CASE("a shared limit counts the requests of every process that names its directory", "[fetch][node]") {
    sluice_test::temp_dir d;
    node_limit a(d.path().string(), 6, 2, 0ms);
    CHECK(a.fresh());
    node_limit b(d.path().string(), 4, 1, 0ms);  // a second process (a slot of its own)
    CHECK_FALSE(b.fresh());
    CHECK(a.processes() == 2);
    CHECK(a.allowed() == 6);  // the largest ceiling
    std::uint64_t seq = 0;
    for (int i = 0; i < 4; ++i) REQUIRE(a.try_take(&seq));
    REQUIRE(b.try_take(&seq));
    REQUIRE(b.try_take(&seq));
    CHECK(a.active() == 6);
    CHECK_FALSE(a.try_take(&seq));  // the node is full, whoever asks
    CHECK_FALSE(b.try_take(&seq));
    b.release(seq, true, false);
    CHECK(a.try_take(&seq));  // b's release is a's room
    CHECK(b.active() == 6);
    std::uint64_t forced = 0;
    b.take_forced(&forced);  // over the limit (a worker's own retry), counted all the same
    CHECK(a.active() == 7);
    CHECK(forced > seq);  // one sequence for the node
}

TEST_CASE("a shared limit halves once per round for every process, backs off, and grows back", "[fetch][node]") {
    sluice_test::temp_dir d;
    node_limit a(d.path().string(), 16, 2, 200ms);
    node_limit b(d.path().string(), 16, 2, 200ms);
    std::vector<std::uint64_t> seqs(8);
    for (auto& s : seqs) REQUIRE(a.try_take(&s));
    a.release(seqs[0], false, true);  // a 503 in a
    CHECK(b.allowed() == 8);          // b sees it
    CHECK(b.halvings() == 1);
    b.release(seqs[1], false, true);  // started before the halving: the same round, no second halving
    CHECK(a.allowed() == 8);
    CHECK(a.throttled() == 2);
    // The back-off: no process starts a request until it is over.
    std::uint64_t s = 0;
    CHECK(b.quiet_left() > 100ms);
    CHECK_FALSE(b.try_take(&s));
    std::this_thread::sleep_for(220ms);
    CHECK(b.quiet_left() == 0ns);
    REQUIRE(b.try_take(&s));
    b.release(s, false, true);  // a new round: halves again, to the floor at most
    CHECK(a.allowed() == 4);
    for (int i = 0; i < 10; ++i) a.release(seqs[2], false, true);  // same round: nothing more
    CHECK(a.allowed() == 4);
    // Successes add 1/limit each: about one per round.
    for (int i = 0; i < 5; ++i) a.release(seqs[2], true, false);  // 4 + 1/4 + 1/4.25 + ... = 5.07
    CHECK(b.allowed() == 5);
    CHECK(a.active() == 0);  // never below zero, whatever was released
}

TEST_CASE("a process killed while it holds requests gives them back", "[fetch][node]") {
    sluice_test::temp_dir d;
    node_limit a(d.path().string(), 4, 1, 0ms);
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {  // the child halves the limit, holds 3 requests... and is killed
        node_limit c(d.path().string(), 8, 1, 0ms);
        std::uint64_t s = 0, first = 0;
        bool ok = c.try_take(&first) && c.try_take(&s) && c.try_take(&s);
        c.release(first, false, true);  // 4 -> 2 (a raised ceiling does not raise the limit)
        c.take_forced(&s);
        ok = ok && c.active() == 3 && c.allowed() == 2;
        const char byte = ok ? 'y' : 'n';
        [[maybe_unused]] auto n = ::write(ready[1], &byte, 1);
        ::pause();
        ::_exit(0);
    }
    struct reap {  // the child goes whatever the checks say
        pid_t pid;
        ~reap() {
            if (pid <= 0) return;
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } child{pid};
    char byte = 0;
    REQUIRE(::read(ready[0], &byte, 1) == 1);
    ::close(ready[0]);
    ::close(ready[1]);
    REQUIRE(byte == 'y');
    CHECK(a.processes() == 2);
    CHECK(a.allowed() == 2);
    CHECK(a.active() == 3);
    std::uint64_t s = 0;
    CHECK_FALSE(a.try_take(&s));  // full: the child holds 3
    ::kill(pid, SIGKILL);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
    child.pid = 0;
    std::this_thread::sleep_for(120ms);  // dead slots are looked for at most every 100 ms
    CHECK_FALSE(a.try_take(&s));  // this look finds the dead slot and frees its 3...
    CHECK(a.active() == 0);
    CHECK(a.processes() == 1);
    REQUIRE(a.try_take(&s));  // ...so the next gets room
    REQUIRE(a.try_take(&s));
    CHECK_FALSE(a.try_take(&s));  // the halved limit holds: 2
}

TEST_CASE("a file left by processes that all died is started afresh", "[fetch][node]") {
    sluice_test::temp_dir d;
    const pid_t pid = ::fork();
    if (pid == 0) {
        node_limit c(d.path().string(), 8, 1, 0ms);
        std::uint64_t s = 0, t = 0;
        const bool ok = c.try_take(&s) && c.try_take(&t);
        c.release(s, false, true);  // halved to 4
        ::_exit(ok && c.allowed() == 4 ? 0 : 1);  // no destructor: as if killed, holding one
    }
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
    node_limit a(d.path().string(), 6, 1, 0ms);
    CHECK(a.fresh());
    CHECK(a.processes() == 1);
    CHECK(a.active() == 0);
    CHECK(a.allowed() == 6);
    CHECK(std::filesystem::exists(a.path()));
}

TEST_CASE("aimd_limit with a shared limit: permits need room in the node, waiters see other processes' releases",
          "[fetch][node]") {
    sluice_test::temp_dir d;
    auto mine = std::make_shared<sluice::detail::aimd_limit>(8, 1);
    mine->share(std::make_unique<node_limit>(d.path().string(), 8, 1, 0ms));
    node_limit other(d.path().string(), 8, 1, 0ms);  // another process of the node
    std::vector<std::uint64_t> held(6);
    for (auto& s : held) REQUIRE(other.try_take(&s));
    std::uint64_t a = 0, b = 0, c = 0;
    REQUIRE(mine->try_acquire(&a));
    REQUIRE(mine->try_acquire(&b));
    CHECK_FALSE(mine->try_acquire(&c));  // 6 + 2 = the node's 8, though this process holds 2 of its 8
    CHECK(mine->active() == 2);
    CHECK(mine->limit() == 8);
    other.release(held[0], false, true);  // a 503 elsewhere halves this process's limit too
    CHECK(mine->limit() == 4);
    mine->release(a, true, false);
    CHECK(other.active() == 6);
    mine->take_over(&c);  // over the limit, still counted in the node
    CHECK(other.active() == 7);
    mine->release(b, true, false);
    mine->release(c, true, false);
    CHECK(other.active() == 5);
}
