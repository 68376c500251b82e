#include <sluice/ops/batch.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace {
std::vector<sluice::record> records(const std::vector<std::string>& texts) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < texts.size(); ++i) out.push_back({sluice::bytes::copy_of(texts[i]), s, i, 0});
    return out;
}
}  // namespace

TEST_CASE("records are collated into one buffer with offsets", "[batch]") {
    std::vector<sluice::host_batch> got;
    for (auto& b : sluice::pipeline(sluice::from(records({"a", "bcd", "", "efgh", "ij"})) | sluice::batch({.size = 2})))
        got.push_back(b);
    REQUIRE(got.size() == 3);
    REQUIRE(got[0].size() == 2);
    REQUIRE(got[0].data.view() == "abcd");
    REQUIRE(got[0].offsets == std::vector<std::uint64_t>{0, 1, 4});
    auto r1 = got[0][1];
    REQUIRE(std::string(reinterpret_cast<const char*>(r1.data()), r1.size()) == "bcd");
    REQUIRE(got[1][0].empty());  // ragged, even empty, records
    REQUIRE(got[1].data.view() == "efgh");
    REQUIRE(got[2].size() == 1);  // the partial last batch
    REQUIRE(got[2].key(0) == "f#4");
}

TEST_CASE("drop_last drops a partial last batch", "[batch]") {
    std::size_t n = 0;
    for (auto& b : sluice::pipeline(sluice::from(records({"a", "b", "c"})) | sluice::batch({.size = 2, .drop_last = true}))) {
        REQUIRE(b.size() == 2);
        ++n;
    }
    REQUIRE(n == 1);
}

TEST_CASE("a user collate function makes any batch type", "[batch]") {
    std::vector<int> got;
    auto sums = sluice::batch({.size = 3}, [](std::vector<int>& g) {
        int s = 0;
        for (int x : g) s += x;
        return s;
    });
    for (int s : sluice::pipeline(sluice::from<int>({1, 2, 3, 4, 5, 6, 7}) | sums)) got.push_back(s);
    REQUIRE(got == std::vector<int>{6, 15, 7});
}

TEST_CASE("batches are collated into memory from the given source", "[batch]") {
    struct counting_source : sluice::buffer_source {
        std::atomic<int> calls{0};
        std::shared_ptr<sluice::buffer> allocate(std::size_t n) override {
            ++calls;
            return std::make_shared<sluice::buffer>(n);
        }
    };
    auto mem = std::make_shared<counting_source>();
    std::size_t n = 0;
    for (auto& b : sluice::pipeline(sluice::from(records({"x", "y", "z"})) | sluice::batch({.size = 1, .memory = mem})))
        n += b.size();
    REQUIRE(n == 3);
    REQUIRE(mem->calls.load() == 3);
}

TEST_CASE("batches collated on several workers come out in order", "[batch]") {
    std::vector<std::string> texts;
    for (int i = 0; i < 1000; ++i) texts.push_back(std::string(i % 37, char('a' + i % 26)));
    auto run = [&](unsigned threads) {
        std::vector<std::string> out;
        for (auto& b : sluice::pipeline(sluice::from(records(texts)) | sluice::batch({.size = 7, .concurrency = threads}),
                                        {.runtime = {.cpu_threads = 3}})) {
            REQUIRE(b.offsets.size() == b.size() + 1);
            out.emplace_back(b.data.view());
            out.back() += "|" + b.key(0);
        }
        return out;
    };
    const auto one = run(1);
    REQUIRE(one.size() == 143);  // 1000 / 7, the last one partial
    REQUIRE(run(3) == one);
}

TEST_CASE("batches never mix epochs and carry where they end in the sequence", "[batch]") {
    std::vector<sluice::record> rs;
    for (std::uint32_t e = 0; e < 2; ++e) {
        auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", e, 0});
        for (int i = 0; i < 10; ++i) rs.push_back({sluice::bytes::copy_of("x"), s, std::uint64_t(i), 0});
    }
    for (bool drop : {false, true}) {
        std::vector<std::pair<std::uint32_t, std::uint64_t>> got;
        for (auto& b : sluice::pipeline(sluice::from(rs) | sluice::batch({.size = 4, .drop_last = drop}))) {
            for (auto& src : b.sources) REQUIRE(src->epoch == b.epoch);
            got.emplace_back(b.epoch, b.position);
        }
        if (drop) REQUIRE(got == std::vector<std::pair<std::uint32_t, std::uint64_t>>{{0, 4}, {0, 8}, {1, 4}, {1, 8}});
        else
            REQUIRE(got == std::vector<std::pair<std::uint32_t, std::uint64_t>>{
                               {0, 4}, {0, 8}, {0, 10}, {1, 4}, {1, 8}, {1, 10}});
    }
}

// Not in an anonymous namespace: a stage's coroutine frame holding it would have no
// linkage (g++'s -Wsubobject-linkage).
struct batch_test_tagged {
    std::shared_ptr<const sluice::shard> source;
    int value;
};

TEST_CASE("batches of the user's own type have a position when their items carry their shard", "[batch]") {
    std::vector<sluice::record> rs;
    for (std::uint32_t e = 0; e < 2; ++e) {
        auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", e, 0});
        for (int i = 0; i < 6; ++i) rs.push_back({sluice::bytes::copy_of("x"), s, std::uint64_t(i), 0});
    }
    auto sum = [](std::vector<batch_test_tagged>& v) {
        int n = 0;
        for (auto& t : v) n += t.value;
        return n;
    };
    sluice::pipeline p(sluice::from(rs) | sluice::map([](sluice::record r) { return batch_test_tagged{r.source, 1}; }) |
                       sluice::batch({.size = 4}, sum));
    std::vector<int> sizes;
    for (int i = 0; i < 3; ++i) sizes.push_back(*p.next_blocking());
    REQUIRE(sizes == std::vector<int>{4, 2, 4});  // epoch 0: 4 + 2, then epoch 1
    const auto state = p.state();
    REQUIRE(state.find("epoch 1\nposition 4\n") != std::string::npos);

    // Items that do not say their epoch: state() says why it cannot.
    sluice::pipeline q(sluice::from(rs) | sluice::map([](sluice::record) { return 1; }) |
                       sluice::batch({.size = 4}, [](std::vector<int>& v) { return v.size(); }));
    REQUIRE(q.next_blocking());
    REQUIRE_THROWS_WITH(q.state(), Catch::Contains("the items reaching batch do not say which epoch they belong to"));
}

