#pragma once
// AWS credentials as the AWS CLI finds them, without an SDK, and resolve_s3, which puts
// endpoint, region and credentials together (see s3_options in io/s3.hpp for the order).
//
// The chain: the environment's keys → web identity (AWS_ROLE_ARN + a token file, exchanged
// at STS by AssumeRoleWithWebIdentity) → the profile in the shared files (an assumed role
// from source_profile, credential_source or web_identity_token_file; static keys in the
// credentials file; credential_process; static keys in the config file) → container
// credentials (ECS, EKS Pod Identity) → instance metadata (IMDSv2). The first source that
// is configured wins; a configured source that fails is an error naming it and the status,
// not a step to the next. Only instance metadata is tried unconfigured, with short
// timeouts, and its absence (a laptop) falls through in well under a second.
//
// No secret, token or reply body ever goes into a message: errors name the source, the
// endpoint and the status (and AWS's error code and message, which carry neither).

#include <sluice/core/detail/json.hpp>
#include <sluice/core/error.hpp>
#include <sluice/io/detail/aws_http.hpp>
#include <sluice/io/detail/curl_errors.hpp>
#include <sluice/io/detail/retry.hpp>
#include <sluice/io/detail/s3_config.hpp>
#include <sluice/io/detail/s3_sign.hpp>

#include <curl/curl.h>
#include <pugixml.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace sluice::detail {

/// "2026-11-24T20:50:04Z", with optional fractional seconds, and "Z", "+hh:mm" or no zone
/// (UTC): the Expiration that STS, instance metadata, containers and credential_process
/// write. Nothing when malformed.
inline std::optional<wall_clock::time_point> parse_iso8601(std::string_view s) {
    auto num = [&](std::size_t at, std::size_t n, int& out) {
        if (at + n > s.size()) return false;
        out = 0;
        for (std::size_t i = at; i < at + n; ++i) {
            if (s[i] < '0' || s[i] > '9') return false;
            out = out * 10 + (s[i] - '0');
        }
        return true;
    };
    int Y, M, D, h, m, sec;
    if (!num(0, 4, Y) || s.size() < 19 || s[4] != '-' || !num(5, 2, M) || s[7] != '-' || !num(8, 2, D) ||
        (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !num(11, 2, h) || s[13] != ':' || !num(14, 2, m) ||
        s[16] != ':' || !num(17, 2, sec))
        return std::nullopt;
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return std::nullopt;
    std::size_t i = 19;
    std::chrono::microseconds fraction{0};
    if (i < s.size() && s[i] == '.') {
        long us = 0, scale = 100000;
        for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, scale /= 10) us += (s[i] - '0') * scale;
        fraction = std::chrono::microseconds(us);
    }
    const std::string_view zone = s.substr(i);
    long offset = 0;
    if (zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && zone[3] == ':') {
        int oh, om;
        if (!num(i + 1, 2, oh) || !num(i + 4, 2, om)) return std::nullopt;
        offset = (zone[0] == '-' ? -1 : 1) * (oh * 3600L + om * 60L);
    } else if (!zone.empty() && zone != "Z" && zone != "z") {
        return std::nullopt;
    }
    std::tm t{};
    t.tm_year = Y - 1900;
    t.tm_mon = M - 1;
    t.tm_mday = D;
    t.tm_hour = h;
    t.tm_min = m;
    t.tm_sec = sec;
    return wall_clock::from_time_t(::timegm(&t)) + fraction - std::chrono::seconds(offset);
}

/// The credentials in a JSON reply: instance metadata's and containers' (`Token`), or
/// credential_process's (`SessionToken`). `source` names the reply in errors; the reply
/// itself never appears in one.
inline s3_credentials credentials_from_json(std::string_view body, const std::string& source) {
    try {
        json_object_reader r(body);
        auto str = [&](std::string_view k) -> std::string {
            const auto v = r.member(k);
            if (!v || v->empty() || v->front() != '"') return {};
            return json_object_reader::string_value(*v);
        };
        if (auto code = str("Code"); !code.empty() && code != "Success")
            throw credentials_unavailable(source + " answered Code " + code.substr(0, 64));
        s3_credentials c{str("AccessKeyId"), str("SecretAccessKey"), str("Token")};
        if (c.session_token.empty()) c.session_token = str("SessionToken");
        if (c.access_key.empty() || c.secret_key.empty())
            throw credentials_unavailable(source + " answered without AccessKeyId and SecretAccessKey");
        if (const auto e = str("Expiration"); !e.empty()) {
            c.expires = parse_iso8601(e);
            if (!c.expires) throw credentials_unavailable(source + " answered an Expiration that is not an ISO 8601 time");
        }
        return c;
    } catch (const json_error& e) {
        throw credentials_unavailable(source + " answered what is not a JSON object (" + e.what() + ")");
    }
}

