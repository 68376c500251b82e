#pragma once
// The HTTP engine: a few threads ("lanes"), each driving one libcurl multi handle, shared
// by every fetch stage in the process. A transfer is given to the lane with the fewest at
// the time and stays there.
//
// Why more than one: a lane's thread does every recv of its transfers and copies each
// byte once into pooled buffers, so one lane is one core's worth of receiving (1.6 GB/s of
// 100 KB objects on the bench VM, where curl's own single thread is the same). With the
// rest of a pipeline (collation, decode) on the other cores, that one thread set the pace
// of whole-object fetches (bench/RESULTS.md, issue 17: 2,000 objects of 50-150 KB, median
// 0.209 -> 0.159 s, huge pages and two lanes on two cores; curl 0.156 s). Lanes: the CPUs
// the process may run on, at most 4, or SLUICE_HTTP_THREADS (1-16) when set; read each
// time the engine starts.
//
// Why a thread of its own rather than curl's socket callbacks on the Asio loop: driving
// curl multi from Asio correctly needs each fd assigned once, one-shot waits re-armed only
// while curl wants them, release-not-close on removal, tolerance of remove-then-re-add and
// never re-entering curl from its callbacks (PLATFORM.md; curl's own Asio example was
// withdrawn for these bugs). A thread on curl_multi_poll + curl_multi_wakeup has none of
// those traps and costs at most one wake-up of the I/O loop per round of
// curl_multi_perform (the readers it made ready are posted together), which is noise next
// to the copy of the chunks themselves.
//
// Transfers talk to their coroutine through a small mailbox: the write callback fills
// pooled buffers of chunk_size bytes and posts each full one; when two are waiting
// undelivered it pauses the transfer (CURL_WRITEFUNC_PAUSE) instead of buffering more,
// and the coroutine unpauses it after handing a chunk downstream. So a slow consumer
// holds a download at about two chunks, whatever the object's size.

#include <sluice/core/bytes.hpp>
#include <sluice/core/detail/cpus.hpp>
#include <sluice/core/task.hpp>
#include <sluice/io/detail/curl_global.hpp>
#include <sluice/io/detail/s3_sign.hpp>

#include <curl/curl.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cctype>
#include <coroutine>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace sluice::detail {

/// What one HTTP request asks for.
struct http_request {
    std::string url;
    std::uint64_t from = 0;  // Range: bytes=from-to when either is set
    std::uint64_t to = npos;  // inclusive; npos: to the end
    static constexpr std::uint64_t npos = ~std::uint64_t{0};
    std::string if_match;    // If-Match when non-empty (a resumed download of one version)
    std::size_t chunk_size = 1u << 20;
    long connect_timeout_ms = 10000;
    long stall_seconds = 30;  // no byte for this long: the transfer fails (and is retried)
    long max_redirects = 5;
    bool verify_tls = true;
    std::string ca_file;
    s3_auth auth;  // SigV4 for S3 (sign = false: none)
    std::shared_ptr<buffer_source> mem;  // shared: a transfer may outlive its pipeline's runtime
};

/// One transfer, shared by its lane's thread and the coroutine reading it.
struct http_transfer {
    explicit http_transfer(http_request r) : req(std::move(r)) {}
    http_request req;

    // The mailbox (under m).
    std::mutex m;
    std::deque<bytes> ready;
    bool done = false;
    bool paused = false;
    // The reader took every byte the response said it has and went on (fetch does not wait
    // for the transfer's end): anything more is the server's error, and ends the transfer.
    bool detached = false;
    std::coroutine_handle<> waiter;
    executor waiter_ex;

    // Filled by its lane's thread; read by the coroutine after `done`.
    CURLcode result = CURLE_OK;
    long status = 0;
    std::string etag;
    std::uint64_t total = http_request::npos;        // the object's size, from Content-Range
    std::uint64_t range_start = http_request::npos;  // where the answered range starts
    std::string error_body;  // the start of an error reply's body (S3's XML code...)
    char errbuf[CURL_ERROR_SIZE] = {};
    // The lane that runs it: written by add before the transfer is posted to that lane,
    // read by whoever resumes or cancels it later (after add returned).
    unsigned lane = 0;

    // Its lane's thread only.
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::shared_ptr<buffer> buf;
    std::size_t fill = 0;
    std::size_t want = 0;           // buf's bytes to fill before it is delivered
    std::uint64_t received = 0;     // body bytes of this response put in buffers
    std::uint64_t discard = 0;  // bytes of a 200 answer to a Range request to drop
    bool ranged_ignored = false;  // a 200 to a Range request: the whole object follows
    bool status_known = false;

