#pragma once
// The HTTP engine: a few threads ("lanes"), each driving one libcurl multi handle, shared
// by every fetch stage in the process. A transfer is given to the lane with the fewest at
// the time and stays there.
//
// Why more than one: a lane's thread does every recv of its transfers and copies each
// byte once into pooled buffers, so one lane is at most one core's worth of receiving.
// Where the receiving, with TLS or beside the rest of a pipeline (collation, decode),
// needs more than a core, one thread sets the pace. Lanes: half the CPUs the process may
// run on (rounded down), at least 1 and at most 4, or SLUICE_HTTP_THREADS (1-16) when
// set; read each time the engine starts. Until the twenty-sixth session of issue 17 it
// was one per CPU: on 2 CPUs a second lane then moved the wall clock of 2,000 small
// objects from 0.81 to 0.98 x curl's. Now one lane costs less CPU on every row measured
// and is faster over 20,000 objects and one 1 GiB object, but 7-12 % slower in wall time
// over 2,000 objects in one pass (bench/RESULTS.md).
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
// undelivered (or the request's `hold`: a part of a large object that waits its turn may
// be given room for more) it pauses the transfer (CURL_WRITEFUNC_PAUSE) instead of
// buffering more, and the coroutine unpauses it after handing a chunk downstream. So a
// slow consumer holds a download at about two chunks (its `hold`), whatever the object's
// size.
//
// Receiving a large body directly. libcurl hands a body to the write callback in pieces of
// 16 KiB out of its own receive buffer, and on_write copies each into the chunk: for one
// large object that copy, and the per-piece work around it, made the fetch spend 1.75-2 x
// curl's CPU per GB (bench/RESULTS.md, issue 17), while a recv straight into the chunks
// costs what curl costs. So when a response is plain HTTP/1.1 with a Content-Length, sent
// as is (no Transfer-Encoding), and at least SLUICE_HTTP_DIRECT bytes (4 MiB) of it are
// still to come at its first body bytes, the lane takes it over: on_write pauses the
// transfer in libcurl (which then neither reads the socket nor times it), the lane finds the
// connection's socket among those libcurl opened on this lane (by both ends' addresses),
// and recv()s the rest of the body into the chunks itself, with the same mailbox, pause
// on a slow reader, stall limit and error codes and messages as libcurl's. When the body
// is in (or cut short) the transfer is removed from libcurl, which closes that connection
// since it never saw the body's end: a large body costs one new connection, nothing next
// to its megabytes. libcurl still does everything else: connecting, proxies, redirects,
// SigV4, status and headers, error bodies, HTTPS (whose bytes on the socket are not the
// body, so it is never received directly) and HTTP/2. Only with libcurl 7.88-7.x, the one
// this was checked against; SLUICE_HTTP_DIRECT=0 turns it off.

#include <sluice/core/bytes.hpp>
#include <sluice/core/detail/cpus.hpp>
#include <sluice/core/task.hpp>
#include <sluice/io/detail/curl_global.hpp>
#include <sluice/io/detail/s3_sign.hpp>