TEST_CASE("with epoch sizes known, late records of an epoch still join its batches (unordered stages above)", "[batch]") {
    auto e0 = std::make_shared<const sluice::shard>(sluice::shard{"f", 0, 0});
    auto e1 = std::make_shared<const sluice::shard>(sluice::shard{"f", 1, 0});
    std::vector<sluice::record> rs;
    auto add = [&](const std::shared_ptr<const sluice::shard>& s, int from, int to) {
        for (int i = from; i < to; ++i) rs.push_back({sluice::bytes::copy_of("x"), s, std::uint64_t(i), 0});
    };
    add(e0, 0, 10), add(e1, 0, 3), add(e0, 10, 12), add(e1, 3, 10);  // epoch 0's last two arrive late
    // What plan publishes when it has record counts: each epoch's size.
    auto sizes = sluice::make_stage<sluice::record, sluice::record>(
        "sizes", {},
        [](sluice::stage_setup& s) {
            s.internal.run->set_epoch_records(0, 12);
            s.internal.run->set_epoch_records(1, 10);
        },
        [](sluice::stage_context<sluice::record, sluice::record>& ctx) -> sluice::task<void> {
            while (auto r = co_await ctx.in.next()) co_await ctx.out.send(std::move(*r));
        });
    for (bool drop : {false, true}) {
        std::map<std::uint32_t, std::vector<std::size_t>> sizes_by_epoch;
        for (auto& b : sluice::pipeline(sluice::from(rs) | sizes | sluice::batch({.size = 4, .drop_last = drop}))) {
            for (auto& src : b.sources) REQUIRE(src->epoch == b.epoch);
            sizes_by_epoch[b.epoch].push_back(b.size());
        }
        REQUIRE(sizes_by_epoch[0] == std::vector<std::size_t>{4, 4, 4});
        if (drop) REQUIRE(sizes_by_epoch[1] == std::vector<std::size_t>{4, 4});
        else REQUIRE(sizes_by_epoch[1] == std::vector<std::size_t>{4, 4, 2});
    }
}

TEST_CASE("a user's collate runs on `concurrency` workers, batches still in order and stamped", "[batch]") {
    std::vector<sluice::record> rs;
    for (std::uint32_t e = 0; e < 2; ++e) {
        auto s = std::make_shared<const sluice::shard>(sluice::shard{"f", e, 0});
        for (int i = 0; i < 200; ++i) rs.push_back({sluice::bytes::copy_of("x"), s, std::uint64_t(i), 0});
    }
    std::mutex m;
    std::set<std::thread::id> threads;
    std::atomic<int> running{0}, peak{0};
    // Each item: its epoch and index; a batch: the list of them, made slowly.
    auto collate = [&](std::vector<batch_test_tagged>& g) {
        const int now = ++running;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {}
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        {
            std::lock_guard lock(m);
            threads.insert(std::this_thread::get_id());
        }
        std::vector<int> out;
        for (auto& t : g) out.push_back(int(t.source->epoch) * 1000 + t.value);
        --running;
        return out;
    };
    auto run = [&](unsigned n, std::vector<std::string>* states = nullptr) {
        std::vector<std::vector<int>> out;
        sluice::pipeline p(sluice::from(rs) |
                               sluice::map([](sluice::record r) { return batch_test_tagged{r.source, int(r.index)}; }) |
                               sluice::batch({.size = 9, .concurrency = n}, collate),
                           {.runtime = {.cpu_threads = 4}});
        while (auto b = p.next_blocking()) {
            out.push_back(*b);
            if (states) states->push_back(p.state());
        }
        return out;
    };
    std::vector<std::string> states1, states4;
    const auto one = run(1, &states1);
    REQUIRE(one.size() == 2 * 23);  // 200 / 9 per epoch, the last one partial
    REQUIRE(peak.load() == 1);
    threads.clear();
    REQUIRE(run(4, &states4) == one);  // the same batches, in the same order
    REQUIRE(peak.load() > 1);          // collated at once on several workers
    REQUIRE(threads.size() > 1);
    REQUIRE(states4 == states1);  // each batch still has its place in the sequence
}

TEST_CASE("batch's options reject nothing silently: threads with a collate is a two-stage batch", "[batch]") {
    auto sum = [](std::vector<int>& v) {
        int s = 0;
        for (int x : v) s += x;
        return s;
    };
    sluice::pipeline p(sluice::from<int>({1, 2, 3, 4, 5, 6, 7}) | sluice::batch({.size = 3, .concurrency = 2}, sum));
    std::vector<int> got;
    for (int s : p) got.push_back(s);
    REQUIRE(got == std::vector<int>{6, 15, 7});
    const auto f = p.figures().table();
    REQUIRE(f.find("group") != std::string::npos);  // grouping, then collation on 2 workers
}

