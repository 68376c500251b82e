#pragma once
// Real servers for the network tests, on loopback and free ports, stopped by pid:
// nginx with a private prefix, the project's fault-injecting server
// (tests/support/fault_server.py), and the S3 emulators moto_server (signatures checked)
// and s3rver (paging), filled by tests/support/s3_setup.py.

#include "support/test_support.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace sluice_test {

/// A free TCP port on 127.0.0.1 (bound, read, released: another process may take it in
/// between, which the servers' start-up check would show).
inline int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        ::close(fd);
        throw std::runtime_error("no free port");
    }
    ::close(fd);
    return ntohs(a.sin_port);
}

inline bool accepts(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

/// nginx serving `root` on 127.0.0.1:port; with `tls`, HTTPS (HTTP/2 offered) with a
/// self-signed certificate for 127.0.0.1 made by the openssl CLI (its path: ca_file()).
/// `extra` goes into the server block (redirects...). `http2` false: HTTPS offers
/// HTTP/1.1 only, as S3 does.
class nginx_server {
public:
    explicit nginx_server(const std::string& root, bool tls = false, const std::string& extra = "", bool http2 = true)
        : tls_(tls) {
        std::string ssl;
        if (tls) {
            const auto key = dir_ / "key.pem";
            cert_ = dir_ / "cert.pem";
            auto r = run({"/usr/bin/env", "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                          "-out", cert_, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"});
            if (r.status != 0) throw std::runtime_error("openssl: " + r.err);
            ssl = "    ssl_certificate " + cert_ + ";\n    ssl_certificate_key " + key + ";\n";
        }
        // Workers drop privileges when run as root: serve as root so a private 0700
        // temporary folder is readable.
        port_ = free_port();
        const auto conf = dir_ / "nginx.conf";
        std::ofstream(conf) << (::geteuid() == 0 ? "user root;\n" : "") << "daemon off;\nworker_processes 1;\n"
                            << "pid " << (dir_ / "nginx.pid") << ";\nerror_log " << (dir_ / "error.log") << ";\n"
                            << "events { worker_connections 1024; }\n"
                            << "http {\n  access_log off;\n  sendfile on;\n  keepalive_requests 100000;\n"
                            << "  client_body_temp_path " << (dir_ / "tmp") << ";\n  proxy_temp_path " << (dir_ / "tmp")
                            << ";\n  fastcgi_temp_path " << (dir_ / "tmp") << ";\n  uwsgi_temp_path " << (dir_ / "tmp")
                            << ";\n  scgi_temp_path " << (dir_ / "tmp") << ";\n"
                            << "  server {\n    listen 127.0.0.1:" << port_ << (tls ? (http2 ? " ssl http2" : " ssl") : "") << ";\n" << ssl
                            << "    root " << root << ";\n    location /forbidden/ { deny all; }\n" << extra
                            << "  }\n}\n";
        std::filesystem::create_directories(dir_.path() / "tmp");
        proc_ = std::make_unique<child>(
            std::vector<std::string>{"nginx", "-p", dir_.path().string(), "-c", conf, "-e", dir_ / "error.log"},
            dir_ / "stdout", dir_ / "stderr");
        for (int i = 0; i < 500 && !accepts(port_); ++i) {
            if (!proc_->running())
                throw std::runtime_error("nginx exited: " + slurp_file(dir_ / "stderr") + slurp_file(dir_ / "error.log"));
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!accepts(port_)) throw std::runtime_error("nginx did not start: " + slurp_file(dir_ / "error.log"));
    }
    std::string url(const std::string& path) const {
        return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_) + "/" + path;
    }
    int port() const { return port_; }
    const std::string& ca_file() const { return cert_; }

private:
    temp_dir dir_;
    bool tls_ = false;
    std::string cert_;
    int port_ = 0;
    std::unique_ptr<child> proc_;
};

/// A test server of the project's own (a Python script under tests/support) serving `root`:
/// it prints "port N" once it listens.
class script_server {
public:
    script_server(const char* script, const std::string& root, std::vector<std::string> flags) {
        std::vector<std::string> argv{"python3", script, root};
        argv.insert(argv.end(), flags.begin(), flags.end());
        proc_ = std::make_unique<child>(argv, dir_ / "stdout", dir_ / "stderr");
        for (int i = 0; i < 1000; ++i) {
            const auto out = slurp_file(dir_ / "stdout");
            if (out.starts_with("port ") && out.find('\n') != std::string::npos) {
                port_ = std::stoi(out.substr(5));
                break;
            }
            if (!proc_->running()) throw std::runtime_error(std::string(script) + " exited: " + slurp_file(dir_ / "stderr"));
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!port_) throw std::runtime_error(std::string(script) + " did not start");
    }
    std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + "/" + path; }
    int port() const noexcept { return port_; }

private:
    temp_dir dir_;
    int port_ = 0;
    std::unique_ptr<child> proc_;
};

/// The fault-injecting server (tests/support/fault_server.py) serving `root`.
class fault_server : public script_server {
public:
    fault_server(const std::string& root, std::vector<std::string> flags)
        : script_server(SLUICE_FAULT_SERVER, root, std::move(flags)) {}
};