/// The credentials in an STS reply (<AssumeRoleResponse><AssumeRoleResult><Credentials>,
/// and the same for AssumeRoleWithWebIdentity).
inline s3_credentials credentials_from_sts(std::string_view body, const std::string& source) {
    pugi::xml_document doc;
    (void)doc.load_buffer(body.data(), body.size());
    pugi::xml_node result;
    for (auto c : doc.document_element().children()) {
        const std::string_view n = c.name();
        if (c.type() == pugi::node_element && n.ends_with("Result")) result = c;
    }
    const auto creds = xml_child(result, "Credentials");
    s3_credentials c{xml_child(creds, "AccessKeyId").text().get(), xml_child(creds, "SecretAccessKey").text().get(),
                     xml_child(creds, "SessionToken").text().get()};
    if (c.access_key.empty() || c.secret_key.empty())
        throw credentials_unavailable(source + " answered without credentials");
    c.expires = parse_iso8601(xml_child(creds, "Expiration").text().get());
    if (!c.expires) throw credentials_unavailable(source + " answered without a valid Expiration");
    return c;
}

/// A small request with one retry after a transient failure (a connection that failed,
/// 5xx, 429). `attempts` in all.
inline s3_reply call_with_retry(const blocking_request& q, unsigned attempts) {  // q.stop ends it
    s3_reply r;
    for (unsigned a = 0;; ++a) {
        r = s3_reply{};
        blocking_call(q, r);
        if (q.stop.stop_requested()) throw stopped{};  // not the source's failure
        const bool ok = r.result == CURLE_OK && r.status < 500 && r.status != 429;
        if (ok || a + 1 >= attempts) return r;
        if (r.result != CURLE_OK ? !retryable_curl(r.result) && r.result != CURLE_OPERATION_TIMEDOUT
                                 : !retryable_status(r.status))
            return r;
        std::this_thread::sleep_for(std::chrono::milliseconds(50 << a));
    }
}

inline std::string read_token_file(const std::string& path, const std::string& source) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw credentials_unavailable(source + ": cannot read the token file " + path + " (" + std::strerror(errno) + ")");
    std::string token((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    token = trim(token);
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    if (token.empty()) throw credentials_unavailable(source + ": the token file " + path + " is empty");
    if (token.find_first_of("\r\n") != std::string::npos)
        throw credentials_unavailable(source + ": the token file " + path + " holds more than one line");
    return token;
}

// ---- STS ------------------------------------------------------------------------------

/// Where STS is, as the AWS CLI finds it: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, the
/// profile's endpoint_url, else the regional endpoint https://sts.<region>.amazonaws.com.
struct sts_endpoint {
    std::string url, region, ca_file;
};

inline sts_endpoint sts_endpoint_for(const ini_section& conf, const std::string& region, const std::string& ca_bundle = {}) {
    sts_endpoint e;
    e.region = region.empty() ? "us-east-1" : region;
    e.url = env_or("AWS_ENDPOINT_URL_STS", env_or("AWS_ENDPOINT_URL", conf.get("endpoint_url")));
    if (e.url.empty()) e.url = "https://sts." + e.region + ".amazonaws.com";
    while (e.url.ends_with('/')) e.url.pop_back();
    e.ca_file = !ca_bundle.empty() ? ca_bundle : env_or("AWS_CA_BUNDLE", conf.get("ca_bundle"));
    return e;
}

/// One STS action (a form POST, as the SDKs send it: a token never goes into a URL), signed
/// with `as` unless null. Throws credentials_unavailable naming `source` and the status.
inline s3_credentials sts_call(const sts_endpoint& ep, std::vector<std::pair<std::string, std::string>> params,
                               const s3_credentials* as, const std::string& source, std::stop_token stop) {
    params.emplace_back("Version", "2011-06-15");
    blocking_request q{.method = "POST",
                       .url = ep.url + "/",
                       .headers = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8"},
                       .body = s3_query(std::move(params)),  // sorted and encoded: a valid form body
                       .ca_file = ep.ca_file,
                       .timeout_ms = 10000,
                       .connect_timeout_ms = 3000,
                       .stop = std::move(stop)};
    if (as) q.auth = auth_with(*as, ep.region, "sts");
    const s3_reply r = call_with_retry(q, 3);
    if (r.result != CURLE_OK || r.status != 200)
        throw credentials_unavailable(source + ": " + request_failure(r.result, r.errbuf, r.status, r.body) + " from " +
                                      source_error::redact(ep.url));
    return credentials_from_sts(r.body, source);
}

inline std::string default_session_name() {
    return "sluice-" + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          wall_clock::now().time_since_epoch()).count());
}