TEST_CASE("batch of records groups and collates on one worker by default, under a budget too, the same batches", "[batch]") {
    std::vector<std::string> texts;
    for (int i = 0; i < 1000; ++i) texts.push_back(std::string(std::size_t(i % 37), char('a' + i % 26)) + std::to_string(i));
    auto run = [&](sluice::batch_options o, sluice::pipeline_options po) {
        sluice::pipeline p(sluice::from(records(texts)) | sluice::batch(o), po);
        std::vector<std::tuple<std::string, std::vector<std::uint64_t>, std::uint64_t>> got;
        for (auto& b : p) got.emplace_back(std::string(b.data.view()), b.offsets, b.position);
        return std::pair{got, p.figures()};
    };
    auto workers = [](const sluice::pipeline_figures& f, const std::string& name) {
        for (auto& s : f.stages)
            if (s.name == name) return s.workers;
        return 0u;
    };
    const auto [one, f1] = run({.size = 64, .concurrency = 1}, {});
    REQUIRE(one.size() == 16);  // 15 of 64 and the last of 40
    REQUIRE(workers(f1, "group") == 0);  // one stage
    for (std::size_t budget : {std::size_t{0}, std::size_t{64} << 20}) {
        const auto [automatic, fa] = run({.size = 64}, {.memory = budget});
        REQUIRE(automatic == one);  // the same bytes, offsets and places in the sequence
        if (sluice::detail::usable_cpus() >= 2) {
            REQUIRE(workers(fa, "group") == 1);  // grouping, then collation on one worker (helped)
            REQUIRE(workers(fa, "batch") == 1);
        } else {
            REQUIRE(workers(fa, "group") == 0);
        }
    }
    const auto [two, f2] = run({.size = 64, .concurrency = 2}, {});
    REQUIRE(two == one);
    REQUIRE(workers(f2, "batch") == 2);
    // A user's collate function is not assumed thread-safe: one stage, one worker.
    sluice::pipeline u(sluice::from<int>({1, 2, 3}) | sluice::batch({.size = 2}, [](std::vector<int>& v) { return v.size(); }));
    for (auto n : u) REQUIRE(n > 0);
    REQUIRE(workers(u.figures(), "group") == 0);
}

namespace {
// `n` records of 64 KiB (about 4 MiB a batch of 64), each byte telling its record apart.
std::vector<sluice::record> large_records(std::size_t n) {
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"big", 0, 0});
    std::vector<sluice::record> out;
    for (std::size_t i = 0; i < n; ++i)
        out.push_back({sluice::bytes::copy_of(std::string(std::size_t{64} << 10, char('A' + i % 50)) + std::to_string(i)),
                       s, i, 0});
    return out;
}
}  // namespace

TEST_CASE("a large batch's copy shared by two threads gives the bytes of one, its first bad record in order", "[batch]") {
    auto rs = large_records(100);
    std::vector<std::uint64_t> offsets{0};
    for (auto& r : rs) offsets.push_back(offsets.back() + r.data.size());
    std::string want;
    for (auto& r : rs) want += r.data.view();
    // Records 70 and 31 carry a wrong TFRecord data checksum: whichever thread copies
    // which, the first in record order is the one reported.
    for (std::size_t i : {std::size_t{70}, std::size_t{31}}) rs[i].unchecked_crc32c = 12345;
    auto bytes_of = [](const std::vector<std::byte>& d) { return std::string(reinterpret_cast<const char*>(d.data()), d.size()); };
    SECTION("the helper copies everything before the worker starts") {
        std::vector<std::byte> dst(offsets.back());
        sluice::detail::collate_copy copy(rs, dst.data(), offsets, true);
        std::uint32_t by_helper = 0;
        std::thread([&] { by_helper = copy.work(); }).join();
        REQUIRE(by_helper == rs.size());
        REQUIRE(copy.work() == 0);  // the worker finds nothing left
        REQUIRE(copy.wait() == std::optional<std::size_t>(31));
        REQUIRE(bytes_of(dst) == want);
    }
    SECTION("the worker copies everything; a helper that starts late takes nothing") {
        std::vector<std::byte> dst(offsets.back());
        sluice::detail::collate_copy copy(rs, dst.data(), offsets, false);
        REQUIRE(copy.work() == rs.size());
        REQUIRE(copy.wait() == std::optional<std::size_t>(31));
        std::uint32_t by_helper = 1;
        std::thread([&] { by_helper = copy.work(); }).join();
        REQUIRE(by_helper == 0);
        REQUIRE(bytes_of(dst) == want);
    }
    SECTION("both at once") {
        for (int round = 0; round < 20; ++round) {
            std::vector<std::byte> dst(offsets.back());
            sluice::detail::collate_copy copy(rs, dst.data(), offsets, round % 2 == 0);
            std::uint32_t by_helper = 0;
            std::thread helper([&] { by_helper = copy.work(); });
            const std::uint32_t by_worker = copy.work();
            const auto bad = copy.wait();
            helper.join();
            REQUIRE(by_worker + by_helper == rs.size());  // every record once
            REQUIRE(bytes_of(dst) == want);
            REQUIRE(bad == std::optional<std::size_t>(31));
        }
    }
}

TEST_CASE("fresh batch memory: the collation takes its faulting over once, and two threads copy the bytes of one",
          "[batch]") {
    auto rs = large_records(100);  // 6.4 MB: a batch two threads share
    std::vector<std::uint64_t> offsets{0};
    for (auto& r : rs) offsets.push_back(offsets.back() + r.data.size());
    std::string want;
    for (auto& r : rs) want += r.data.view();
    auto pool = sluice::buffer_pool::create(128 << 20);
    auto b = pool->allocate(offsets.back());
    // Fresh once: the collation takes the faulting over, and will_write then does nothing.
    REQUIRE(b->take_fresh());
    REQUIRE_FALSE(b->take_fresh());
    sluice::detail::collate_copy copy(rs, b->data(), offsets, true, /*populate=*/true);
    std::uint32_t by_helper = 0;
    std::thread helper([&] { by_helper = copy.work(); });
    const std::uint32_t by_worker = copy.work();
    REQUIRE_FALSE(copy.wait().has_value());
    helper.join();
    REQUIRE(by_worker + by_helper == rs.size());
    REQUIRE(std::string(reinterpret_cast<const char*>(b->data()), offsets.back()) == want);
    // Memory the pool hands out again is not fresh.
    const std::byte* first = b->data();
    b.reset();
    auto again = pool->allocate(offsets.back());
    REQUIRE(again->data() == first);
    REQUIRE_FALSE(again->take_fresh());
}