#include <curl/curl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <cstdint>
#include <cstdio>
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
    // Chunks the transfer may hold undelivered before it is paused: two, or more for a part
    // of a large object that waits its turn (fetch gives it room to download in parallel).
    std::size_t hold = 2;
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
    bool chunked = false;  // the response has a Transfer-Encoding (its body is not bytes as sent)
    // Direct receive (see "Receiving a large body directly" below).
    std::uint64_t direct_min = 0;  // receive directly when at least this much is left (0: never)
    bool direct_wanted = false;    // on_write found the response fit; the lane takes it over
    bool in_unpause = false;       // in curl_easy_pause(CONT), which may call on_write
    int fd = -1;                   // the lane receives the body from it itself (is_direct)
    std::uint64_t left = 0;        // body bytes still to come, when direct
    int lowat = 0;                 // the socket's SO_RCVLOWAT as set (0: the default, 1 byte)
    curl_off_t curl_seen = 0;      // the body bytes libcurl had counted when the lane took it over
    // The stall limit, on the lane's clock (see lane::sweep_stalls): timed from the request
    // on (`clocked`), from the last byte, header or body, that came; a transfer held for
    // its reader is not timed. libcurl's callbacks and pull count `activity`; the lane's sweep
    // notes when it moved, so the callbacks read no clock.
    std::chrono::steady_clock::time_point last_byte;
    std::uint64_t activity = 0;       // header lines and body pieces libcurl handed over, recvs by pull
    std::uint64_t activity_seen = 0;  // `activity` at the sweep that set last_byte
    bool clocked = false;             // its request is on its way: the stall limit runs
    bool clock_stops = false;         // libcurl says when each request goes out: the clock may stop between
    bool location = false;            // this response has a Location header

    bool is_direct() const { return fd >= 0; }

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
    std::vector<std::uint64_t> started() const { return per_lane(&lane::started); }
    /// Transfers added to each lane and not yet finished (for tests and diagnostics).
    std::vector<std::size_t> loads() const { return per_lane(&lane::load); }
    /// Transfers whose body a lane received directly, over all lanes (for tests and diagnostics).
    std::uint64_t direct() const { return over_lanes(&lane::direct_count); }
    /// Times a directly received transfer was held because its reader was `hold` chunks
    /// (two, or a waiting part's room) behind, over all lanes (for tests and diagnostics).
    std::uint64_t direct_holds() const { return over_lanes(&lane::direct_holds); }
    /// Directly received transfers whose socket was given a low-water mark (direct_lowat),
    /// over all lanes (for tests).
    std::uint64_t direct_marked() const { return over_lanes(&lane::direct_marked); }
    /// The least body left, in bytes, that a lane receives directly: SLUICE_HTTP_DIRECT when
    /// it is a number (0: never), else 4 MiB. Always 0 with a libcurl other than 7.x from
    /// 7.88 (the one this was verified with: it buffers nothing of a plain-HTTP/1.1 body
    /// beyond what it hands the write callback), and when the environment names a proxy
    /// for libcurl (http_proxy, all_proxy; no_proxy not weighed): through an https://
    /// proxy the socket carries TLS, not the body, and 7.88 cannot say whether a
    /// transfer went through one. Read each time an engine starts.
    static std::uint64_t direct_threshold() {
        const auto* info = curl_version_info(CURLVERSION_NOW);
        if (!info || info->version_num < 0x075800 || info->version_num >= 0x080000) return 0;
        for (const char* proxy : {"http_proxy", "all_proxy", "ALL_PROXY"})
            if (const char* v = std::getenv(proxy); v && *v) return 0;
        return env_number("SLUICE_HTTP_DIRECT").value_or(4u << 20);
    }
    /// The bytes that must wait in a directly received body's socket before its lane
    /// wakes for them (SO_RCVLOWAT): SLUICE_HTTP_RCVLOWAT when it is a number (0 or 1: a
    /// wake-up for every arrival, as before), else 256 KiB. One 1 GiB object from nginx on
    /// loopback, 7 alternated rounds each: 3.08 GB/s and 286 ms of CPU with none, 3.80 and
    /// 245 with 128 KiB, 4.09 and 233 with 256 KiB, 3.87 and 227 with 512 KiB, 3.30 and 243
    /// with 1 MiB (bench/RESULTS.md, issue 17, thirty-first session): fewer wake-ups of the
    /// lane, each reading more, where a mark much larger leaves the sender waiting on a
    /// fuller socket. Linux holds the mark to at most half the largest receive buffer, and
    /// raises the socket's buffer to hold it where it is smaller (its window clamped to
    /// the mark until TCP's own tuning raises both): measured on loopback only. Read each
    /// time an engine starts.
    static std::uint64_t direct_lowat() { return env_number("SLUICE_HTTP_RCVLOWAT").value_or(256u << 10); }
    /// The lanes an engine starts with: SLUICE_HTTP_THREADS when it is 1-16, else half the
    /// CPUs the process may run on (detail::usable_cpus, rounded down), at least 1 and at
    /// most 4. A lane shares the CPUs with the pipeline's own threads (the CPU pool has one
    /// per CPU, and the I/O loop). On 2 CPUs one lane cost 4-23 % less CPU than two on
    /// every HTTP row measured (2,000 objects of 50-150 KB: 0.318 s against 0.379, curl
    /// 0.31), and was faster over 20,000 objects in one pass (1.48 s against 1.77) and one
    /// 1 GiB object, but 7-12 % slower in wall time over 2,000 objects in one pass, at
    /// curl's rate (1.00-1.06 x); bench/RESULTS.md, issue 17, twenty-sixth session. Above
    /// 2 CPUs the half is a choice, not a measurement: none of these VMs has more.
    static std::size_t default_lanes() {
        if (const auto n = env_number("SLUICE_HTTP_THREADS"); n && *n >= 1 && *n <= 16) return static_cast<std::size_t>(*n);
        return std::clamp<std::size_t>(usable_cpus() / 2, 1, 4);
    }
    /// The environment variable `name` when it is a whole decimal number, digits only.
    static std::optional<std::uint64_t> env_number(const char* name) {
        const char* v = std::getenv(name);
        if (!v || *v < '0' || *v > '9') return std::nullopt;
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v, &end, 10);
        if (*end) return std::nullopt;
        return n;
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
    // The sockets of a lane's connections, recorded as libcurl opens and closes them, so
    // that the lane can find the one a transfer uses (socket_of).
    using socket_list = std::vector<curl_socket_t>;
    struct cmd {
        kind k;
        std::shared_ptr<http_transfer> t;
    };

    // TLS sessions, shared by the transfers of one lane. Each transfer has an easy handle of
    // its own, and libcurl keeps sessions per easy handle: a session died with its
    // transfer, and every connection opened after the first ones (a server that ended
    // one, more requests in flight) made a full handshake, certificate chain and
    // server signature, where the curl tool resumes. A libcurl share object for SSL
    // sessions lets a lane's next connection resume the last one's session. One per lane,
    // not one for the engine: libcurl 7.88 keeps OpenSSL's session objects themselves in
    // the cache, and sharing them between threads is not supported (libcurl's
    // CURLSHOPT_SHARE); a lane's handles are used only on its thread, so it needs no lock
    // callbacks. libcurl resumes a session only for the same host, port and TLS settings
    // (verification, CA file).
    class tls_sessions {
    public:
        tls_sessions() {
            curl_global();
            share_ = curl_share_init();
            if (share_) curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
            // else transfers go without one (CURLOPT_SHARE is not set)
        }
        ~tls_sessions() {
            if (share_) curl_share_cleanup(share_);  // after ~lane cleaned up every handle that used it
        }
        tls_sessions(const tls_sessions&) = delete;
        tls_sessions& operator=(const tls_sessions&) = delete;
        CURLSH* get() const noexcept { return share_; }

    private:
        CURLSH* share_ = nullptr;
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

        // Woken only by the command that finds the queue empty: one queued before it has
        // woken the lane, or is about to, and the lane takes every queued command at once
        // (curl_multi_wakeup is a send() on a socket pair; a fetch that adds 64 transfers
        // or resumes several readers at a time made one each).
        void command(kind k, std::shared_ptr<http_transfer> t) {
            bool first = false;
            {
                std::lock_guard lock(m_);
                first = cmds_.empty();
                cmds_.push_back(cmd{k, std::move(t)});
            }
            if (first) curl_multi_wakeup(multi_);
        }

        std::atomic<std::size_t> load{0};  // transfers added and not yet finished (for add's choice)
        std::atomic<std::uint64_t> started{0};
        std::atomic<std::uint64_t> direct_count{0};  // transfers whose body this lane received directly
        std::atomic<std::uint64_t> direct_holds{0};  // times such a transfer waited for its reader
        std::atomic<std::uint64_t> direct_marked{0};  // direct transfers whose socket got a low-water mark

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
                take_over();
                // Before receive_direct, which drops the direct transfers a sweep ended.
                const int until_sweep = sweep_stalls();
                receive_direct();
                post_wakes();
                waits_.clear();
                for (auto& d : direct_) {
                    std::lock_guard lock(d->m);
                    if (!d->paused) waits_.push_back(curl_waitfd{d->fd, CURL_WAIT_POLLIN, 0});
                }
                // With transfers to time, the lane wakes for the next sweep.
                const int wait_ms = live_.empty() ? 1000 : until_sweep;
                curl_multi_poll(multi_, waits_.data(), static_cast<unsigned>(waits_.size()), wait_ms, nullptr);
            }
        }

        // The transfers on_write found fit for direct receive and paused in libcurl: the
        // lane reads their sockets from here on (a paused transfer is also left out of
        // libcurl's low-speed check), and removes each from libcurl, which closes its
        // connection, once its body is in.
        void take_over() {
            auto& wanted = direct_wanted();
            for (CURL* e : wanted) {
                auto it = live_.find(e);
                if (it == live_.end()) continue;  // it ended in the same round
                http_transfer& t = *it->second;
                if (!t.direct_wanted || t.is_direct()) continue;
                curl_off_t length = -1;
                curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
                const int fd = socket_of(e);
                if (fd < 0 || length <= 0 || static_cast<std::uint64_t>(length) <= t.received) {
                    t.direct_wanted = false;  // libcurl goes on receiving it, not asked again
                    t.direct_min = 0;
                    curl_easy_pause(e, CURLPAUSE_CONT);  // it holds none of the body: on_write took all
                    continue;
                }
                curl_off_t seen = -1;
                curl_easy_getinfo(e, CURLINFO_SIZE_DOWNLOAD_T, &seen);
                t.curl_seen = seen;
                t.fd = fd;
                t.left = static_cast<std::uint64_t>(length) - t.received;
                set_lowat(t);
                stream_fence();  // what on_write streamed into the chunk so far, before pull delivers it
                direct_.push_back(it->second);
                direct_count.fetch_add(1, std::memory_order_relaxed);
            }
            wanted.clear();
        }

        // The socket of e's connection: the one recorded socket whose two ends are the
        // addresses libcurl reports for the transfer; -1 when none is, or more than one.
        int socket_of(CURL* e) const {
            long local_port = -1, peer_port = -1;
            char* local_ip = nullptr;
            char* peer_ip = nullptr;
            curl_easy_getinfo(e, CURLINFO_LOCAL_PORT, &local_port);
            curl_easy_getinfo(e, CURLINFO_PRIMARY_PORT, &peer_port);
            curl_easy_getinfo(e, CURLINFO_LOCAL_IP, &local_ip);
            curl_easy_getinfo(e, CURLINFO_PRIMARY_IP, &peer_ip);
            if (local_port <= 0 || peer_port <= 0 || !local_ip || !peer_ip) return -1;
            auto is = [](const sockaddr_storage& a, const char* ip, long port) {
                char text[INET6_ADDRSTRLEN] = {};
                long p = -1;
                if (a.ss_family == AF_INET) {
                    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
                    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
                    p = ntohs(v4.sin_port);
                } else if (a.ss_family == AF_INET6) {
                    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
                    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
                    p = ntohs(v6.sin6_port);
                }
                return p == port && std::strcmp(text, ip) == 0;
            };
            int found = -1;
            for (const int fd : sockets_) {
                sockaddr_storage local{}, peer{};
                socklen_t nl = sizeof local, np = sizeof peer;
                if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &nl) != 0 ||
                    ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &np) != 0)
                    continue;
                if (!is(local, local_ip, local_port) || !is(peer, peer_ip, peer_port)) continue;
                if (found >= 0) return -1;
                found = fd;
            }
            return found;
        }

        // A direct transfer's socket wakes the lane's poll only once lowat_ bytes (or the
        // body's rest, when less) wait in it, rather than at each segment: see
        // direct_lowat(). Set at the takeover and lowered as the body's end comes nearer, so
        // that its last bytes wake the poll; a connection closed or reset wakes it whatever
        // the mark. A non-blocking recv takes whatever is there whatever the mark, and the
        // lane reads every direct socket each round, and rounds come at least each stall
        // sweep (250 ms) while a transfer is live: bytes that trickle in below the mark are
        // read by then, and the stall limit finds a stall at most a sweep later than it
        // would have. t.lowat is the mark asked for (the kernel may hold a smaller one).
        void set_lowat(http_transfer& t) {
            const int v = static_cast<int>(std::clamp<std::uint64_t>(std::min(lowat_, t.left), 1, 1u << 30));
            if (v == std::max(1, t.lowat)) return;
            if (::setsockopt(t.fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) != 0) return;
            if (t.lowat == 0) direct_marked.fetch_add(1, std::memory_order_relaxed);
            t.lowat = v;
        }
        // Receives what the sockets of direct transfers hold, straight into their chunks.
        void receive_direct() {
            if (direct_.empty()) return;
            std::size_t kept = 0;
            for (auto& d : direct_)
                if (d->easy && !pull(*d)) direct_[kept++] = std::move(d);
            direct_.resize(kept);
        }

        // One direct transfer's bytes, until the socket has no more for now, its reader is
        // `hold` chunks behind (it waits for a resume, as on_write's pause does), two chunks
        // were filled this round (a reader that detached holds nothing back: the lane's
        // other work and wake-ups must not wait for its whole body) or it ends; true when
        // it ended.
        bool pull(http_transfer& t) {
            // libcurl must not have read any of the body since it was paused: those bytes
            // would be missing here, and the next ones out of place. Checked at each round's
            // first recv (libcurl runs only between rounds), so only bytes before such a
            // read were delivered: the transfer ends there, to be resumed from them.
            curl_off_t seen = -1;
            curl_easy_getinfo(t.easy, CURLINFO_SIZE_DOWNLOAD_T, &seen);
            if (seen != t.curl_seen) {
                std::snprintf(t.errbuf, sizeof t.errbuf,
                              "libcurl read %lld bytes of a body received directly (SLUICE_HTTP_DIRECT=0 turns "
                              "direct receive off)",
                              static_cast<long long>(seen - t.curl_seen));
                return end_direct(t, CURLE_RECV_ERROR);
            }
            int filled = 0;
            for (;;) {
                {
                    std::lock_guard lock(t.m);
                    if (!t.paused && t.ready.size() >= t.req.hold && !t.detached) {
                        t.paused = true;
                        direct_holds.fetch_add(1, std::memory_order_relaxed);
                    }
                    if (t.paused) return false;  // held by its reader: not timed (sweep_stalls)
                }
                if (!t.buf) {
                    t.want = static_cast<std::size_t>(std::min<std::uint64_t>(t.req.chunk_size, t.left));
                    t.buf = t.req.mem ? t.req.mem->allocate(t.want) : std::make_shared<buffer>(t.want);
                    t.buf->will_write(t.want);  // the body's length is known: all of it is filled
                    t.fill = 0;
                }
                const ssize_t n = ::recv(t.fd, t.buf->data() + t.fill, t.want - t.fill, 0);  // non-blocking
                if (n > 0) {
                    const auto k = static_cast<std::size_t>(n);
                    t.fill += k;
                    t.received += k;
                    t.left -= k;
                    ++t.activity;  // for the stall limit (sweep_stalls)
                    const bool full = t.fill == t.want;
                    if (full) {
                        deliver(t, bytes(std::move(t.buf), t.fill));
                        t.buf.reset();
                        t.fill = 0;
                    }
                    if (!t.left) return end_direct(t, CURLE_OK);
                    if (t.left < static_cast<std::uint64_t>(t.lowat)) set_lowat(t);
                    if (full && ++filled == 2) return false;  // polled again: it wakes at the mark, or the next round reads it
                    continue;
                }
                if (n == 0) {  // libcurl's words for the same
                    std::snprintf(t.errbuf, sizeof t.errbuf, "transfer closed with %llu bytes remaining to read",
                                  static_cast<unsigned long long>(t.left));
                    return end_direct(t, CURLE_PARTIAL_FILE);
                }
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                std::snprintf(t.errbuf, sizeof t.errbuf, "Recv failure: %s", std::strerror(errno));
                return end_direct(t, CURLE_RECV_ERROR);
            }
            return false;
        }

        // The stall limit of every transfer, on the lane's own clock: one that had no byte,
        // header or body, for `stall_seconds` since its request went out (or since its
        // reader let it go on) fails as libcurl's low-speed check fails it, and is retried
        // as that is (stall_seconds 0: no limit, as libcurl's). libcurl's check stays set,
        // but it averages the rate over its last seconds: after a burst it noticed a stall
        // of 1 s 4.5-7 s late (bench/RESULTS.md, issue 17). Bodies received directly are
        // counted by pull. Each sweep, every `stall_sweep`, notes which transfers moved
        // since the last: a stall is found stall_seconds to that plus two sweeps after the
        // last byte. A direct transfer ended here leaves direct_ in receive_direct. Returns
        // the milliseconds to the next sweep (at least 1), for the lane's poll.
        static constexpr std::chrono::milliseconds stall_sweep{250};
        int sweep_stalls() {
            const auto now = std::chrono::steady_clock::now();
            if (const auto since = now - last_sweep_; since < stall_sweep)
                return static_cast<int>(
                    std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(stall_sweep - since).count()));
            last_sweep_ = now;
            for (auto it = live_.begin(); it != live_.end();) {
                if (!stalled(*it->second, now)) {
                    ++it;
                    continue;
                }
                const auto keep = it->second;  // live_ held it
                std::snprintf(keep->errbuf, sizeof keep->errbuf,
                              "Operation too slow. Less than 1 bytes/sec transferred the last %ld seconds",
                              keep->req.stall_seconds);
                it = live_.erase(it);
                curl_multi_remove_handle(multi_, keep->easy);  // closes its connection (a direct one's too)
                done(*keep, CURLE_OPERATION_TIMEDOUT);
            }
            return static_cast<int>(stall_sweep.count());
        }
        // Whether `t` has had nothing for its stall limit, as the sweep at `now` sees it; a
        // transfer that moved since the last sweep, or is held for its reader, has its
        // clock started again at `now`.
        static bool stalled(http_transfer& t, std::chrono::steady_clock::time_point now) {
            if (!t.clocked || t.req.stall_seconds <= 0) return false;
            if (t.activity != t.activity_seen) {
                t.activity_seen = t.activity;
                t.last_byte = now;
                return false;
            }
            if (now - t.last_byte < std::chrono::seconds(t.req.stall_seconds)) return false;
            std::lock_guard lock(t.m);
            if (!t.paused) return true;
            t.last_byte = now;  // held for its reader, not stalled
            return false;
        }

        bool end_direct(http_transfer& t, CURLcode result) {
            live_.erase(t.easy);
            curl_multi_remove_handle(multi_, t.easy);  // closes the connection: libcurl did not see its end
            done(t, result);
            return true;
        }

        void done(http_transfer& t, CURLcode result) {
            load.fetch_sub(1, std::memory_order_relaxed);
            finish(t, result);
        }

        void apply(cmd& c) {
            http_transfer& t = *c.t;
            switch (c.k) {
            case kind::add:
                t.direct_min = direct_min_;
                if (!setup(t, sockets_, tls_.get())) {
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
                // Its stall clock starts afresh: the hold ended now, not at the last round
                // or sweep that saw it held (a direct transfer's socket is read again in
                // the next round).
                if (unpause) t.last_byte = std::chrono::steady_clock::now();
                if (unpause && t.easy && !t.is_direct()) {
                    t.in_unpause = true;
                    curl_easy_pause(t.easy, CURLPAUSE_CONT);  // may write at once
                    t.in_unpause = false;
                }
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
        tls_sessions tls_;  // this lane's transfers' TLS sessions
        const std::uint64_t direct_min_ = direct_threshold();
        const std::uint64_t lowat_ = direct_lowat();
        socket_list sockets_;  // before multi_'s cleanup in ~lane closes them
        std::vector<std::shared_ptr<http_transfer>> direct_;  // received by this thread, in order taken
        std::vector<curl_waitfd> waits_;
        std::chrono::steady_clock::time_point last_sweep_{};
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

    static curl_socket_t open_socket(void* list, curlsocktype, curl_sockaddr* a) {
        const int fd = ::socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
        if (fd < 0) return CURL_SOCKET_BAD;
        static_cast<socket_list*>(list)->push_back(fd);
        return fd;
    }
    static int close_socket(void* list, curl_socket_t fd) {
        auto& l = *static_cast<socket_list*>(list);
        l.erase(std::remove(l.begin(), l.end(), fd), l.end());
        return ::close(fd);
    }

    static bool setup(http_transfer& t, socket_list& sockets, CURLSH* tls) {
        t.easy = curl_easy();
        if (!t.easy) {
            finish(t, CURLE_OUT_OF_MEMORY);
            return false;
        }
        CURL* e = t.easy;
        curl_easy_setopt(e, CURLOPT_URL, t.req.url.c_str());
        curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
        if (tls) curl_easy_setopt(e, CURLOPT_SHARE, tls);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &on_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);
        // The stall limit's clock: stopped while a connection is made (a redirect's, or a
        // new one for a kept-alive connection that turned out dead; a name looked up again
        // for the latter is still timed), started again as each request goes out. A
        // libcurl without CURLOPT_PREREQFUNCTION (before 7.80, at run time) cannot say when
        // that is: the clock runs from the start and never stops.
        curl_easy_setopt(e, CURLOPT_PREREQDATA, &t);
        t.clock_stops = curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, &on_request) == CURLE_OK;
        if (t.clock_stops) {
            curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, &on_socket);
            curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, &t);
        } else {
            t.clocked = true;
            ++t.activity;  // (the first sweep to see it starts its clock)
        }
        curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, &open_socket);
        curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, &sockets);
        curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, &close_socket);
        curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, &sockets);
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

    // The connection is up and the request about to go: the stall limit runs from here
    // (connecting is connect_timeout's).
    static int on_request(void* ud, char*, char*, int, int) {
        auto& t = *static_cast<http_transfer*>(ud);
        t.clocked = true;
        ++t.activity;
        return CURL_PREREQFUNC_OK;
    }
    // A connection is being made for the transfer: connect_timeout's, not the stall's.
    static int on_socket(void* ud, curl_socket_t, curlsocktype) {
        static_cast<http_transfer*>(ud)->clocked = false;
        return CURL_SOCKOPT_OK;
    }

    static std::size_t on_header(char* p, std::size_t size, std::size_t n, void* ud) {
        auto& t = *static_cast<http_transfer*>(ud);
        ++t.activity;
        const std::size_t len = size * n;
        std::string_view line(p, len);
        if (line == "\r\n" || line == "\n") {  // a response's headers end
            // A redirect to follow: libcurl skips its body without handing it over, and may
            // look up and connect to another host before the next request. Its clock stops
            // until that request goes out (libcurl's own low-speed check still times the
            // skipped body). A 3xx without a Location is the answer, its body timed here.
            long code = 0;
            curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &code);
            if (t.clock_stops && t.location && code >= 300 && code < 400 && code != 304) t.clocked = false;
        } else if (header_is(line, "location:")) {
            t.location = true;
        } else if (line.starts_with("HTTP/")) {  // a new response (after a redirect or 100): forget the last
            t.location = false;
            t.etag.clear();
            t.received = 0;
            t.total = http_request::npos;
            t.range_start = http_request::npos;
            t.status_known = false;
            t.chunked = false;
        } else if (header_is(line, "transfer-encoding:")) {
            t.chunked = true;
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

    /// Chunks this large are filled with streaming stores (see on_write).
    static constexpr std::size_t streamed_chunk_bytes = std::size_t{1} << 20;
    static std::size_t on_write(char* p, std::size_t size, std::size_t n, void* ud) {
        auto& t = *static_cast<http_transfer*>(ud);
        ++t.activity;
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
        // At a response's first body bytes (not inside an unpause, see consider_direct).
        if (t.direct_min && !t.direct_wanted && !t.in_unpause) consider_direct(t);
        {
            std::lock_guard lock(t.m);
            if (t.detached) return 0;  // more than the response said it has: ends it (CURLE_WRITE_ERROR)
            // The consumer is behind: hold the transfer. Not once it is to be received
            // directly: libcurl would keep these bytes, the lane could not have them, and
            // what it still hands over here is at most the rest of one receive buffer.
            if (t.ready.size() >= t.req.hold && !t.direct_wanted) {
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
                const bool sized = curl_easy_getinfo(t.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK &&
                                   length > 0 && static_cast<std::uint64_t>(length) > t.received;
                if (sized)
                    t.want = static_cast<std::size_t>(
                        std::min<std::uint64_t>(t.want, static_cast<std::uint64_t>(length) - t.received));
                t.buf = t.req.mem ? t.req.mem->allocate(t.want) : std::make_shared<buffer>(t.want);
                // Filled whole where the response said its length (a body of unknown length
                // may end anywhere in it): the pages at once, not a fault each (2,000 objects
                // of 50-150 KB: 8,300 -> 4,900 page faults, bench/RESULTS.md, issue 17).
                if (sized) t.buf->will_write(t.want);
                t.fill = 0;
            }
            const std::size_t k = std::min(len, t.want - t.fill);
            // A chunk below 1 MiB (a whole small object, or an object's tail) is read soon by
            // the next stage (a parser, the copy into a batch), and plain stores leave it in
            // the cache for that; a larger one is streamed past the cache, which it would
            // only flush. 2,000 objects of 50-150 KB (bench/RESULTS.md, issue 17, twelfth
            // session): CPU 1.68 -> 1.51 x curl's parsed as tars, 1.55 -> 1.49 raw.
            if (t.want < streamed_chunk_bytes) std::memcpy(t.buf->data() + t.fill, p, k);
            else stream_copy(t.buf->data() + t.fill, reinterpret_cast<const std::byte*>(p), k);
            t.fill += k;
            t.received += k;
            p += k;
            len -= k;
            if (t.fill == t.want) {
                stream_fence();  // streamed bytes are seen by the thread that takes the chunk
                deliver(t, bytes(std::move(t.buf), t.fill));
                t.buf.reset();
                t.fill = 0;
            }
        }
        return total;
    }

    // Whether the rest of this response's body can be received directly (see "Receiving a
    // large body directly" above): a plain-HTTP/1.1 body of known length, sent as is, with
    // at least direct_min bytes to come. Asked once per response, at its first body bytes.
    // If so, the transfer is paused in libcurl here, in its write callback, in both
    // directions: libcurl's read loop stops after the buffer it is handing over (whose
    // pieces on_write still takes), and 7.88 forces one more read of the socket after a
    // pause of one direction only, or after an unpause, which is why this is never asked
    // inside curl_easy_pause(CONT) (in_unpause). The lane takes the socket over after this
    // round of curl_multi_perform (take_over).
    static void consider_direct(http_transfer& t) {
        curl_off_t length = -1;
        long version = 0;
        const char* scheme = nullptr;
        curl_easy_getinfo(t.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
        curl_easy_getinfo(t.easy, CURLINFO_HTTP_VERSION, &version);
        curl_easy_getinfo(t.easy, CURLINFO_SCHEME, &scheme);
        const bool fits = !t.chunked && !t.discard && (t.status == 206 || (t.status == 200 && !t.ranged_ignored)) &&
                          version == CURL_HTTP_VERSION_1_1 && scheme && ::strcasecmp(scheme, "http") == 0 &&
                          length > 0 && static_cast<std::uint64_t>(length) >= t.received + t.direct_min;
        if (!fits) {
            t.direct_min = 0;  // not this response
            return;
        }
        curl_easy_pause(t.easy, CURLPAUSE_ALL);
        t.direct_wanted = true;
        direct_wanted().push_back(t.easy);
    }
    static std::vector<CURL*>& direct_wanted() {  // this lane's, since the last take_over
        thread_local std::vector<CURL*> w;
        return w;
    }

    // One of each lane's counters, lane by lane or summed.
    template <class T, class L = lane>
    std::vector<T> per_lane(std::atomic<T> L::*counter) const {
        std::vector<T> n;
        for (auto& l : lanes_) n.push_back(((*l).*counter).load(std::memory_order_relaxed));
        return n;
    }
    template <class T, class L = lane>
    T over_lanes(std::atomic<T> L::*counter) const {
        T n = 0;
        for (auto& l : lanes_) n += ((*l).*counter).load(std::memory_order_relaxed);
        return n;
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