    // Wakes the coroutine, if it waits. Call with m held; returns what to resume.
    std::coroutine_handle<> take_waiter() {
        auto h = waiter;
        waiter = nullptr;
        return h;
    }
};

class curl_engine {
public:
    /// The process's engine, started on first use and stopped when the last user lets go.
    static std::shared_ptr<curl_engine> shared() {
        static std::mutex m;
        static std::weak_ptr<curl_engine> current;
        std::lock_guard lock(m);
        auto e = current.lock();
        if (!e) {
            e = std::shared_ptr<curl_engine>(new curl_engine());
            current = e;
        }
        return e;
    }

    curl_engine(const curl_engine&) = delete;
    curl_engine& operator=(const curl_engine&) = delete;

    /// How many lanes (threads) this engine runs.
    std::size_t lanes() const noexcept { return lanes_.size(); }
    /// Transfers given to each lane so far (for tests and diagnostics).
    std::vector<std::uint64_t> started() const {
        std::vector<std::uint64_t> n;
        for (auto& l : lanes_) n.push_back(l->started.load(std::memory_order_relaxed));
        return n;
    }
    /// The lanes an engine starts with: SLUICE_HTTP_THREADS when it is 1-16, else the
    /// CPUs the process may run on (detail::usable_cpus), at most 4.
    static std::size_t default_lanes() {
        if (const char* v = std::getenv("SLUICE_HTTP_THREADS")) {
            char* end = nullptr;
            const long n = std::strtol(v, &end, 10);
            if (end != v && *end == 0 && n >= 1 && n <= 16) return static_cast<std::size_t>(n);
        }
        return std::clamp<std::size_t>(usable_cpus(), 1, 4);
    }

    /// Starts a transfer on the lane with the fewest transfers (ties in turn).
    void add(std::shared_ptr<http_transfer> t) {
        const std::size_t n = lanes_.size();
        std::size_t best = next_.fetch_add(1, std::memory_order_relaxed) % n;
        for (std::size_t k = 1, i = (best + 1) % n; k < n; ++k, i = (i + 1) % n)
            if (lanes_[i]->load.load(std::memory_order_relaxed) < lanes_[best]->load.load(std::memory_order_relaxed))
                best = i;
        t->lane = static_cast<unsigned>(best);
        lanes_[best]->load.fetch_add(1, std::memory_order_relaxed);
        lanes_[best]->started.fetch_add(1, std::memory_order_relaxed);
        lanes_[best]->command(kind::add, std::move(t));
    }
    /// After the coroutine took a chunk: unpause the transfer if it was paused. A transfer
    /// that is not paused costs nothing here (no command, no wake-up of the engine's
    /// thread): a small object's one chunk never pauses it. It cannot pause unseen between
    /// the look and the coroutine's next take, which comes back here.
    void resume(std::shared_ptr<http_transfer> t) {
        {
            std::lock_guard lock(t->m);
            if (!t->paused || t->done) return;
        }
        lane_of(*t).command(kind::resume, std::move(t));
    }
    /// The reader has all it asked for and will not read again: the transfer ends on its
    /// own (its connection kept), and waking its reader is skipped.
    static void detach(http_transfer& t) {
        std::lock_guard lock(t.m);
        t.detached = true;
        t.ready.clear();
        t.waiter = nullptr;
    }
    /// Returns once no post by a lane's thread is under way: a fetch worker ends with
    /// it (quiesce_on_exit), so its I/O loop is not destroyed under one.
    static void quiesce() { std::lock_guard lock(post_mutex()); }
    struct quiesce_on_exit {
        quiesce_on_exit() = default;
        quiesce_on_exit(const quiesce_on_exit&) = delete;
        quiesce_on_exit& operator=(const quiesce_on_exit&) = delete;
        ~quiesce_on_exit() { quiesce(); }
    };
    /// Abandons a transfer (the pipeline stopped): it ends with CURLE_ABORTED_BY_CALLBACK
    /// and its reader wakes.
    void cancel(std::shared_ptr<http_transfer> t) { lane_of(*t).command(kind::cancel, std::move(t)); }

private:
    enum class kind { add, resume, cancel };
    struct cmd {
        kind k;
        std::shared_ptr<http_transfer> t;
    };