TEST_CASE("collate_records asks for memory of a varying size only when the batch's records differ in size", "[batch]") {
    auto mem = sluice::buffer_pool::create();
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"even", 0, 0});
    std::vector<sluice::record> even;
    for (std::size_t i = 0; i < 70; ++i)
        even.push_back({sluice::bytes::copy_of(std::string(std::size_t{64} << 10, char('a' + i % 26))), s, i, 0});
    const std::size_t total = 70u * (64u << 10);  // 4.375 MiB: the 5 MiB class
    {
        const sluice::host_batch b = sluice::detail::collate_records(even, *mem);
        REQUIRE(b.data.size() == total);
        REQUIRE(b.data.owner_capacity() == sluice::buffer_pool::size_class(total));  // fixed: its class
    }
    auto fresh = sluice::buffer_pool::create();
    auto ragged = large_records(70);  // 64 KiB and a number each: sizes differ
    const sluice::host_batch b = sluice::detail::collate_records(ragged, *fresh);
    REQUIRE(b.data.owner_capacity() ==
            sluice::buffer_pool::size_class(sluice::buffer_pool::size_class(b.data.size()) + 1));  // one class larger
}

TEST_CASE("collate_records with a helper that runs only after the batch is done: the worker copies all", "[batch]") {
    // An executor whose work runs when asked: the helper task is posted, the worker copies
    // every record and returns, and the helper, run afterwards (the records and the batch
    // gone), claims nothing.
    asio::io_context later;
    const sluice::executor ex = later.get_executor();
    std::atomic<std::uint64_t> helped{0};
    auto mem = sluice::buffer_pool::create();
    {
        auto rs = large_records(70);
        std::string want;
        for (auto& r : rs) want += r.data.view();
        const sluice::host_batch b = sluice::detail::collate_records(rs, *mem, &ex, &helped);
        REQUIRE(b.data.view() == want);
        REQUIRE(b.size() == 70);
        REQUIRE(b.key(69) == "big#69");
    }
    REQUIRE(later.run() == 1);  // the helper ran
    REQUIRE(helped.load() == 0);
    // A corrupt record is the parser's error, shard and offset, with a helper too.
    auto bad = large_records(70);
    bad[40].unchecked_crc32c = 7;
    bad[60].unchecked_crc32c = 8;
    REQUIRE_THROWS_WITH(sluice::detail::collate_records(bad, *mem, &ex, &helped),
                        Catch::Contains("bad TFRecord data checksum (record 40)") && Catch::Contains("big"));
    later.restart();
    REQUIRE(later.run() == 1);
    REQUIRE(helped.load() == 0);
}

TEST_CASE("batches of 4 MiB and more are the same bytes when the default collation shares their copy", "[batch]") {
    auto run = [](unsigned concurrency) {
        sluice::pipeline p(sluice::from(large_records(640)) | sluice::batch({.size = 64, .concurrency = concurrency}),
                           {.runtime = {.cpu_threads = 2}});
        std::vector<std::pair<std::string, std::vector<std::uint64_t>>> got;
        for (auto& b : p) {
            REQUIRE(b.byte_size() >= sluice::detail::helped_collation_bytes);
            got.emplace_back(std::string(b.data.view()), b.offsets);
            REQUIRE(b.key(63) == "big#" + std::to_string(got.size() * 64 - 1));
        }
        std::optional<std::uint64_t> helped;  // the counter, where the stage has one
        for (auto& s : p.figures().stages)
            for (auto& [name, v] : s.counters)
                if (name == "helped_records") helped = v;
        return std::pair{got, helped};
    };
    const auto [one, none] = run(1);
    REQUIRE(one.size() == 10);
    REQUIRE(!none);  // one thread by hand: no helper
    const auto [automatic, helped] = run(0);
    REQUIRE(automatic == one);
    if (sluice::detail::usable_cpus() >= 2) REQUIRE(helped.has_value());  // the helper was offered
    // How many records the second thread took depends on timing.
}

