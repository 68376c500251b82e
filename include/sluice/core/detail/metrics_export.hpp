#pragma once
// The live figures for people and scrapers (pipeline_options::metrics): Prometheus' text
// format in a file rewritten every interval (written whole, then renamed over the old
// one, so a reader never sees half of it), and/or served at any GET on a port of
// 127.0.0.1 (loopback only: the figures name URLs and paths). One thread of its own,
// asleep in poll() between writes and requests.

#include <sluice/core/error.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

namespace sluice::detail {

class metrics_exporter {
public:
    /// `text()` gives the figures now (called on the exporter's thread). Throws
    /// sluice::error when the file cannot be written or the port cannot be bound.
    metrics_exporter(std::string file, int port, std::chrono::milliseconds interval, std::function<std::string()> text)
        : file_(std::move(file)), interval_(interval.count() > 0 ? interval : std::chrono::milliseconds(1000)),
          text_(std::move(text)) {
        if (!file_.empty()) {
            if (auto why = write_file("# sluice: starting\n"); !why.empty()) throw error(why);
        }
        if (port >= 0) listen_on(port);
        wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (wake_ < 0) {
            close_fd(listen_);
            throw error("sluice: metrics: eventfd: " + std::string(std::strerror(errno)), {errno, std::generic_category()});
        }
        thread_ = std::thread([this] { loop(); });
    }
    metrics_exporter(const metrics_exporter&) = delete;
    metrics_exporter& operator=(const metrics_exporter&) = delete;
    ~metrics_exporter() { finish({}); }

    /// The port serving the figures (the one bound when 0 was asked); -1: none.
    int port() const noexcept { return port_; }

    /// Stops the thread, closes the port and, given the final figures, writes the file a
    /// last time. Safe to call more than once.
    void finish(const std::string& final_text) {
        if (thread_.joinable()) {
            stop_.store(true);
            const std::uint64_t one = 1;
            [[maybe_unused]] auto n = ::write(wake_, &one, sizeof one);
            thread_.join();
        }
        close_fd(listen_);
        close_fd(wake_);
        if (!final_text.empty() && !file_.empty()) note(write_file(final_text));
    }

private:
    static void close_fd(int& fd) {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }

    void listen_on(int port) {
        listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listen_ < 0) throw error("sluice: metrics port: socket: " + std::string(std::strerror(errno)));
        const int on = 1;
        ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (port > 65535 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_, 16) != 0) {
            const int e = port > 65535 ? EINVAL : errno;
            close_fd(listen_);
            throw error("sluice: metrics port 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(e),
                        {e, std::generic_category()});
        }
        socklen_t len = sizeof a;
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
    }

    // Written whole beside the file, then renamed over it. Returns why it failed, or "".
    std::string write_file(const std::string& text) const {
        const std::string tmp = file_ + ".tmp";
        std::FILE* f = std::fopen(tmp.c_str(), "w");
        if (!f) return "sluice: metrics file " + file_ + " (writing " + tmp + "): " + std::strerror(errno);
        const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
        const int e = errno;
        if (std::fclose(f) != 0 || !ok) {
            std::remove(tmp.c_str());
            return "sluice: metrics file " + file_ + " (writing " + tmp + "): " + std::strerror(ok ? errno : e);
        }
        if (std::rename(tmp.c_str(), file_.c_str()) != 0) {
            const int r = errno;
            std::remove(tmp.c_str());
            return "sluice: metrics file " + file_ + ": " + std::strerror(r);
        }
        return {};
    }
    // A failure after the start (the disk filled): said once on stderr, the run goes on.
    void note(const std::string& why) {
        if (why.empty() || warned_.exchange(true)) return;
        std::fprintf(stderr, "%s (the figures are not written again)\n", why.c_str());
    }

    void loop() {
        using clock = std::chrono::steady_clock;
        auto next = clock::now() + interval_;
        while (!stop_.load()) {
            pollfd fds[2] = {{wake_, POLLIN, 0}, {listen_, POLLIN, 0}};
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock::now()).count();
            const int n = ::poll(fds, listen_ >= 0 ? 2 : 1, static_cast<int>(std::max<long long>(ms, 0)));
            if (stop_.load()) break;
            if (n > 0 && listen_ >= 0 && (fds[1].revents & POLLIN)) serve_one();
            if (clock::now() >= next) {
                if (!file_.empty() && !warned_.load()) note(write_file(text_()));
                next = clock::now() + interval_;
            }
        }
    }

    // One request: read its head (1 s at most), answer, close. GET / and GET /metrics
    // give the figures; anything else is 404, a method other than GET 405.
    void serve_one() {
        const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        timeval tv{1, 0};
        ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        std::string head;
        char buf[2048];
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos && head.size() < 16384) {
            // A client that sends nothing holds neither a stop nor the next write long.
            pollfd fds[2] = {{c, POLLIN, 0}, {wake_, POLLIN, 0}};
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            if (left <= 0 || ::poll(fds, 2, static_cast<int>(left)) <= 0 || fds[1].revents || stop_.load()) {
                ::close(c);
                return;
            }
            const auto got = ::recv(c, buf, sizeof buf, 0);
            if (got <= 0) break;
            head.append(buf, static_cast<std::size_t>(got));
        }
        std::string status = "200 OK", body;
        const auto sp = head.find(' '), sp2 = head.find(' ', sp == std::string::npos ? 0 : sp + 1);
        const std::string method = head.substr(0, sp);
        const std::string path = sp == std::string::npos ? "" : head.substr(sp + 1, sp2 - sp - 1);
        if (method != "GET" && method != "HEAD") {
            status = "405 Method Not Allowed";
            body = "sluice serves its figures to GET /metrics\n";
        } else if (path != "/" && path != "/metrics" && !path.starts_with("/metrics?")) {
            status = "404 Not Found";
            body = "sluice serves its figures at /metrics\n";
        } else {
            body = text_();
        }
        std::string reply = "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n" +
                            "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
        if (method != "HEAD") reply += body;
        for (std::size_t off = 0; off < reply.size();) {
            const auto sent = ::send(c, reply.data() + off, reply.size() - off, MSG_NOSIGNAL);
            if (sent <= 0) break;
            off += static_cast<std::size_t>(sent);
        }
        ::close(c);
    }

    std::string file_;
    std::chrono::milliseconds interval_;
    std::function<std::string()> text_;
    int listen_ = -1, wake_ = -1, port_ = -1;
    std::atomic<bool> stop_{false}, warned_{false};
    std::thread thread_;
};

}  // namespace sluice::detail