    // One thread and its multi handle, with the transfers given to it.
    class lane {
    public:
        lane() {
            multi_ = curl_multi_init();
            curl_multi_setopt(multi_, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
            curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
            thread_ = std::thread([this] { loop(); });
            // Its own name in top -H and perf, apart from the I/O loop ("sluice-io") that a
            // thread made from it would otherwise be named after.
            ::pthread_setname_np(thread_.native_handle(), "sluice-curl");
        }
        ~lane() {
            stop_.store(true);
            curl_multi_wakeup(multi_);
            thread_.join();
            for (auto& [easy, t] : live_) {
                curl_multi_remove_handle(multi_, easy);
                release(*t);
            }
            curl_multi_cleanup(multi_);
        }
        lane(const lane&) = delete;
        lane& operator=(const lane&) = delete;

        void command(kind k, std::shared_ptr<http_transfer> t) {
            {
                std::lock_guard lock(m_);
                cmds_.push_back(cmd{k, std::move(t)});
            }
            curl_multi_wakeup(multi_);
        }

        std::atomic<std::size_t> load{0};  // transfers added and not yet finished (for add's choice)
        std::atomic<std::uint64_t> started{0};

    private:
        void loop() {
            std::vector<cmd> cmds;
            while (!stop_.load()) {
                {
                    std::lock_guard lock(m_);
                    cmds.assign(std::make_move_iterator(cmds_.begin()), std::make_move_iterator(cmds_.end()));
                    cmds_.clear();
                }
                for (auto& c : cmds) apply(c);
                cmds.clear();
                int running = 0;
                curl_multi_perform(multi_, &running);
                int left = 0;
                while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
                    if (msg->msg != CURLMSG_DONE) continue;
                    auto it = live_.find(msg->easy_handle);
                    if (it == live_.end()) continue;
                    const CURLcode result = msg->data.result;  // msg is invalid once the handle is removed
                    auto t = it->second;
                    live_.erase(it);
                    curl_multi_remove_handle(multi_, t->easy);
                    done(*t, result);
                }
                post_wakes();
                curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
            }
        }

        void done(http_transfer& t, CURLcode result) {
            load.fetch_sub(1, std::memory_order_relaxed);
            finish(t, result);
        }

        void apply(cmd& c) {
            http_transfer& t = *c.t;
            switch (c.k) {
            case kind::add:
                if (!setup(t)) {
                    load.fetch_sub(1, std::memory_order_relaxed);  // setup finished it
                    return;
                }
                if (curl_multi_add_handle(multi_, t.easy) != CURLM_OK) {
                    done(t, CURLE_FAILED_INIT);
                    return;
                }
                live_.emplace(t.easy, c.t);
                break;
            case kind::resume: {
                bool unpause = false;
                {
                    std::lock_guard lock(t.m);
                    unpause = t.paused && !t.done;
                    if (unpause) t.paused = false;
                }
                if (unpause && t.easy) curl_easy_pause(t.easy, CURLPAUSE_CONT);  // may write at once
                break;
            }
            case kind::cancel:
                // Ends the transfer now and wakes its reader, which may be waiting for a
                // chunk that a stalled server would never send.
                if (t.easy && live_.erase(t.easy)) {
                    curl_multi_remove_handle(multi_, t.easy);
                    done(t, CURLE_ABORTED_BY_CALLBACK);
                }
                break;
            }
        }

        CURLM* multi_ = nullptr;
        std::thread thread_;
        std::atomic<bool> stop_{false};
        std::mutex m_;
        std::vector<cmd> cmds_;
        std::unordered_map<CURL*, std::shared_ptr<http_transfer>> live_;
    };

    curl_engine() {
        curl_global();
        const std::size_t n = default_lanes();
        for (std::size_t i = 0; i < n; ++i) lanes_.push_back(std::make_unique<lane>());
    }
    lane& lane_of(const http_transfer& t) {
        assert(t.lane < lanes_.size());
        return *lanes_[t.lane < lanes_.size() ? t.lane : 0];
    }