TEST_CASE("under a memory budget the automatic batch holds two groups of records, the one collated and the one filled",
          "[batch][memory]") {
    if (sluice::detail::usable_cpus() < 2) {
        WARN("[test skipped] one usable CPU: batch is one stage, which holds one group");
        return;
    }
    // Each record's bytes copied into a buffer that counts itself while it lives.
    std::atomic<long> live{0}, most{0};
    auto tracked = [&live, &most](sluice::record r) {
        auto b = std::shared_ptr<sluice::buffer>(new sluice::buffer(r.data.size()), [&live](sluice::buffer* p) {
            --live;
            delete p;
        });
        std::memcpy(b->data(), r.data.data(), r.data.size());
        const long now = ++live;
        for (long m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        r.data = sluice::bytes(std::move(b), r.data.size());
        return r;
    };
    std::vector<std::string> texts;
    for (int i = 0; i < 400; ++i) texts.push_back("record " + std::to_string(i));
    constexpr long size = 16;
    auto most_held = [&](std::size_t budget) {
        live = 0;
        most = 0;
        sluice::pipeline p(sluice::from(records(texts)) | sluice::map(tracked, {.out = {1, 0}}) |
                               sluice::batch({.size = size}),
                           {.memory = budget});
        long n = 0;
        for (auto& b : p) {
            REQUIRE(b.offsets.size() == size + 1);
            ++n;
            std::this_thread::sleep_for(std::chrono::milliseconds(3));  // slow: every stage waits, its channel full
        }
        REQUIRE(n == 25);
        return most.load();
    };
    // Besides the two groups: the record map holds and the one in its channel. (Without a
    // budget a third group may be filled while one waits for the collator and one is
    // collated: 50 here on the code before, and 34-49 without a budget now, as timing has it.)
    const long budgeted = most_held(std::size_t{64} << 20);
    INFO(budgeted << " records held at most");
    CHECK(budgeted <= 2 * size + 2);
    CHECK(budgeted >= size);  // the counting works: a whole group was held
}

namespace {
std::optional<std::uint64_t> stage_counter(const sluice::pipeline_figures& f, const std::string& stage, const std::string& name) {
    for (auto& s : f.stages)
        if (s.name == stage)
            for (auto& [n, v] : s.counters)
                if (n == name) return v;
    return std::nullopt;
}
}  // namespace

TEST_CASE("records that hold a buffer of their own are copied into their batch as they arrive, others at collation",
          "[batch]") {
    if (sluice::detail::usable_cpus() < 2) {
        WARN("[test skipped] one hardware thread: batch is one stage, which copies each batch whole");
        return;
    }
    // Sizes that grow: the first group's buffer, sized from its first record, must grow
    // (and move what it holds); later groups are sized from the last.
    std::vector<std::string> texts;
    for (int i = 0; i < 300; ++i)
        texts.push_back(std::string(std::size_t(i < 5 ? 3 : 20000 + i * 97 % 40000), char('a' + i % 26)) + std::to_string(i));
    // from() keeps its records, so each is given a copy of its own on the way (as fetch
    // or read give each object or file one), or a slice of one shared buffer.
    auto own = [](sluice::record r) {
        r.data = sluice::bytes::copy_of(r.data.span());
        return r;
    };
    std::string all;
    std::vector<std::size_t> starts;
    for (auto& t : texts) {
        starts.push_back(all.size());
        all += t;
    }
    auto shared = [whole = sluice::bytes::copy_of(all), starts](sluice::record r) {
        r.data = whole.slice(starts[r.index], r.data.size());
        return r;
    };
    auto run = [&](auto give, sluice::batch_options o, std::size_t budget = 0) {
        sluice::pipeline p(sluice::from(records(texts)) | sluice::map(give) | sluice::batch(o),
                           {.runtime = {.cpu_threads = 2}, .memory = budget});
        std::vector<std::tuple<std::string, std::vector<std::uint64_t>, std::uint64_t, std::string>> got;
        for (auto& b : p) got.emplace_back(std::string(b.data.view()), b.offsets, b.position, b.key(0));
        return std::pair{got, p.figures()};
    };
    const auto [want, f1] = run(own, {.size = 64, .concurrency = 1});  // one stage: copies at collation
    REQUIRE(want.size() == 5);
    SECTION("records in buffers of their own: every one copied on arrival, the same batches") {
        const auto [got, f] = run(own, {.size = 64});
        REQUIRE(got == want);
        // Every one, the first group's too: the collator's pool is noted at setup, before
        // any record arrives (noted when the collating worker first ran, two whole groups
        // went by first once on a busy machine: 172 of 300).
        const auto copied = stage_counter(f, "group", "copied_on_arrival").value_or(0);
        INFO("copied on arrival: " << copied);
        REQUIRE(copied == texts.size());
    }
    SECTION("batches of 4 MiB or more (written with streaming stores): the same batches") {
        const auto [want_large, f0] = run(own, {.size = 200, .concurrency = 1});
        REQUIRE(want_large.size() == 2);
        REQUIRE(std::get<0>(want_large[0]).size() >= sluice::detail::streamed_batch_bytes);
        const auto [got, f] = run(own, {.size = 200});
        REQUIRE(got == want_large);
        REQUIRE(stage_counter(f, "group", "copied_on_arrival").value_or(0) == texts.size());
    }
    SECTION("records that share one buffer are left to collation") {
        const auto [got, f] = run(shared, {.size = 64});
        REQUIRE(got == want);
        REQUIRE(stage_counter(f, "group", "copied_on_arrival") == std::optional<std::uint64_t>(0));
    }
    SECTION("under a memory budget nothing is copied on arrival") {
        const auto [got, f] = run(own, {.size = 64}, std::size_t{256} << 20);
        REQUIRE(got == want);
        REQUIRE(stage_counter(f, "group", "copied_on_arrival").value_or(0) == 0);
    }
}

TEST_CASE("the collator's pool is noted per runtime, weakly: another pool is not, and the note keeps none alive", "[batch]") {
    sluice::detail::collation_memory memory;
    std::shared_ptr<sluice::buffer_source> a = sluice::buffer_pool::create(std::size_t{1} << 20);
    std::shared_ptr<sluice::buffer_source> b = sluice::buffer_pool::create(std::size_t{1} << 20);
    REQUIRE_FALSE(memory.noted(a));
    memory.note(a);
    REQUIRE(memory.noted(a));
    REQUIRE_FALSE(memory.noted(b));
    std::weak_ptr<sluice::buffer_source> gone = a;
    a.reset();
    REQUIRE(gone.expired());  // the note did not keep a finished pipeline's pool alive
    memory.note(b);
    REQUIRE(memory.noted(b));
}

TEST_CASE("an epoch's first group copied on arrival is sized from the last epoch's batch and reuses its buffer",
          "[batch]") {
    std::shared_ptr<sluice::buffer_source> pool = sluice::buffer_pool::create(std::size_t{256} << 20);
    std::atomic<std::uint64_t> copied{0};
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"objects", 0, 0});
    const std::size_t n = 64;
    // A small first record, then 100 KB ones: a guess from the first record (64 KB) is far
    // too small for the batch (6.3 MB).
    auto text = [](std::uint64_t i) { return std::string(i == 0 ? 1'000 : 100'000, char('a' + i % 26)); };
    // Where the group's first record was copied to when it arrived.
    auto fill = [&](sluice::detail::early_collation& early, std::vector<sluice::record>& group) {
        const std::byte* at = nullptr;
        for (std::size_t i = 0; i < n; ++i) {
            group.push_back(sluice::record{sluice::bytes::copy_of(text(i)), s, i, 0});
            early.add(group, n);
            if (i == 0) at = group[0].data.data();
        }
        return at;
    };
    // As batch_worker keeps it: each epoch opens with a copy of the worker's own.
    sluice::detail::early_collation worker(pool, &copied);
    sluice::detail::early_collation epoch1 = worker;
    std::vector<sluice::record> g1;
    fill(epoch1, g1);
    auto b1 = epoch1.take();
    REQUIRE(b1 != nullptr);
    const std::byte* first = b1->data();
    worker.size_from(epoch1);
    b1.reset();
    g1.clear();  // the consumer let the batch go
    // The epoch's short last batch, one small record, copied into the same buffer: the
    // next epoch is still sized from the last whole batch (from this one's 1 KB, its first
    // record would go to a small buffer).
    std::vector<sluice::record> last{sluice::record{sluice::bytes::copy_of(text(0)), s, 0, 0}};
    epoch1.add(last, n);
    auto b_last = epoch1.take();
    REQUIRE(b_last != nullptr);
    REQUIRE(b_last->data() == first);
    worker.size_from(epoch1);
    b_last.reset();
    last.clear();
    sluice::detail::early_collation epoch2 = worker;
    std::vector<sluice::record> g2;
    const std::byte* at = fill(epoch2, g2);
    REQUIRE(copied == 2 * n + 1);
    auto b2 = epoch2.take();
    REQUIRE(b2 != nullptr);
    // Sized from the last batch: its first record went straight into the kept buffer,
    // which held the whole batch (from the first record's 64 KB guess it would have gone
    // to a small buffer, grown and moved as the group filled).
    REQUIRE(at == first);
    REQUIRE(b2->data() == first);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(g2[i].data.view() == text(i));
}

