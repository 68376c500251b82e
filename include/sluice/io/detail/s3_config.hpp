#pragma once
// S3's URLs and settings: `s3://bucket/key`, SigV4's URI encoding and canonical query, and
// the endpoint, region, addressing and credentials resolved as the AWS CLI does (see
// s3_options in io/s3.hpp).

#include <sluice/core/error.hpp>
#include <sluice/io/s3.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::detail {


struct s3_location {
    std::string bucket, key;  // the key as written after the bucket (raw bytes, not encoded)
};

/// `s3://bucket/key` → bucket and key; nothing for other URLs or without a bucket.
inline std::optional<s3_location> parse_s3_url(std::string_view url) {
    if (!url.starts_with("s3://")) return std::nullopt;
    url.remove_prefix(5);
    const auto slash = url.find('/');
    s3_location l{std::string(url.substr(0, slash)), slash == std::string_view::npos ? "" : std::string(url.substr(slash + 1))};
    if (l.bucket.empty()) return std::nullopt;
    return l;
}

/// Percent-encodes every byte but A-Z a-z 0-9 - _ . ~ (and '/' when `keep_slash`), with
/// capital hex digits: SigV4's URI encoding, which S3 also expects in paths.
inline std::string s3_encode(std::string_view s, bool keep_slash) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(s.size());
    for (unsigned char c : s) {
        const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                           c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        if (plain) {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

/// A canonical query string: parameters sorted by encoded name (then value), names and
/// values encoded by s3_encode, `=` always present. curl 7.88 signs the query as written,
/// so only a query written this way signs correctly.
inline std::string s3_query(std::vector<std::pair<std::string, std::string>> params) {
    for (auto& [k, v] : params) {
        k = s3_encode(k, false);
        v = s3_encode(v, false);
    }
    std::sort(params.begin(), params.end());
    std::string q;
    for (const auto& [k, v] : params) {
        if (!q.empty()) q += '&';
        q += k;
        q += '=';
        q += v;
    }
    return q;
}

using wall_clock = std::chrono::system_clock;

struct s3_credentials {
    std::string access_key, secret_key, session_token;
    std::optional<wall_clock::time_point> expires = std::nullopt;  // none: they do not expire
};

/// Why a credential source gave nothing: names the source and the status or cause, never
/// a secret or a token. resolve_s3 and the stages turn it into a source_error naming the
/// object that needed the credentials.
struct credentials_unavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// The credentials one source of the chain gave (see io/detail/aws_credentials.hpp), kept
/// fresh. Temporary credentials are refreshed before they expire: 5 minutes before, or a
/// quarter of their lifetime when that is shorter (credentials that live seconds, as in
/// tests); until then the held ones stay in use. refresh_if_due() blocks on the source
/// (a network call for STS, containers and instance metadata), so the stages call it off
/// the I/O loop, and only when due() says so. While one thread refreshes, the others go
/// on with the held credentials unless those have expired. A source that fails while its
/// credentials are still valid is tried again later (counted in refresh_failures()); one
/// that fails after they expired throws credentials_unavailable.
/// Thread-safe.
class credential_provider {
public:
    using fetch_fn = std::function<s3_credentials(std::stop_token)>;  // a stop cuts its requests short
    /// `again`: fetches from the same source again; empty for credentials that cannot be
    /// re-read (the environment's, anonymous access).
    credential_provider(std::string source, s3_credentials first, fetch_fn again = {})
        : source_(std::move(source)), again_(std::move(again)), creds_(std::move(first)) {
        schedule(wall_clock::now(), creds_.expires, std::nullopt);
    }
    /// Which source won, in words (never a secret): shown in the stage's figures.
    const std::string& source() const noexcept { return source_; }
    s3_credentials current() const {
        std::lock_guard lock(m_);
        return creds_;
    }
    bool refreshable() const noexcept { return static_cast<bool>(again_); }
    /// Whether the held credentials are within their refresh margin (cheap).
    bool due(wall_clock::time_point now = wall_clock::now()) const noexcept {
        return now.time_since_epoch().count() >= refresh_at_.load(std::memory_order_relaxed);
    }
    /// Refreshes when due; see the class comment. `now`: tests give their own clock.
    void refresh_if_due(std::stop_token stop = {}, wall_clock::time_point now = wall_clock::now()) {
        if (!again_ || !due(now)) return;
        const auto failures_before = expired_failures_.load(std::memory_order_acquire);
        std::unique_lock busy(refresh_m_, std::try_to_lock);
        if (!busy.owns_lock()) {
            if (!expired(now)) return;  // another thread refreshes; the held ones still serve
            busy.lock();
            // That thread's refresh failed after expiry: its error, not another call to the
            // source (each may take seconds) by every thread that waited.
            if (expired_failures_.load(std::memory_order_acquire) != failures_before && last_failure_)
                std::rethrow_exception(last_failure_);
        }
        if (!due(now)) return;  // refreshed while this thread waited
        std::optional<wall_clock::time_point> before;
        {
            std::lock_guard lock(m_);
            before = creds_.expires;
        }
        try {
            replace(again_(stop), before, now);
        } catch (const credentials_unavailable&) {
            failures_.fetch_add(1, std::memory_order_relaxed);
            if (expired(now)) {
                last_failure_ = std::current_exception();
                expired_failures_.fetch_add(1, std::memory_order_release);
                retry_in(now, std::chrono::seconds(1));  // the next object asks again, not each part
                throw;
            }
            const auto left = *before - now;  // not expired: `before` is set
            retry_in(now, std::clamp<wall_clock::duration>(left / 4, std::chrono::milliseconds(200), std::chrono::seconds(30)));
        }
    }
    /// After a request was refused with `refused` (ExpiredToken, InvalidAccessKeyId...):
    /// reads the source again, once, unless another thread already replaced them. True
    /// when the credentials now differ from `refused` (the request is worth retrying).
    bool reread_after_refusal(const s3_credentials& refused, std::stop_token stop = {}) {
        if (!again_) return false;
        std::lock_guard busy(refresh_m_);
        {
            std::lock_guard lock(m_);
            if (!same(creds_, refused)) return true;
        }
        replace(again_(stop), std::nullopt, wall_clock::now());
        std::lock_guard lock(m_);
        return !same(creds_, refused);
    }
    std::uint64_t refreshes() const noexcept { return refreshes_.load(std::memory_order_relaxed); }
    std::uint64_t refresh_failures() const noexcept { return failures_.load(std::memory_order_relaxed); }

private:
    static bool same(const s3_credentials& a, const s3_credentials& b) {
        return a.access_key == b.access_key && a.secret_key == b.secret_key && a.session_token == b.session_token;
    }
    bool expired(wall_clock::time_point now) const {
        std::lock_guard lock(m_);
        return creds_.expires && now >= *creds_.expires;
    }
    void replace(s3_credentials fresh, std::optional<wall_clock::time_point> before, wall_clock::time_point now) {
        const auto expires = fresh.expires;
        {
            std::lock_guard lock(m_);
            creds_ = std::move(fresh);
        }
        refreshes_.fetch_add(1, std::memory_order_relaxed);
        schedule(now, expires, before);
    }
    /// When to refresh credentials that expire at `exp`; `before`: when the ones they
    /// replace expired.
    void schedule(wall_clock::time_point now, std::optional<wall_clock::time_point> exp,
                  std::optional<wall_clock::time_point> before) {
        if (!again_ || !exp) {
            refresh_at_.store(INT64_MAX, std::memory_order_relaxed);
            return;
        }
        const auto life = *exp - now;
        if (before && *exp <= *before && life > wall_clock::duration::zero()) {
            // The source gave the same credentials again (instance metadata rotates its own a
            // few minutes before they expire): ask again soon, not at every request.
            retry_in(now, std::clamp<wall_clock::duration>(life / 4, std::chrono::milliseconds(200), std::chrono::seconds(60)));
            return;
        }
        const wall_clock::duration margin = std::min<wall_clock::duration>(std::chrono::minutes(5), life / 4);
        refresh_at_.store((*exp - margin).time_since_epoch().count(), std::memory_order_relaxed);
    }
    void retry_in(wall_clock::time_point now, wall_clock::duration d) {
        refresh_at_.store((now + d).time_since_epoch().count(), std::memory_order_relaxed);
    }

    std::string source_;
    fetch_fn again_;
    mutable std::mutex m_;    // creds_
    std::mutex refresh_m_;    // one refresh at a time
    s3_credentials creds_;
    std::atomic<std::int64_t> refresh_at_{INT64_MAX};  // wall_clock ticks since the epoch
    std::atomic<std::uint64_t> refreshes_{0}, failures_{0};
    std::atomic<std::uint64_t> expired_failures_{0};  // refreshes that failed after expiry
    std::exception_ptr last_failure_;                  // the last of them (under refresh_m_)
};

/// Everything resolved: what one request needs.
struct s3_config {
    std::string ca_bundle;
    std::string scheme = "https";  // of the endpoint
    std::string host;              // with :port when given; IPv6 in brackets
    std::string base_path;         // the endpoint's own path, without a trailing '/'
    std::string region;
    s3_addressing addressing = s3_addressing::automatic;
    bool anonymous = false;
    /// Null for anonymous access. Shared: every copy of the config sees its refreshes.
    std::shared_ptr<credential_provider> credentials;
    /// The credentials now (empty for anonymous access).
    s3_credentials creds() const { return credentials ? credentials->current() : s3_credentials{}; }
    /// Where the credentials came from, for messages and figures (never the values).
    std::string where() const { return credentials ? credentials->source() : std::string("anonymous"); }
};

inline std::string env_or(const char* name, std::string fallback = {}) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::move(fallback);
}

/// One section of an AWS INI file (credentials or config) as key/value pairs; keys in
/// lower case, nested ones (`s3 =` then indented `addressing_style = path`) as
/// `s3.addressing_style`.
struct ini_section {
    bool file = false;   // the file could be read
    bool found = false;  // and has the section
    std::vector<std::pair<std::string, std::string>> values;
    std::string get(std::string_view k) const {
        for (const auto& [key, v] : values)
            if (key == k) return v;
        return {};
    }
};

inline std::string trim(std::string_view s) {
    const auto a = s.find_first_not_of(" \t\r");
    if (a == std::string_view::npos) return {};
    const auto b = s.find_last_not_of(" \t\r");
    return std::string(s.substr(a, b - a + 1));
}

inline std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

/// A section header's name: `[ name ]` (a comment may follow), `profile  x` → `profile x`.
inline std::string ini_header(std::string_view t) {
    const auto close = t.find(']');
    std::string name = trim(t.substr(1, close == std::string_view::npos ? std::string_view::npos : close - 1));
    if (name.starts_with("profile") && name.size() > 7 && (name[7] == ' ' || name[7] == '\t'))
        name = "profile " + trim(std::string_view(name).substr(8));
    return name;
}

/// Reads one section of an AWS INI file: `sections` lists the names it may go by (the
/// config file's default profile is `[default]` or `[profile default]`). Comments start
/// with # or ; at the start of a line.
inline ini_section read_ini(const std::string& path, const std::vector<std::string>& sections) {
    ini_section out;
    std::ifstream in(path);
    if (!in) return out;
    out.file = true;
    bool inside = false;
    std::string parent;  // the key of a nested block (`s3 =`)
    for (std::string line; std::getline(in, line);) {
        const std::string t = trim(line);
        if (t.empty() || t[0] == '#' || t[0] == ';') continue;
        if (t.front() == '[') {
            const std::string name = ini_header(t);
            inside = std::find(sections.begin(), sections.end(), name) != sections.end();
            if (inside) out.found = true;
            parent.clear();
            continue;
        }
        const auto eq = t.find('=');
        if (!inside || eq == std::string::npos) continue;
        std::string key = lower(trim(std::string_view(t).substr(0, eq)));
        std::string value = trim(std::string_view(t).substr(eq + 1));
        const bool nested = line[0] == ' ' || line[0] == '\t';
        if (!nested) {
            parent = value.empty() ? key : std::string();
            out.values.emplace_back(std::move(key), std::move(value));
        } else if (!parent.empty()) {
            out.values.emplace_back(parent + "." + key, std::move(value));
        }
    }
    return out;
}

inline std::string home_file(const char* env, const char* name) {
    std::string p = env_or(env);
    if (!p.empty()) return p;
    return env_or("HOME", ".") + "/.aws/" + name;
}

inline bool is_ip_or_localhost(std::string_view host) {
    if (host.starts_with("[")) return true;  // IPv6
    if (const auto colon = host.rfind(':'); colon != std::string_view::npos) host = host.substr(0, colon);
    if (host == "localhost") return true;
    return !host.empty() && host.find_first_not_of("0123456789.") == std::string_view::npos;
}

/// A bucket usable as a host name label over TLS: lower case, digits and '-', 3..63.
inline bool dns_compatible(std::string_view b) {
    if (b.size() < 3 || b.size() > 63 || b.front() == '-' || b.back() == '-') return false;
    return b.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string_view::npos;
}

/// The HTTP URL of `key` in `bucket` (key raw; encoded here), with an optional query
/// (already canonical: see s3_query).
inline std::string s3_http_url(const s3_config& c, const s3_location& l, std::string_view query = {}) {
    const bool path_style = c.addressing == s3_addressing::path ||
                            (c.addressing == s3_addressing::automatic &&
                             (is_ip_or_localhost(c.host) || !dns_compatible(l.bucket)));
    std::string url = c.scheme + "://";
    if (path_style) url += c.host + c.base_path + "/" + s3_encode(l.bucket, false) + "/";
    else url += l.bucket + "." + c.host + c.base_path + "/";
    url += s3_encode(l.key, true);
    if (!query.empty()) {
        url += '?';
        url += query;
    }
    return url;
}

}  // namespace sluice::detail