    static bool setup(http_transfer& t) {
        t.easy = curl_easy();
        if (!t.easy) {
            finish(t, CURLE_OUT_OF_MEMORY);
            return false;
        }
        CURL* e = t.easy;
        curl_easy_setopt(e, CURLOPT_URL, t.req.url.c_str());
        curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &on_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t.errbuf);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, t.req.max_redirects);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, t.req.connect_timeout_ms);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, t.req.stall_seconds);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS);  // h2 over TLS where offered
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, curl_receive_buffer);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, t.req.verify_tls ? 1L : 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, t.req.verify_tls ? 2L : 0L);
        if (!t.req.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, t.req.ca_file.c_str());
        if (t.req.from || t.req.to != http_request::npos) {
            std::string range = std::to_string(t.req.from) + "-";
            if (t.req.to != http_request::npos) range += std::to_string(t.req.to);
            curl_easy_setopt(e, CURLOPT_RANGE, range.c_str());  // copied by curl
        }
        if (!t.req.if_match.empty()) t.headers = curl_slist_append(t.headers, ("If-Match: " + t.req.if_match).c_str());
        std::string sigv4;
        s3_sign(e, t.headers, t.req.auth, sigv4);
        if (t.headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
        return true;
    }

    static void release(http_transfer& t) {
        if (t.easy) curl_easy_cleanup(t.easy);
        t.easy = nullptr;
        if (t.headers) curl_slist_free_all(t.headers);
        t.headers = nullptr;
    }

    static void deliver(http_transfer& t, bytes b) {
        std::coroutine_handle<> h;
        executor ex;
        {
            std::lock_guard lock(t.m);
            if (t.detached) return;
            t.ready.push_back(std::move(b));
            h = t.take_waiter();
            ex = t.waiter_ex;
        }
        if (h) wake(std::move(ex), h);
    }

    static void finish(http_transfer& t, CURLcode result) {
        if (t.easy && !t.status_known) curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &t.status);
        if (t.buf && t.fill) {
            stream_fence();
            deliver(t, bytes(std::move(t.buf), t.fill));
        }
        t.buf.reset();
        t.fill = 0;
        release(t);
        std::coroutine_handle<> h;
        executor ex;
        {
            std::lock_guard lock(t.m);
            t.result = result;
            t.done = true;
            h = t.take_waiter();
            ex = t.waiter_ex;
        }
        if (h) wake(std::move(ex), h);
    }

    // Readers to resume, gathered over one round of the engine's loop (curl_multi_perform
    // may complete dozens of small objects at once) and posted together at its end: one
    // post, so one wake-up of the I/O loop, per round and executor rather than per chunk.
    // Every reader of a transfer runs on fetch's single-threaded I/O executor (aimd.hpp),
    // so resuming them one after another in one handler is what separate posts would do.
    struct pending_wake {
        executor ex;
        std::coroutine_handle<> h;
    };
    static std::vector<pending_wake>& wakes() {
        thread_local std::vector<pending_wake> w;
        return w;
    }
    static void wake(executor ex, std::coroutine_handle<> h) { wakes().push_back({std::move(ex), h}); }
    // Held while a lane's thread posts: asio's post signals the loop's condition
    // variable after it unlocks, so the posted resumption can run, end its pipeline and
    // destroy the loop before the signal returns. Each fetch worker waits here as it ends
    // (quiesce()), so no post into its loop is still under way when its runtime goes.
    static std::mutex& post_mutex() {
        static std::mutex m;
        return m;
    }
    static void post_wakes() {
        auto& w = wakes();
        if (w.empty()) return;
        std::lock_guard lock(post_mutex());
        while (!w.empty()) {
            // Those sharing the first one's executor, in the order they came; the rest kept.
            std::vector<std::coroutine_handle<>> hs;
            executor ex = w.front().ex;
            std::size_t kept = 0;
            for (auto& p : w) {
                if (p.ex == ex) hs.push_back(p.h);
                else if (&w[kept] == &p) ++kept;
                else w[kept++] = std::move(p);
            }
            w.resize(kept);
            if (hs.size() == 1) resume_on(ex, hs.front());
            else asio::post(ex, [hs = std::move(hs)] { for (auto h : hs) h.resume(); });
        }
    }

    static bool header_is(std::string_view line, std::string_view name) {  // name in lower case, with ':'
        if (line.size() < name.size()) return false;
        for (std::size_t i = 0; i < name.size(); ++i)
            if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
        return true;
    }

    static std::size_t on_header(char* p, std::size_t size, std::size_t n, void* ud) {
        auto& t = *static_cast<http_transfer*>(ud);
        const std::size_t len = size * n;
        std::string_view line(p, len);
        if (line.starts_with("HTTP/")) {  // a new response (after a redirect or 100): forget the last
            t.etag.clear();
            t.received = 0;
            t.total = http_request::npos;
            t.range_start = http_request::npos;
            t.status_known = false;
        } else if (header_is(line, "content-range:")) {
            // bytes a-b/total, bytes a-b/* (total unknown), or bytes */total
            auto number = [&](std::size_t i, std::uint64_t& n) {
                bool digits = false;
                for (n = 0; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i, digits = true)
                    n = n * 10 + static_cast<std::uint64_t>(line[i] - '0');
                return digits;
            };
            const auto slash = line.rfind('/');
            std::uint64_t n = 0;
            if (slash != std::string_view::npos && number(slash + 1, n)) t.total = n;
            const auto bytes_at = line.find("bytes ");
            if (bytes_at != std::string_view::npos && number(bytes_at + 6, n)) t.range_start = n;
        } else if (line.size() > 5 && (line[0] == 'E' || line[0] == 'e') && std::tolower(line[1]) == 't' &&
                   std::tolower(line[2]) == 'a' && std::tolower(line[3]) == 'g' && line[4] == ':') {
            auto v = line.substr(5);
            while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
            while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
            t.etag = std::string(v);
        }
        return len;
    }

    static std::size_t on_write(char* p, std::size_t size, std::size_t n, void* ud) {
        auto& t = *static_cast<http_transfer*>(ud);
        std::size_t len = size * n;
        if (!t.status_known) {
            curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &t.status);
            t.status_known = true;
            if (t.req.from && t.status == 200) t.discard = t.req.from;  // the server ignored Range
            if (t.status == 200) t.ranged_ignored = t.req.from || t.req.to != http_request::npos;
        }
        if (t.status >= 300) {  // an error reply: keep the start of its body for the message
            if (t.error_body.size() < 16384) t.error_body.append(p, std::min(len, 16384 - t.error_body.size()));
            return len;
        }
        {
            std::lock_guard lock(t.m);
            if (t.detached) return 0;  // more than the response said it has: ends it (CURLE_WRITE_ERROR)
            if (t.ready.size() >= 2) {  // the consumer is behind: hold the transfer
                t.paused = true;
                return CURL_WRITEFUNC_PAUSE;
            }
        }
        const std::size_t total = len;
        if (t.discard) {
            const auto d = static_cast<std::size_t>(std::min<std::uint64_t>(t.discard, len));
            p += d;
            len -= d;
            t.discard -= d;
        }
        while (len) {
            if (!t.buf) {
                // No bigger than what the response has left to send, when it says (a
                // 100 KiB object is one 100 KiB chunk, not a slice of 1 MiB that raw or a
                // shuffle would copy out of).
                t.want = t.req.chunk_size;
                curl_off_t length = -1;
                if (curl_easy_getinfo(t.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK && length > 0 &&
                    static_cast<std::uint64_t>(length) > t.received)
                    t.want = static_cast<std::size_t>(
                        std::min<std::uint64_t>(t.want, static_cast<std::uint64_t>(length) - t.received));
                t.buf = t.req.mem ? t.req.mem->allocate(t.want) : std::make_shared<buffer>(t.want);
                t.fill = 0;
            }
            const std::size_t k = std::min(len, t.want - t.fill);
            stream_copy(t.buf->data() + t.fill, reinterpret_cast<const std::byte*>(p), k);
            t.fill += k;
            t.received += k;
            p += k;
            len -= k;
            if (t.fill == t.want) {
                stream_fence();  // the streamed bytes are seen by the thread that takes the chunk
                deliver(t, bytes(std::move(t.buf), t.fill));
                t.buf.reset();
                t.fill = 0;
            }
        }
        return total;
    }

    std::vector<std::unique_ptr<lane>> lanes_;  // destroyed (each joined) with the engine
    std::atomic<std::size_t> next_{0};
};

/// `co_await next_http_event{t}`: the next chunk of the transfer, or nothing when it is
/// done (then t.result / t.status say how it ended).
struct next_http_event {
    http_transfer& t;
    std::optional<bytes> got;
    bool await_ready() {
        std::lock_guard lock(t.m);
        return take();
    }
    template <class P>
    bool await_suspend(std::coroutine_handle<P> h) {
        std::lock_guard lock(t.m);
        if (take()) return false;
        t.waiter = h;
        t.waiter_ex = h.promise().ex;
        return true;
    }
    std::optional<bytes> await_resume() {
        if (!got) {
            std::lock_guard lock(t.m);
            take();
        }
        return std::move(got);
    }

private:
    bool take() {  // m held
        if (!t.ready.empty()) {
            got = std::move(t.ready.front());
            t.ready.pop_front();
            return true;
        }
        return t.done;
    }
};

}  // namespace sluice::detail