namespace {
// Objects of 100 KB joining groups of 64 (a batch of 6.4 MB) with the copy on arrival,
// which waits `wait` for the last batch's buffer once a group's first eighth has joined.
struct arrivals {
    static constexpr std::size_t n = 64;
    explicit arrivals(std::chrono::steady_clock::duration wait) : early(pool, &copied, wait) {}
    static std::string text(std::uint64_t i) { return std::string(100'000, char('a' + i % 26)); }
    // Objects join `group` until it holds `count`.
    void fill(std::vector<sluice::record>& group, std::size_t count) {
        for (std::size_t i = group.size(); i < count; ++i) {
            group.push_back(sluice::record{sluice::bytes::copy_of(text(i)), s, i, 0});
            early.add(group, n);
        }
    }
    void check(const std::vector<sluice::record>& group) const {
        for (std::size_t i = 0; i < n; ++i) REQUIRE(group[i].data.view() == text(i));
    }
    std::shared_ptr<sluice::buffer_source> pool = sluice::buffer_pool::create(std::size_t{256} << 20);
    std::atomic<std::uint64_t> copied{0};
    std::shared_ptr<const sluice::shard> s = std::make_shared<const sluice::shard>(sluice::shard{"objects", 0, 0});
    sluice::detail::early_collation early;  // made last: it takes pool and copied
};
}  // namespace

TEST_CASE("a group copied on arrival waits a little for the last batch's buffer before it takes fresh memory", "[batch]") {
    // How long a group waits once its first eighth has joined: none, or longer than any test
    // runs (then it waits until half the group has joined).
    const bool patient = GENERATE(false, true);
    arrivals a(patient ? std::chrono::steady_clock::duration(std::chrono::hours(1))
                       : std::chrono::steady_clock::duration::zero());
    const std::size_t n = arrivals::n;
    // The first group has no last batch to wait for: copied from its first record.
    std::vector<sluice::record> g1;
    a.fill(g1, n);
    REQUIRE(a.copied == n);
    auto b1 = a.early.take();
    REQUIRE(b1 != nullptr);
    const std::byte* first = b1->data();
    SECTION("the last batch's buffer comes back while the group's first eighth arrives: it is reused") {
        std::vector<sluice::record> g2;
        a.fill(g2, 3);
        REQUIRE(a.copied == n);  // waiting: the last batch is still held
        b1.reset();
        g1.clear();  // its consumer lets it go
        a.fill(g2, n);
        REQUIRE(a.copied == 2 * n);  // the three that waited, then the rest
        auto b2 = a.early.take();
        REQUIRE(b2 != nullptr);
        REQUIRE(b2->data() == first);
        a.check(g2);
    }
    SECTION("the last batch is held longer: after the first eighth and the wait, or half the group, fresh memory") {
        std::vector<sluice::record> g2;
        a.fill(g2, n / 8 - 1);
        REQUIRE(a.copied == n);
        a.fill(g2, n / 8);
        if (!patient) {
            REQUIRE(a.copied == n + n / 8);
        } else {
            REQUIRE(a.copied == n);  // the wait has not passed
            a.fill(g2, n / 2 - 1);
            REQUIRE(a.copied == n);
            a.fill(g2, n / 2);
            REQUIRE(a.copied == n + n / 2);
        }
        a.fill(g2, n);
        auto b2 = a.early.take();
        REQUIRE(b2 != nullptr);
        REQUIRE(b2->data() != first);
        a.check(g2);
    }
}

TEST_CASE("a group copied on arrival times its wait from its own first record", "[batch]") {
    const auto wait = std::chrono::milliseconds(500);
    arrivals a(wait);
    const std::size_t n = arrivals::n;
    std::vector<sluice::record> g1;
    a.fill(g1, n);
    auto b1 = a.early.take();  // held by its consumer throughout
    REQUIRE(b1 != nullptr);
    // Longer than the wait passes after the collator was made and after the last group
    // ended: neither starts this group's clock, its first record does.
    std::this_thread::sleep_for(wait + std::chrono::milliseconds(100));
    std::vector<sluice::record> g2;
    a.fill(g2, n / 8);
    REQUIRE(a.copied == n);  // an eighth, but the wait has not passed since its first record
    std::this_thread::sleep_for(wait + std::chrono::milliseconds(100));
    a.fill(g2, n / 8 + 1);
    REQUIRE(a.copied == n + n / 8 + 1);  // now it has: fresh memory, the waiting records copied
    a.fill(g2, n);
    auto b2 = a.early.take();
    REQUIRE(b2 != nullptr);
    REQUIRE(b2->data() != b1->data());
    a.check(g2);
}

TEST_CASE("a group copied on arrival takes no memory for records that share their bytes: the pool's buffer stays for "
          "collation",
          "[batch]") {
    auto pool = sluice::buffer_pool::create(std::size_t{256} << 20);
    std::atomic<std::uint64_t> copied{0};
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"shard-000.tar", 0, 0});
    const std::size_t n = 64, size = 100'000;
    sluice::detail::early_collation early(pool, &copied);
    SECTION("a group whose first record is a slice of a shard takes none") {
        // The last batch's buffer, back in the pool (faulted in: the batch stage's to reuse).
        pool->allocate(n * size).reset();
        const std::size_t kept = pool->cached_bytes();
        REQUIRE(kept >= n * size);
        // Records as a parsed shard gives them: slices of one chunk.
        auto chunk = sluice::bytes::copy_of(std::string(n * size, 't'));
        std::vector<sluice::record> group;
        for (std::size_t i = 0; i < n; ++i) {
            group.push_back(sluice::record{chunk.slice(i * size, size), s, i, i * size});
            early.add(group, n);
            // Held from the pool until the group was full, that buffer made the batch stage
            // fault in another for the collation (three batch buffers where two serve).
            REQUIRE(pool->cached_bytes() == kept);
        }
        REQUIRE(copied == 0);
        REQUIRE(early.take() == nullptr);
        const auto b = sluice::detail::collate_records(group, *pool);
        REQUIRE(b.data.size() == n * size);
        REQUIRE(pool->cached_bytes() == 0);  // collation took the kept buffer
    }
    SECTION("a group that meets a shared record before copying any bytes gives its buffer back") {
        // A whole group of objects in buffers of their own: copied on arrival, and the next
        // group is sized from it.
        std::vector<sluice::record> g1;
        for (std::size_t i = 0; i < n; ++i) {
            g1.push_back(sluice::record{sluice::bytes::copy_of(std::string(size, 'o')), s, i, 0});
            early.add(g1, n);
        }
        REQUIRE(copied == n);
        auto b1 = early.take();
        REQUIRE(b1 != nullptr);
        b1.reset();
        g1.clear();
        const std::size_t kept = pool->cached_bytes();
        REQUIRE(kept >= n * size);
        // The next group opens with an empty record (its own: it takes the kept buffer),
        // then a slice of a shared chunk: nothing was copied, so the buffer goes back at once.
        auto chunk = sluice::bytes::copy_of(std::string(2 * size, 't'));
        std::vector<sluice::record> g2;
        g2.push_back(sluice::record{sluice::bytes{}, s, 0, 0});
        early.add(g2, n);
        REQUIRE(pool->cached_bytes() == 0);
        g2.push_back(sluice::record{chunk.slice(0, size), s, 1, 0});
        early.add(g2, n);
        REQUIRE(pool->cached_bytes() == kept);
        g2.push_back(sluice::record{chunk.slice(size, size), s, 2, size});
        early.add(g2, n);
        REQUIRE(pool->cached_bytes() == kept);
        REQUIRE(early.take() == nullptr);
        REQUIRE(copied == n);
    }
}

