// What receiving straight into sluice's chunks would save (issue 17, goals 3 and 4): one
// object over HTTP/1.1 on one connection, with libcurl only connecting
// (CURLOPT_CONNECT_ONLY; it would also do TLS and proxies) and the body read by
// curl_easy_recv directly into 1 MiB chunks. Each full chunk is dropped and its memory
// used for the next, as sluice-probe's `--format chunks` drops its chunks and the
// runtime's buffer pool hands them back.
//
//   direct_recv URL [--copy] [--chunk BYTES] [--rotate N] [--prefault]
//
// --copy receives into one 512 KiB buffer and copies each piece into the chunk with
// streaming stores, as libcurl's write callback made the fetch do for every body when
// this was written (now for bodies under 4 MiB, out of a 128 KiB buffer): the same
// program with and without it isolates the copy from everything else sluice does.
// --rotate N fills N chunks in turn rather than one (the chunks a pipeline has in
// flight: N - 1 more chunks' worth of fresh memory to fault in). --prefault touches
// them before the transfer and leaves that out of cpu_s (what is left is the copy into
// memory spread over N chunks, without its first touch).
// Prints {"bytes", "seconds", "bytes_per_s", "cpu_s"} (CPU: user + system, whole process).
// A measurement, not a client: plain http://, a 200 reply with Content-Length, nothing else.
#include <sluice/core/bytes.hpp>

#include <curl/curl.h>
#include <poll.h>
#include <strings.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "direct_recv: %s\n", what.c_str());
    std::exit(1);
}

void wait_readable(CURL* e) {
    curl_socket_t s = CURL_SOCKET_BAD;
    if (curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK || s == CURL_SOCKET_BAD) fail("no socket");
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) fail("no data for 30 s");
}

// Receives up to n bytes into p, waiting while there are none; 0 at the end of the stream.
std::size_t receive(CURL* e, void* p, std::size_t n) {
    for (;;) {
        std::size_t got = 0;
        const CURLcode rc = curl_easy_recv(e, p, n, &got);
        if (rc == CURLE_OK) return got;
        if (rc != CURLE_AGAIN) fail(std::string("recv: ") + curl_easy_strerror(rc));
        wait_readable(e);
    }
}

double cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) fail("usage: direct_recv URL [--copy] [--chunk BYTES] [--rotate N] [--prefault]");
    const std::string url = argv[1];
    bool copy = false, prefault = false;
    std::size_t rotate = 1;
    std::size_t chunk = std::size_t{1} << 20;
    for (int i = 2; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--copy") copy = true;
        else if (a == "--prefault") prefault = true;
        else if (a == "--rotate" && i + 1 < argc) rotate = std::max<std::size_t>(1, std::strtoull(argv[++i], nullptr, 10));
        else if (a == "--chunk" && i + 1 < argc) chunk = std::strtoull(argv[++i], nullptr, 10);
        else fail("unknown argument " + std::string(a));
    }
    constexpr std::size_t head_max = 16384;  // the body bytes that come with the head fit one chunk
    if (chunk < head_max) fail("--chunk: at least 16384");

    const auto t0 = std::chrono::steady_clock::now();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURLU* u = curl_url();
    char *host = nullptr, *path = nullptr, *port = nullptr;
    if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK || curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
        fail("not a URL: " + url);
    curl_url_get(u, CURLUPART_PORT, &port, 0);
    CURL* e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
    if (const CURLcode rc = curl_easy_perform(e); rc != CURLE_OK) fail(std::string("connect: ") + curl_easy_strerror(rc));

    const std::string request = std::string("GET ") + path + " HTTP/1.1\r\nHost: " + host + (port ? std::string(":") + port : "") +
                                "\r\nUser-Agent: sluice-direct-recv\r\nConnection: close\r\n\r\n";
    for (std::size_t sent = 0; sent < request.size();) {
        std::size_t n = 0;
        const CURLcode rc = curl_easy_send(e, request.data() + sent, request.size() - sent, &n);
        if (rc == CURLE_AGAIN) continue;  // a request of a few hundred bytes: the socket takes it at once
        if (rc != CURLE_OK) fail(std::string("send: ") + curl_easy_strerror(rc));
        sent += n;
    }

    // The head, and whatever of the body came with it.
    std::string head(head_max, '\0');
    std::size_t have = 0, body_at = std::string::npos;
    while (body_at == std::string::npos) {
        if (have == head.size()) fail("head larger than 16 KiB");
        const std::size_t n = receive(e, head.data() + have, head.size() - have);
        if (!n) fail("connection closed in the head");
        have += n;
        const auto end = std::string_view(head.data(), have).find("\r\n\r\n");
        if (end != std::string_view::npos) body_at = end + 4;
    }
    const std::string_view h(head.data(), body_at);
    if (h.substr(0, 12) != "HTTP/1.1 200") fail("status: " + std::string(h.substr(0, h.find('\r'))));
    std::uint64_t length = 0;
    bool has_length = false;
    for (std::size_t at = 0; (at = h.find("\r\n", at)) != std::string_view::npos && at + 2 < h.size(); at += 2) {
        const auto line = h.substr(at + 2, h.find("\r\n", at + 2) - at - 2);
        if (line.size() > 15 && strncasecmp(line.data(), "content-length:", 15) == 0) {
            length = std::strtoull(std::string(line.substr(15)).c_str(), nullptr, 10);
            has_length = true;
        }
    }
    if (!has_length) fail("no Content-Length (a chunked reply is not handled here)");

    std::unique_ptr<std::byte[]> staging(copy ? new std::byte[512 * 1024] : nullptr);
    std::uint64_t received = std::min<std::uint64_t>(have - body_at, length);
    std::vector<std::shared_ptr<sluice::buffer>> ring;
    for (std::size_t i = 0; i < rotate; ++i) {
        ring.push_back(std::make_shared<sluice::buffer>(chunk));
        if (prefault) std::memset(ring.back()->data(), 0, chunk);
    }
    const double cpu_before = prefault ? cpu_seconds() : 0;
    auto buf = ring[0];
    std::memcpy(buf->data(), head.data() + body_at, static_cast<std::size_t>(received));
    std::size_t fill = static_cast<std::size_t>(received);
    std::uint64_t chunks = 0;
    while (received < length) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk - fill, length - received));
        std::size_t n;
        if (copy) {
            n = receive(e, staging.get(), std::min<std::size_t>(want, 512 * 1024));
            sluice::detail::stream_copy(buf->data() + fill, staging.get(), n);
        } else {
            n = receive(e, buf->data() + fill, want);
        }
        if (!n) fail("connection closed at byte " + std::to_string(received) + " of " + std::to_string(length));
        fill += n;
        received += n;
        if (fill == chunk || received == length) {
            if (copy) sluice::detail::stream_fence();
            ++chunks;
            buf = ring[chunks % rotate];
            fill = 0;  // the full one is dropped and its memory reused, as the runtime's pool does
        }
    }
    curl_easy_cleanup(e);
    curl_free(host);
    curl_free(path);
    curl_free(port);
    curl_url_cleanup(u);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"bytes\":%llu,\"chunks\":%llu,\"seconds\":%.4f,\"bytes_per_s\":%.0f,\"cpu_s\":%.3f,\"copy\":%s}\n",
                static_cast<unsigned long long>(received), static_cast<unsigned long long>(chunks), s, double(received) / s,
                cpu_seconds() - cpu_before, copy ? "true" : "false");
}