/// What AssumeRole and AssumeRoleWithWebIdentity are asked for.
struct role_request {
    std::string role_arn, session_name, external_id, duration_seconds;
    std::vector<std::pair<std::string, std::string>> params(const char* action) const {
        std::vector<std::pair<std::string, std::string>> p{
            {"Action", action}, {"RoleArn", role_arn}, {"RoleSessionName", session_name.empty() ? default_session_name() : session_name}};
        if (!external_id.empty()) p.emplace_back("ExternalId", external_id);
        if (!duration_seconds.empty()) p.emplace_back("DurationSeconds", duration_seconds);
        return p;
    }
};

inline s3_credentials assume_role_with_web_identity(const sts_endpoint& ep, const role_request& role,
                                                    const std::string& token_file, const std::string& source,
                                                    std::stop_token stop) {
    auto p = role.params("AssumeRoleWithWebIdentity");
    p.emplace_back("WebIdentityToken", read_token_file(token_file, source));
    return sts_call(ep, std::move(p), nullptr, source, std::move(stop));
}

inline s3_credentials assume_role(const sts_endpoint& ep, const role_request& role, const s3_credentials& as,
                                  const std::string& source, std::stop_token stop) {
    return sts_call(ep, role.params("AssumeRole"), &as, source, std::move(stop));
}

// ---- credential_process ---------------------------------------------------------------

/// Runs a profile's credential_process and reads the JSON it prints (Version 1). It runs
/// as `/bin/sh -c LINE` in a process group of its own. botocore splits the line itself and
/// runs no shell; plain commands read the same both ways, and a shell also allows pipes
/// and variables. Its stdin is /dev/null and its stderr is ours. A stop, or no answer in
/// 60 s, kills its group. The command line is not named in errors: it may carry a secret
/// of its own.
inline s3_credentials run_credential_process(const std::string& command, const std::string& source, std::stop_token stop) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw credentials_unavailable(source + ": cannot start it (" + std::strerror(errno) + ")");
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    ::posix_spawn_file_actions_init(&fa);
    ::posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    ::posix_spawnattr_init(&attr);
    ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    ::posix_spawnattr_setpgroup(&attr, 0);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
    ::posix_spawn_file_actions_destroy(&fa);
    ::posix_spawnattr_destroy(&attr);
    ::close(fds[1]);
    if (rc != 0) {
        ::close(fds[0]);
        throw credentials_unavailable(source + ": cannot start it (" + std::strerror(rc) + ")");
    }
    std::string out;
    bool stopped_it = false, timed_out = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
        pollfd p{fds[0], POLLIN, 0};
        const int n = ::poll(&p, 1, 100);  // a stop is seen within 0.1 s
        if (stop.stop_requested()) {
            stopped_it = true;
            break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            timed_out = true;
            break;
        }
        if (n <= 0) continue;  // EINTR or nothing yet
        char buf[4096];
        const ssize_t got = ::read(fds[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;  // its end: EOF
        if (out.size() < (1u << 20)) out.append(buf, static_cast<std::size_t>(got));
    }
    ::close(fds[0]);
    if (stopped_it || timed_out) ::kill(-pid, SIGKILL);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (stopped_it) throw stopped{};
    if (timed_out) throw credentials_unavailable(source + " gave no answer in 60 s (killed)");
    if (!WIFEXITED(st)) throw credentials_unavailable(source + " ended by signal " + std::to_string(WTERMSIG(st)));
    if (WEXITSTATUS(st) != 0) throw credentials_unavailable(source + " exited with status " + std::to_string(WEXITSTATUS(st)));
    try {
        json_object_reader r(out);
        if (r.member("Version").value_or("") != "1")
            throw credentials_unavailable(source + " printed JSON without \"Version\": 1");
    } catch (const json_error& e) {
        throw credentials_unavailable(source + " printed what is not a JSON object (" + e.what() + ")");
    }
    return credentials_from_json(out, source);
}

// ---- container credentials ------------------------------------------------------------

struct container_endpoint {
    std::string url;    // with its path
    std::string shown;  // what names it: redacted, and without ECS's per-task path
    std::string token, token_file;
};