TEST_CASE("a record that is most of a chunk another still holds is copied on arrival, as one of its own is", "[batch]") {
    // A one-file shard parsed: its record is the file's bytes, a slice of the shard's chunk,
    // which the parser holds until the shard's empty last chunk comes. Copying it on arrival
    // lets the chunk go once the parser does; leaving the group to collation would hold
    // every chunk of the group until the batch is full.
    auto pool = sluice::buffer_pool::create(std::size_t{256} << 20);
    std::atomic<std::uint64_t> copied{0};
    sluice::detail::early_collation early(pool, &copied);
    const std::size_t n = 16, size = 100'000, header = 512, trailer = 1536;
    std::vector<sluice::bytes> held;  // what the parser still holds
    std::vector<sluice::record> group;
    std::string want;
    for (std::size_t i = 0; i < n; ++i) {
        auto s = std::make_shared<const sluice::shard>(sluice::shard{"shard-" + std::to_string(i) + ".tar", 0, 0});
        const std::string body(size, char('a' + i));
        auto chunk = sluice::bytes::copy_of(std::string(header, 'h') + body + std::string(trailer, '\0'));
        held.push_back(chunk);
        group.push_back(sluice::record{chunk.slice(header, size), s, 0, header});
        REQUIRE(group.back().data.owner_use_count() == 3);  // the record, `held` and `chunk`
        early.add(group, n);
        REQUIRE(held.back().owner_use_count() == 2);  // copied: the record no longer holds the chunk
        want += body;
    }
    REQUIRE(copied == n);
    const auto b = early.take();
    REQUIRE(b != nullptr);
    REQUIRE(std::string(reinterpret_cast<const char*>(b->data()), n * size) == want);
    SECTION("a small file after a large one of the same chunk is copied too: the group's buffer is taken") {
        // One-sample shards of a large file and a small one (an image and its label): the
        // large one starts the copy, the small one shares its chunk with it.
        sluice::detail::early_collation other(pool, &copied);
        std::vector<sluice::record> g;
        std::string want2;
        for (std::size_t i = 0; i < n / 2; ++i) {
            auto s = std::make_shared<const sluice::shard>(sluice::shard{"sample-" + std::to_string(i) + ".tar", 0, 0});
            const std::string image(size, char('A' + i)), label = std::to_string(i);
            auto chunk = sluice::bytes::copy_of(std::string(header, 'h') + image + std::string(header, 'h') + label);
            g.push_back(sluice::record{chunk.slice(header, size), s, 0, header});
            other.add(g, n);
            g.push_back(sluice::record{chunk.slice(2 * header + size, label.size()), s, 1, 2 * header + size});
            REQUIRE(g.back().data.owner_use_count() == 2);  // the label and `chunk`: the image was copied
            other.add(g, n);
            REQUIRE(g.back().data.owner() != chunk.owner());
            want2 += image + label;
        }
        REQUIRE(copied == 2 * n);
        const auto b2 = other.take();
        REQUIRE(b2 != nullptr);
        REQUIRE(std::string(reinterpret_cast<const char*>(b2->data()), want2.size()) == want2);
    }
    SECTION("a slice of half of its chunk or less is not: the chunk's other records pin it") {
        sluice::detail::early_collation other(pool, &copied);
        auto two = sluice::bytes::copy_of(std::string(2 * size, 't'));
        std::vector<sluice::record> g{sluice::record{two.slice(0, size), group.front().source, 0, 0}};
        other.add(g, n);
        REQUIRE(other.take() == nullptr);
        REQUIRE(copied == n);
    }
}