/// No line of `secrets_file` (aws_creds_server's --secrets: every secret key and token it
/// issued or was given) in `text`; and the file has some (else the check proves nothing).
inline void no_secret_in(const std::string& text, const std::string& secrets_file) {
    std::istringstream in(slurp_file(secrets_file));
    int n = 0;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        ++n;
        INFO("a secret or token appears in: " << text);
        REQUIRE(text.find(line) == std::string::npos);
    }
    REQUIRE(n > 0);
}

/// The server of expiring AWS credentials (tests/support/aws_creds_server.py): IMDSv2,
/// container credentials and STS's web identity hand them out; S3 objects under `root`
/// are served only to requests signed with live ones.
class aws_creds_server : public script_server {
public:
    aws_creds_server(const std::string& root, std::vector<std::string> flags)
        : script_server(SLUICE_AWS_CREDS_SERVER, root, std::move(flags)) {}
    std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port()); }
};

/// A loopback port that takes connections (the kernel's backlog) and never answers: a
/// black-holed endpoint that curl reaches.
class silent_listener {
public:
    silent_listener() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd_, 64) == 0);
        socklen_t len = sizeof a;
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
        port_ = ntohs(a.sin_port);
    }
    ~silent_listener() { ::close(fd_); }
    silent_listener(const silent_listener&) = delete;
    silent_listener& operator=(const silent_listener&) = delete;
    /// Whether a connection waits in the backlog (taken and closed here).
    bool has_caller() {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK);
        if (c < 0) return false;
        ::close(c);
        return true;
    }
    std::string url(const std::string& path = "") const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
    int port() const { return port_; }

private:
    int fd_ = -1;
    int port_ = 0;
};

/// An executable on PATH (or a path that is executable).
inline bool have_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0;
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "";
    for (std::size_t a = 0; a <= dirs.size();) {
        const auto b = std::min(dirs.find(':', a), dirs.size());
        const std::string f = dirs.substr(a, b - a) + "/" + name;
        if (b > a && ::access(f.c_str(), X_OK) == 0) return true;
        a = b + 1;
    }
    return false;
}

/// An S3 emulator on 127.0.0.1, filled from `root` (each directory under it a bucket).
/// kind "moto": moto_server, signature checking turned on after the upload, with an IAM
/// user's key (key(), secret()) that may read S3 and assume the role `role_arn` (which may
/// read S3). kind "moto-open": the same, signatures left unchecked. kind "s3rver": s3rver
/// (checks the key id only; key and secret S3RVER).
class s3_server {
public:
    /// Why this kind cannot run here ("" when it can).
    static std::string unavailable(const std::string& kind) {
        if (!have_program("python3") || run({"/usr/bin/env", "python3", "-c", "import boto3"}).status != 0) return "python3 with boto3 is missing";
        if (kind.starts_with("moto")) return have_program("moto_server") ? "" : "moto_server is not on PATH";
        return have_program(SLUICE_S3RVER) ? "" : "s3rver is not installed (scripts/deps.sh --test installs it)";
    }
    s3_server(const std::string& kind, const std::string& root) {
        port_ = free_port();
        const auto port = std::to_string(port_);
        if (kind.starts_with("moto")) {
            // Unchecked for the setup's requests, then checked (s3_setup.py resets it).
            proc_ = std::make_unique<child>(std::vector<std::string>{"env", "INITIAL_NO_AUTH_ACTION_COUNT=1000000",
                                                                     "moto_server", "-H", "127.0.0.1", "-p", port},
                                            dir_ / "stdout", dir_ / "stderr");
        } else {
            std::filesystem::create_directories(dir_ / "data");
            proc_ = std::make_unique<child>(std::vector<std::string>{"env", "NODE_OPTIONS=--openssl-legacy-provider",
                                                                     SLUICE_S3RVER, "-s", "-d", dir_ / "data", "-a",
                                                                     "127.0.0.1", "-p", port},
                                            dir_ / "stdout", dir_ / "stderr");
        }
        for (int i = 0; i < 3000 && !accepts(port_); ++i) {
            if (!proc_->running()) throw std::runtime_error(kind + " exited: " + slurp_file(dir_ / "stderr"));
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!accepts(port_)) throw std::runtime_error(kind + " did not start: " + slurp_file(dir_ / "stderr"));
        auto r = run({"/usr/bin/env", "python3", SLUICE_S3_SETUP, kind, endpoint(), root});
        if (r.status != 0) throw std::runtime_error("s3_setup.py " + kind + " failed: " + r.err);
        const auto sp = r.out.find(' ');
        key_ = r.out.substr(0, sp);
        secret_ = r.out.substr(sp + 1);
        while (!secret_.empty() && (secret_.back() == '\n' || secret_.back() == '\r')) secret_.pop_back();
    }
    /// The role s3_setup.py makes in moto (moto's account is 123456789012).
    static constexpr const char* role_arn = "arn:aws:iam::123456789012:role/sluice-reader";
    std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
    const std::string& key() const { return key_; }
    const std::string& secret() const { return secret_; }

private:
    temp_dir dir_;
    int port_ = 0;
    std::string key_, secret_;
    std::unique_ptr<child> proc_;
};


}  // namespace sluice_test

/// Ends a test case, reported skipped, when the S3 emulator `kind` cannot run here.
#define SLUICE_SKIP_WITHOUT(kind)                                                          \
    if (auto why = sluice_test::s3_server::unavailable(kind); !why.empty()) {              \
        WARN("[test skipped] " << why);                                                    \
        return;                                                                            \
    }