/// The host of an http(s) URL, without port and brackets.
inline std::string url_host(std::string_view url) {
    const auto p = url.find("://");
    if (p == std::string_view::npos) return {};
    url.remove_prefix(p + 3);
    url = url.substr(0, url.find_first_of("/?#"));
    if (const auto at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
    if (url.starts_with('[')) return std::string(url.substr(1, url.find(']') - 1));
    return std::string(url.substr(0, url.rfind(':') == std::string_view::npos ? url.size() : url.rfind(':')));
}

/// From AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on ECS: http://169.254.170.2 + it) or
/// AWS_CONTAINER_CREDENTIALS_FULL_URI (https anywhere; http only to loopback or to ECS's
/// and EKS Pod Identity's link-local addresses, as the SDKs allow), with
/// AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read at each request) or _TOKEN. Nothing when
/// neither URI is set.
inline std::optional<container_endpoint> container_from_env() {
    container_endpoint c;
    if (auto rel = env_or("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); !rel.empty()) {
        c.url = "http://169.254.170.2" + (rel.starts_with('/') ? rel : "/" + rel);
        c.shown = "http://169.254.170.2, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";
    } else if (auto full = env_or("AWS_CONTAINER_CREDENTIALS_FULL_URI"); !full.empty()) {
        const std::string scheme = lower(full.substr(0, full.find("://")));
        const std::string host = lower(url_host(full));
        in_addr v4{};
        in6_addr v6{};
        const bool is_v4 = ::inet_pton(AF_INET, host.c_str(), &v4) == 1;
        const bool is_v6 = !is_v4 && ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
        in6_addr eks{};
        ::inet_pton(AF_INET6, "fd00:ec2::23", &eks);
        // Addresses, parsed: a name like 127.example.com is not loopback.
        const bool local = host == "localhost" || (is_v4 && (ntohl(v4.s_addr) >> 24) == 127) ||
                           (is_v4 && (host == "169.254.170.2" || host == "169.254.170.23")) ||
                           (is_v6 && (IN6_IS_ADDR_LOOPBACK(&v6) || std::memcmp(&v6, &eks, sizeof v6) == 0));
        if (full.find("://") == std::string::npos || (scheme != "https" && !(scheme == "http" && local)))
            throw credentials_unavailable(
                "container credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI must be https, or http to loopback or "
                "169.254.170.2/169.254.170.23/fd00:ec2::23, not " + source_error::redact(full) + ",");
        c.url = full;
        c.shown = source_error::redact(full);
    } else {
        return std::nullopt;
    }
    c.token_file = env_or("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    if (c.token_file.empty()) c.token = env_or("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    return c;
}

inline s3_credentials container_credentials(const container_endpoint& c, const std::string& source, std::stop_token stop) {
    const std::string token = !c.token_file.empty() ? read_token_file(c.token_file, source) : c.token;
    if (c.token_file.empty() && token.find_first_of("\r\n") != std::string::npos)  // the file's is checked as read
        throw credentials_unavailable(source + ": AWS_CONTAINER_AUTHORIZATION_TOKEN holds a line break");
    blocking_request q{.url = c.url, .timeout_ms = 2000, .connect_timeout_ms = 1000, .no_proxy = true, .stop = std::move(stop)};
    if (!token.empty()) q.headers.push_back("Authorization: " + token);
    const s3_reply r = call_with_retry(q, 2);
    if (r.result != CURLE_OK || r.status != 200)
        throw credentials_unavailable(source + ": " + request_failure(r.result, r.errbuf, r.status, {}));
    return credentials_from_json(r.body, source);
}

// ---- instance metadata (IMDSv2) -------------------------------------------------------

/// The instance's role credentials from IMDSv2: a session token (PUT, kept for its 6 hours),
/// the role's name, then its credentials. IMDSv1 (no token) is not used. Endpoint:
/// AWS_EC2_METADATA_SERVICE_ENDPOINT, the profile's ec2_metadata_service_endpoint,
/// AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6 (http://[fd00:ec2::254]), else
/// http://169.254.169.254. Each request waits AWS_METADATA_SERVICE_TIMEOUT seconds (default
/// 0.3 s for the token, 1 s after: instance metadata answers in about a millisecond) and is
/// tried AWS_METADATA_SERVICE_NUM_ATTEMPTS times (default 2).
class imds_client {
public:
    explicit imds_client(const ini_section& conf) {
        endpoint_ = env_or("AWS_EC2_METADATA_SERVICE_ENDPOINT", conf.get("ec2_metadata_service_endpoint"));
        if (endpoint_.empty())
            endpoint_ = lower(env_or("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", conf.get("ec2_metadata_service_endpoint_mode"))) == "ipv6"
                            ? "http://[fd00:ec2::254]"
                            : "http://169.254.169.254";
        while (endpoint_.ends_with('/')) endpoint_.pop_back();
        if (auto t = env_or("AWS_METADATA_SERVICE_TIMEOUT"); !t.empty()) {
            try {
                const double seconds = std::stod(t);
                if (!(seconds > 0 && seconds < 3600)) throw std::invalid_argument("out of range");
                token_ms_ = answer_ms_ = std::max(1L, static_cast<long>(seconds * 1000));
            } catch (const std::exception&) {
                throw credentials_unavailable("instance metadata: AWS_METADATA_SERVICE_TIMEOUT is not a number of seconds below 3600,");
            }
        }
        if (auto n = env_or("AWS_METADATA_SERVICE_NUM_ATTEMPTS"); !n.empty())
            attempts_ = static_cast<unsigned>(std::clamp(std::atoi(n.c_str()), 1, 10));
    }
    static bool disabled() { return lower(env_or("AWS_EC2_METADATA_DISABLED")) == "true"; }
    const std::string& endpoint() const noexcept { return endpoint_; }
    std::string source() const {
        std::lock_guard lock(m_);
        return name(role_.empty() ? "" : ", role " + role_);
    }

    /// The role's credentials. When no instance metadata answers (not on EC2) and
    /// `why_not` is given: nothing, with why in it. A refusal, or no answer when `why_not`
    /// is null (a refresh), throws credentials_unavailable.
    std::optional<s3_credentials> fetch(std::string* why_not, std::stop_token stop) {
        std::lock_guard lock(m_);
        const std::string name = this->name();
        for (int fresh_token = 0; fresh_token < 2; ++fresh_token) {
            if (token_.empty() || wall_clock::now() >= token_until_) {
                const s3_reply r = call_with_retry({.method = "PUT",
                                                    .url = endpoint_ + "/latest/api/token",
                                                    .headers = {"X-aws-ec2-metadata-token-ttl-seconds: 21600"},
                                                    .timeout_ms = token_ms_,
                                                    .connect_timeout_ms = token_ms_,
                                                    .no_proxy = true,
                                                    .stop = stop},
                                                   attempts_);
                const bool absent = r.result != CURLE_OK || r.status == 403 || r.status == 404 || r.status == 405;
                if (absent && why_not) {
                    *why_not = source_error::redact(endpoint_) + ": " +
                               (r.result != CURLE_OK ? request_failure(r.result, r.errbuf, 0, {})
                                                     : "HTTP " + std::to_string(r.status) + " to the token request (IMDSv2 off)");
                    return std::nullopt;
                }
                if (r.result != CURLE_OK || r.status != 200)
                    throw credentials_unavailable(name + ": " + request_failure(r.result, r.errbuf, r.status, {}) +
                                                  " to the token request");
                token_ = trim(r.body);
                if (token_.empty() || token_.find_first_of("\r\n") != std::string::npos)
                    throw credentials_unavailable(name + ": the token request answered no usable token");
                token_until_ = wall_clock::now() + std::chrono::hours(6) - std::chrono::minutes(1);
            }
            const std::string base = endpoint_ + "/latest/meta-data/iam/security-credentials/";
            s3_reply r = get(base, stop);
            if (r.result == CURLE_OK && r.status == 401 && !fresh_token) {
                token_.clear();
                continue;
            }
            if (r.result == CURLE_OK && r.status == 404 && why_not) {
                *why_not = source_error::redact(endpoint_) + ": no IAM role attached (HTTP 404)";
                return std::nullopt;
            }
            if (r.result != CURLE_OK || r.status != 200)
                throw credentials_unavailable(name + ": " + request_failure(r.result, r.errbuf, r.status, {}) + " to the role request");
            role_ = trim(std::string_view(r.body).substr(0, r.body.find('\n')));
            if (role_.empty() || role_.find_first_of("/?#% ") != std::string::npos)
                throw credentials_unavailable(name + ": the role request answered no role name");
            r = get(base + role_, stop);
            if (r.result == CURLE_OK && r.status == 401 && !fresh_token) {
                token_.clear();
                continue;
            }
            if (r.result != CURLE_OK || r.status != 200)
                throw credentials_unavailable(name + ": " + request_failure(r.result, r.errbuf, r.status, {}) +
                                              " to the credentials request for role " + role_);
            return credentials_from_json(r.body, name);
        }
        throw credentials_unavailable(name + ": HTTP 401 (its own token refused twice)");
    }

private:
    std::string name(const std::string& more = {}) const {
        return "instance metadata (IMDSv2 at " + source_error::redact(endpoint_) + more + ")";
    }
    s3_reply get(const std::string& url, std::stop_token stop) const {
        return call_with_retry({.url = url,
                                .headers = {"X-aws-ec2-metadata-token: " + token_},
                                .timeout_ms = answer_ms_,
                                .connect_timeout_ms = answer_ms_,
                                .no_proxy = true,
                                .stop = std::move(stop)},
                               attempts_);
    }

    std::string endpoint_;
    long token_ms_ = 300, answer_ms_ = 1000;
    unsigned attempts_ = 2;
    mutable std::mutex m_;  // one fetch at a time; token_ and role_
    std::string token_, role_;
    wall_clock::time_point token_until_{};
};

// ---- the chain ------------------------------------------------------------------------

/// What the credential chain reads besides the environment: the options, the profile and
/// its sections of the two shared files, and the region (for STS).
struct credential_inputs {
    const s3_options& o;
    const std::string& profile;
    const std::string& cred_file;
    const std::string& config_file;
    const ini_section& creds;  // [profile] of the credentials file
    const ini_section& conf;   // its section of the config file
    const std::string& region;
    std::stop_token stop = {};  // cuts the sources' requests short
};


/// One source of credentials: its name (shown; never a secret) and how to ask it.
struct credential_source {
    std::string name;
    credential_provider::fetch_fn fetch;
};

inline std::shared_ptr<credential_provider> provide(credential_source s, std::stop_token stop) {
    auto first = s.fetch(stop);
    return std::make_shared<credential_provider>(std::move(s.name), std::move(first), std::move(s.fetch));
}

/// A profile as both shared files give it (the config file's values first).
struct profile_view {
    std::string name;
    ini_section creds, conf;
    std::string get(std::string_view k) const {
        std::string v = conf.get(k);
        return v.empty() ? creds.get(k) : v;
    }
};

inline std::vector<std::string> config_sections(const std::string& profile) {
    return profile == "default" ? std::vector<std::string>{"default", "profile default"}
                                : std::vector<std::string>{"profile " + profile};
}

/// A static key pair in one section: read again when asked again (a file rotated under a
/// long run); a pair gone since is an error.
inline std::optional<credential_source> static_keys(const std::string& file, const std::string& profile, bool config) {
    const auto sections = config ? config_sections(profile) : std::vector<std::string>{profile};
    const ini_section s = read_ini(file, sections);
    if (s.get("aws_access_key_id").empty() || s.get("aws_secret_access_key").empty()) return std::nullopt;
    std::string name = file + " [" + profile + "]";
    return credential_source{name, [file, sections, name](std::stop_token) {
                                 const ini_section now = read_ini(file, sections);
                                 s3_credentials c{now.get("aws_access_key_id"), now.get("aws_secret_access_key"),
                                                  now.get("aws_session_token")};
                                 if (c.access_key.empty() || c.secret_key.empty())
                                     throw credentials_unavailable(name + " no longer holds aws_access_key_id and aws_secret_access_key,");
                                 return c;
                             }};
}

inline std::optional<credential_source> environment_keys() {
    const std::string key = env_or("AWS_ACCESS_KEY_ID"), secret = env_or("AWS_SECRET_ACCESS_KEY");
    if (key.empty() != secret.empty())
        throw credentials_unavailable(std::string("partial AWS credentials in the environment: ") +
                                      (key.empty() ? "AWS_SECRET_ACCESS_KEY is set, AWS_ACCESS_KEY_ID is not"
                                                   : "AWS_ACCESS_KEY_ID is set, AWS_SECRET_ACCESS_KEY is not") + ",");
    if (key.empty()) return std::nullopt;
    return credential_source{"the environment", [](std::stop_token) {
                                 return s3_credentials{env_or("AWS_ACCESS_KEY_ID"), env_or("AWS_SECRET_ACCESS_KEY"),
                                                       env_or("AWS_SESSION_TOKEN")};
                             }};
}

inline credential_source web_identity_source(const sts_endpoint& sts, const role_request& role, const std::string& token_file,
                                             const std::string& where) {
    std::string name = "web identity (" + where + ": role " + role.role_arn + ", token file " + token_file + ", STS at " +
                       source_error::redact(sts.url) + ")";
    return {name, [sts, role, token_file, name](std::stop_token stop) {
                return assume_role_with_web_identity(sts, role, token_file, name, std::move(stop));
            }};
}

inline credential_source container_source(const container_endpoint& c) {
    std::string name = "container credentials (" + c.shown + ")";
    return {name, [c, name](std::stop_token stop) { return container_credentials(c, name, std::move(stop)); }};
}

/// Instance metadata's role credentials; nothing when it does not answer (with why in
/// `why_not`). They are fetched here, to learn whether it answers: the source's first call
/// gives them, later ones ask again.
inline std::optional<credential_source> imds_source(const ini_section& conf, std::string* why_not, std::stop_token stop) {
    auto imds = std::make_shared<imds_client>(conf);
    auto first = imds->fetch(why_not, std::move(stop));
    if (!first) return std::nullopt;
    auto held = std::make_shared<std::optional<s3_credentials>>(std::move(first));
    return credential_source{imds->source(), [imds, held](std::stop_token stop) {
                                 if (*held) return *std::exchange(*held, std::nullopt);
                                 return *imds->fetch(nullptr, std::move(stop));
                             }};
}

/// The profile's source, in the CLI's order within a profile: an assumed role (role_arn,
/// from web_identity_token_file, source_profile or credential_source), the credentials
/// file's keys, credential_process, the config file's keys. Nothing when the profile has
/// none of these.
inline std::optional<credential_source> profile_source(const profile_view& p, const credential_inputs& in,
                                                       std::vector<std::string> visited) {
    const std::string where = "profile [" + p.name + "]";
    if (const std::string role_arn = p.get("role_arn"); !role_arn.empty()) {
        if (std::find(visited.begin(), visited.end(), p.name) != visited.end() || visited.size() > 4)
            throw credentials_unavailable(where + ": its source_profile chain loops or is deeper than 5 profiles,");
        visited.push_back(p.name);
        if (!p.get("mfa_serial").empty())
            throw credentials_unavailable(where + " assumes its role with an MFA code (mfa_serial), which a data loader "
                                                  "cannot ask for; export temporary keys to the environment instead,");
        const sts_endpoint sts = sts_endpoint_for(p.conf, p.get("region").empty() ? in.region : p.get("region"), in.o.ca_bundle);
        role_request role{role_arn, p.get("role_session_name"), p.get("external_id"), p.get("duration_seconds")};
        if (const auto wif = p.get("web_identity_token_file"); !wif.empty())
            return web_identity_source(sts, role, wif, where);
        std::optional<credential_source> base;
        const std::string src = p.get("source_profile"), cs = p.get("credential_source");
        if (!src.empty()) {
            if (src == p.name) {  // its own keys, as the CLI allows
                base = static_keys(in.cred_file, src, false);
                if (!base) base = static_keys(in.config_file, src, true);
            } else {
                base = profile_source({src, read_ini(in.cred_file, {src}), read_ini(in.config_file, config_sections(src))}, in,
                                      visited);
            }
            if (!base) throw credentials_unavailable(where + ": its source_profile [" + src + "] has no credentials,");
        } else if (cs == "Environment") {
            base = environment_keys();
            if (!base) throw credentials_unavailable(where + ": credential_source Environment, but AWS_ACCESS_KEY_ID is not set,");
        } else if (cs == "Ec2InstanceMetadata") {
            std::string why;
            base = imds_source(p.conf, &why, in.stop);
            if (!base) throw credentials_unavailable(where + ": credential_source Ec2InstanceMetadata, but no answer from " + why + ",");
        } else if (cs == "EcsContainer") {
            auto c = container_from_env();
            if (!c)
                throw credentials_unavailable(where + ": credential_source EcsContainer, but neither "
                                                      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI nor _FULL_URI is set,");
            base = container_source(*c);
        } else {
            throw credentials_unavailable(where + " has role_arn but " +
                                          (cs.empty() ? std::string("no source_profile, credential_source or web_identity_token_file")
                                                      : "credential_source " + cs + " (not Environment, Ec2InstanceMetadata or EcsContainer)") +
                                          ",");
        }
        std::string name = where + ": role " + role_arn + " assumed through STS at " + source_error::redact(sts.url) +
                           " with " + base->name;
        return credential_source{name, [sts, role, base = std::move(*base), name](std::stop_token stop) {
                                     return assume_role(sts, role, base.fetch(stop), name, stop);
                                 }};
    }
    if (auto s = static_keys(in.cred_file, p.name, false)) return s;
    if (const auto cmd = p.get("credential_process"); !cmd.empty()) {
        std::string name = "credential_process of " + where;
        return credential_source{name, [cmd, name](std::stop_token stop) { return run_credential_process(cmd, name, std::move(stop)); }};
    }
    return static_keys(in.config_file, p.name, true);
}

inline std::shared_ptr<credential_provider> resolve_credentials(const credential_inputs& in) {
    std::string looked;
    if (in.o.profile.empty()) {  // a profile named in the options wins over the environment's keys
        if (auto env = environment_keys())  // read once: the environment does not change under us
            return std::make_shared<credential_provider>(env->name, env->fetch({}));
        looked += "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, ";
    }
    // The environment's web identity, unless a profile is named in the options: the user
    // chose that profile, its own role or keys (or the steps after it) then serve.
    if (const auto token_file = env_or("AWS_WEB_IDENTITY_TOKEN_FILE"); !token_file.empty() && in.o.profile.empty()) {
        const std::string role = env_or("AWS_ROLE_ARN");
        if (role.empty()) throw credentials_unavailable("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not,");
        return provide(web_identity_source(sts_endpoint_for(in.conf, in.region, in.o.ca_bundle), {role, env_or("AWS_ROLE_SESSION_NAME"), {}, {}},
                                           token_file, "AWS_WEB_IDENTITY_TOKEN_FILE"),
                       in.stop);
    }
    looked += in.o.profile.empty() ? "AWS_WEB_IDENTITY_TOKEN_FILE (not set), " : "";
    if (auto s = profile_source({in.profile, in.creds, in.conf}, in, {})) return provide(std::move(*s), in.stop);
    auto place = [](const std::string& file, const ini_section& s, const std::string& section) {
        return file + " [" + section + "]" + (!s.file ? " (no such file)" : !s.found ? " (no such section)" : "");
    };
    looked += place(in.cred_file, in.creds, in.profile) + ", " +
              place(in.config_file, in.conf, in.profile == "default" ? in.profile : "profile " + in.profile) + ", ";
    if (auto c = container_from_env()) return provide(container_source(*c), in.stop);
    looked += "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/_FULL_URI not set), ";
    if (imds_client::disabled()) {
        looked += "instance metadata (AWS_EC2_METADATA_DISABLED)";
    } else {
        std::string why;
        if (auto s = imds_source(in.conf, &why, in.stop)) return provide(std::move(*s), in.stop);
        looked += "instance metadata (" + why + ")";
    }
    throw credentials_unavailable("no AWS credentials (looked in " + looked + "; for a public bucket use anonymous access)");
}

/// A credential source's failure as the error of the stage that needed it: `url` named,
/// permission_denied as its code.
[[noreturn]] inline void throw_for(const std::string& url, const credentials_unavailable& e) {
    throw source_error(url, std::string(e.what()) + " for", std::make_error_code(std::errc::permission_denied));
}

/// Resolves endpoint, region and credentials (see s3_options). `url` names the object in
/// the error thrown when no credentials are found (the message says where it looked).
inline s3_config resolve_s3(const s3_options& o, const std::string& url, std::stop_token stop = {}) {
    s3_config c;
    c.addressing = o.addressing;
    c.anonymous = o.anonymous;
    const std::string profile = !o.profile.empty() ? o.profile : env_or("AWS_PROFILE", "default");
    const std::string cred_file = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    const std::string config_file = home_file("AWS_CONFIG_FILE", "config");
    const ini_section creds = read_ini(cred_file, {profile});
    const ini_section conf = read_ini(config_file, config_sections(profile));
    if (c.addressing == s3_addressing::automatic) {
        const std::string style = lower(conf.get("s3.addressing_style"));
        if (style == "path") c.addressing = s3_addressing::path;
        else if (style == "virtual") c.addressing = s3_addressing::virtual_hosted;
    }
    c.ca_bundle = !o.ca_bundle.empty() ? o.ca_bundle : env_or("AWS_CA_BUNDLE", conf.get("ca_bundle"));

    c.region = !o.region.empty() ? o.region
                                 : env_or("AWS_REGION", env_or("AWS_DEFAULT_REGION", conf.get("region")));
    if (c.region.empty()) c.region = "us-east-1";

    std::string endpoint = !o.endpoint.empty() ? o.endpoint
                                               : env_or("AWS_ENDPOINT_URL_S3", env_or("AWS_ENDPOINT_URL", conf.get("endpoint_url")));
    if (endpoint.empty()) endpoint = "https://s3." + c.region + ".amazonaws.com";
    const auto p = endpoint.find("://");
    if (p == std::string::npos)
        throw source_error(url, "the S3 endpoint '" + endpoint + "' needs a scheme (http:// or https://), for");
    c.scheme = lower(endpoint.substr(0, p));
    endpoint.erase(0, p + 3);
    if (c.scheme != "http" && c.scheme != "https")
        throw source_error(url, "the S3 endpoint's scheme must be http or https, not '" + c.scheme + "', for");
    if (endpoint.find_first_of("@?#") != std::string::npos)  // not echoed: it may hold a password
        throw source_error(url, "the S3 endpoint must be scheme://host[:port][/path], without user, query or fragment, for");
    const auto slash = endpoint.find('/');
    c.host = endpoint.substr(0, slash);
    if (slash != std::string::npos) c.base_path = endpoint.substr(slash);
    while (!c.base_path.empty() && c.base_path.back() == '/') c.base_path.pop_back();
    if (c.host.empty()) throw source_error(url, "the S3 endpoint has no host, for");

    if (o.anonymous) return c;
    try {
        c.credentials = resolve_credentials({o, profile, cred_file, config_file, creds, conf, c.region, std::move(stop)});
    } catch (const credentials_unavailable& e) {
        throw_for(url, e);
    }
    return c;
}

/// Refreshes `c`'s credentials when they are due (blocking: call it off the I/O loop, and
/// cheaply first ask credential_provider::due). A source that fails once they expired
/// stops the stage with an error naming it and `url`.
inline void refresh_credentials(const s3_config& c, const std::string& url, std::stop_token stop = {}) {
    if (!c.credentials || !c.credentials->due()) return;
    try {
        c.credentials->refresh_if_due(std::move(stop));
    } catch (const credentials_unavailable& e) {
        throw_for(url, e);
    }
}

/// After S3 refused `refused` (refused_credentials): reads the source again, once; true
/// when the request is worth retrying with auth_of(c).
inline bool reread_credentials(const s3_config& c, const s3_auth& refused, const std::string& url, std::stop_token stop = {}) {
    if (!c.credentials) return false;
    try {
        return c.credentials->reread_after_refusal({refused.access_key, refused.secret_key, refused.session_token},
                                                   std::move(stop));
    } catch (const credentials_unavailable& e) {
        throw_for(url, e);
    }
}

}  // namespace sluice::detail