TEST_CASE("a record copied on arrival is checked against its TFRecord checksum, a bad one reported with shard and offset",
          "[batch]") {
    std::shared_ptr<sluice::buffer_source> pool = sluice::buffer_pool::create(std::size_t{64} << 20);
    std::atomic<std::uint64_t> copied{0};
    auto s = std::make_shared<const sluice::shard>(sluice::shard{"data/train-00007.tfrecord", 0, 0});
    auto tfrecord = [&](const std::string& text, std::uint64_t index, bool good) {
        sluice::record r{sluice::bytes::copy_of(text), s, index, 1000 + index * 100};
        const std::uint32_t sum = sluice::crc32c_mask(sluice::crc32c(text.data(), text.size()));
        r.unchecked_crc32c = good ? sum : sum ^ 1u;
        return r;
    };
    const std::size_t n = 4;
    SECTION("good records: checked as copied, the batch is the buffer they were copied into") {
        sluice::detail::early_collation early(pool, &copied);
        std::vector<sluice::record> group;
        std::string want;
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::string text(std::size_t(i == 0 ? 1 : 30000), char('k' + i));  // grows after the first
            want += text;
            group.push_back(tfrecord(text, i, true));
            early.add(group, n);
        }
        REQUIRE(copied == n);
        for (auto& r : group) REQUIRE(!r.unchecked_crc32c);
        auto collated = early.take();
        REQUIRE(collated != nullptr);
        const std::byte* at = collated->data();
        const auto b = sluice::detail::collate_records(group, *pool, nullptr, nullptr, collated);
        REQUIRE(b.data.view() == want);
        REQUIRE(b.data.data() == at);  // not copied again
        REQUIRE(b.offsets == std::vector<std::uint64_t>{0, 1, 30001, 60001, 90001});
        REQUIRE(b.key(3) == "data/train-00007.tfrecord#3");
    }
    SECTION("records of MiBs (a batch streamed): checked as copied, a bad one stops the copies") {
        sluice::detail::early_collation early(pool, &copied);
        std::vector<sluice::record> group;
        for (std::uint64_t i = 0; i < 3; ++i) {
            group.push_back(tfrecord(std::string((i == 0 ? 3u : 2u) << 20, char('p' + i)), i, i != 2));
            early.add(group, n);
        }
        REQUIRE(copied == 2);  // the third, bad, is left, and the group with it
        REQUIRE(group[0].data.view() == std::string(3u << 20, 'p'));
        REQUIRE(group[1].data.view() == std::string(2u << 20, 'q'));
        REQUIRE(early.take() == nullptr);
        REQUIRE_THROWS_WITH(sluice::detail::collate_records(group, *pool),
                            Catch::Contains("bad TFRecord data checksum (record 2)") && Catch::Contains("data/train-00007.tfrecord"));
    }
    SECTION("a bad record stops the copies on arrival; collation reports it") {
        sluice::detail::early_collation early(pool, &copied);
        std::vector<sluice::record> group;
        for (std::uint64_t i = 0; i < n; ++i) {
            group.push_back(tfrecord("record " + std::to_string(i), i, i != 1));
            early.add(group, n);
        }
        REQUIRE(copied == 1);  // the first; the bad second and the rest are left
        REQUIRE(early.take() == nullptr);
        REQUIRE_THROWS_WITH(sluice::detail::collate_records(group, *pool),
                            Catch::Contains("bad TFRecord data checksum (record 1)") && Catch::Contains("data/train-00007.tfrecord") &&
                                Catch::Contains("1100"));
    }
    SECTION("an empty record's checksum is checked too") {
        sluice::detail::early_collation early(pool, &copied);
        std::vector<sluice::record> group;
        group.push_back(tfrecord("record 0", 0, true));
        early.add(group, n);
        group.push_back(tfrecord("", 1, false));
        early.add(group, n);
        REQUIRE(copied == 1);
        REQUIRE(early.take() == nullptr);
        REQUIRE_THROWS_WITH(sluice::detail::collate_records(group, *pool),
                            Catch::Contains("bad TFRecord data checksum (record 1)"));
    }
    SECTION("a group's buffer is sized from the last group: the next one does not grow") {
        // No wait for the last batch's buffer (a group of 4 would wait for its second
        // record): each record is copied as it joins, where the test notes it.
        sluice::detail::early_collation early(pool, &copied, std::chrono::steady_clock::duration::zero());
        for (int round = 0; round < 2; ++round) {
            std::vector<sluice::record> group;
            const std::byte* first = nullptr;
            for (std::uint64_t i = 0; i < n; ++i) {
                group.push_back(tfrecord(std::string(std::size_t(i == 0 ? 1 : 200000), 'g'), i, true));
                early.add(group, n);
                if (i == 0) first = group[0].data.data();
            }
            // The first group, sized from its 1-byte first record, grew and moved; the
            // second, sized from the first's bytes, did not.
            if (round == 0) REQUIRE(group[0].data.data() != first);
            else REQUIRE(group[0].data.data() == first);
            REQUIRE(early.take() != nullptr);
        }
        REQUIRE(copied == 2 * n);
    }
    SECTION("no memory offered (the collator allocates elsewhere): nothing is copied") {
        sluice::detail::early_collation early;
        std::vector<sluice::record> group{tfrecord("x", 0, true)};
        early.add(group, n);
        REQUIRE(copied == 0);
        REQUIRE(group[0].unchecked_crc32c);
        REQUIRE(early.take() == nullptr);
    }
}
