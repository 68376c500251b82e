#pragma once
// S3 and S3-compatible stores (MinIO, Ceph RGW, GCS's XML API...): where `s3://bucket/key`
// lives (endpoint, region, addressing), who asks (credentials, found as the AWS CLI finds
// them), how requests are signed (SigV4 by libcurl, plus what curl 7.88 leaves out), and
// ListObjectsV2 for prefixes.
//
// Signing is libcurl's CURLOPT_AWS_SIGV4. What curl 7.88 lacks is the project's own and is
// tested against AWS's published examples (tests/unit/io/s3.cpp):
// - the `x-amz-content-sha256` header S3 requires (UNSIGNED-PAYLOAD: our requests are GETs
//   without a body, and curl takes the payload hash from this header);
// - a canonical query string: curl signs the query exactly as written, so it is written
//   sorted by name with every byte but the unreserved ones percent-encoded (s3_query);
// - the session token header (`x-amz-security-token`), which curl signs like any header.
//
// Credentials live in the request only: never in a URL, a message, a log or a counter.

#include <sluice/core/error.hpp>
#include <sluice/io/detail/curl_errors.hpp>

#include <curl/curl.h>
#include <pugixml.hpp>

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <mutex>
#include <random>
#include <string>
#include <stop_token>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace sluice {

/// How a bucket appears in request URLs: `https://bucket.host/key` (virtual-hosted, AWS's
/// default) or `https://host/bucket/key` (path style). `automatic` is virtual-hosted
/// except for IP-address and localhost endpoints and bucket names that are not valid host
/// names (dots, capitals, underscores), which get path style, as the AWS CLI does.
enum class s3_addressing { automatic, virtual_hosted, path };

/// Where S3 objects are and who reads them. Every field left empty is found the way the
/// AWS CLI finds it:
/// - endpoint: this, else `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
///   `endpoint_url`, else `https://s3.<region>.amazonaws.com`;
/// - region: this, else `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else
///   us-east-1;
/// - credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`),
///   else the profile in the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
///   default ~/.aws/credentials), else in the config file (`AWS_CONFIG_FILE`, default
///   ~/.aws/config). The profile is this, else `AWS_PROFILE`, else `default`; a profile
///   named here wins over the environment's keys (as `aws --profile` does).
/// - addressing: this, else the profile's `s3 =` / `addressing_style` (path, virtual);
/// - CA bundle for https: this, else `AWS_CA_BUNDLE`, the profile's `ca_bundle`, else the
///   system's (fetch_options::ca_file, when set, wins for objects).
/// Environment keys half set (an id without a secret) are an error, not skipped.
/// Credentials are read once per stage, when its first s3:// URL comes. Not read:
/// instance metadata (IMDS), container credentials, SSO, assume-role and
/// credential_process profiles; export their keys to the environment instead (and
/// restart before temporary ones expire: an ExpiredToken reply is not retried).
struct s3_options {
    std::string endpoint = {};
    std::string region = {};
    std::string profile = {};
    s3_addressing addressing = s3_addressing::automatic;
    /// No signature: for public buckets.
    bool anonymous = false;
    std::string ca_bundle = {};
};

namespace detail {

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

struct s3_credentials {
    std::string access_key, secret_key, session_token;
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
    s3_credentials creds;
    std::string where;  // where the credentials came from, for messages (never the values)
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

/// Resolves endpoint, region and credentials (see s3_options). `url` names the object in
/// the error thrown when no credentials are found (the message says where it looked).
inline s3_config resolve_s3(const s3_options& o, const std::string& url) {
    s3_config c;
    c.addressing = o.addressing;
    c.anonymous = o.anonymous;
    const std::string profile = !o.profile.empty() ? o.profile : env_or("AWS_PROFILE", "default");
    const std::string cred_file = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    const std::string config_file = home_file("AWS_CONFIG_FILE", "config");
    const ini_section creds = read_ini(cred_file, {profile});
    const ini_section conf = read_ini(config_file, profile == "default" ? std::vector<std::string>{"default", "profile default"}
                                                                        : std::vector<std::string>{"profile " + profile});
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

    if (o.anonymous) {
        c.where = "anonymous";
        return c;
    }
    auto from_section = [&](const ini_section& s, const std::string& file) {
        const std::string key = s.get("aws_access_key_id"), secret = s.get("aws_secret_access_key");
        if (key.empty() || secret.empty()) return false;
        c.creds = {key, secret, s.get("aws_session_token")};
        c.where = file + " [" + profile + "]";
        return true;
    };
    const std::string env_key = env_or("AWS_ACCESS_KEY_ID"), env_secret = env_or("AWS_SECRET_ACCESS_KEY");
    if (o.profile.empty() && env_key.empty() != env_secret.empty())
        throw source_error(url, std::string("partial AWS credentials in the environment: ") +
                                    (env_key.empty() ? "AWS_SECRET_ACCESS_KEY is set, AWS_ACCESS_KEY_ID is not"
                                                     : "AWS_ACCESS_KEY_ID is set, AWS_SECRET_ACCESS_KEY is not") +
                                    ", for",
                           std::make_error_code(std::errc::permission_denied));
    if (o.profile.empty() && !env_key.empty() && !env_secret.empty()) {
        c.creds = {env_key, env_secret, env_or("AWS_SESSION_TOKEN")};
        c.where = "the environment";
        return c;
    }
    if (from_section(creds, cred_file) || from_section(conf, config_file)) return c;
    std::string looked = o.profile.empty() ? "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, " : "";
    auto place = [](const std::string& file, const ini_section& s, const std::string& section) {
        return file + " [" + section + "]" + (!s.file ? " (no such file)" : !s.found ? " (no such section)" : "");
    };
    looked += place(cred_file, creds, profile) + ", " +
              place(config_file, conf, profile == "default" ? profile : "profile " + profile);
    throw source_error(url, "no AWS credentials (looked in " + looked + "; for a public bucket use anonymous access) for",
                       std::make_error_code(std::errc::permission_denied));
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

/// What one S3 request needs beyond its URL: the parts of s3_config curl needs, owned by
/// the request. `s3` false: not an S3 request (nothing is set).
struct s3_auth {
    bool s3 = false;
    bool sign = false;
    std::string region = {}, access_key = {}, secret_key = {}, session_token = {};
    /// The x-amz-content-sha256 value: our requests are GETs without a body.
    std::string payload_hash = "UNSIGNED-PAYLOAD";
    std::string amz_date = {};  // tests: sign as of this time (YYYYMMDDTHHMMSSZ); else now
    std::string ca_bundle = {};
};

inline s3_auth auth_of(const s3_config& c) {
    if (c.anonymous) return {.s3 = true, .ca_bundle = c.ca_bundle};
    return {.s3 = true,
            .sign = true,
            .region = c.region,
            .access_key = c.creds.access_key,
            .secret_key = c.creds.secret_key,
            .session_token = c.creds.session_token,
            .ca_bundle = c.ca_bundle};
}

/// Sets an easy handle up for S3: the path exactly as written (S3 keys may hold "/../"
/// and "/./", which curl would otherwise collapse, fetching another key), no redirects
/// (a signature does not survive a change of host, and the session token header would
/// follow it: S3's 301/307 replies become errors naming the code), and SigV4. Adds S3's
/// headers to `headers` (which the caller sets as CURLOPT_HTTPHEADER after and frees).
inline void s3_sign(CURL* e, curl_slist*& headers, const s3_auth& a, std::string& sigv4_param) {
    if (!a.s3) return;
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    if (!a.sign) return;
    sigv4_param = "aws:amz:" + a.region + ":s3";
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4_param.c_str());  // copied by curl
    curl_easy_setopt(e, CURLOPT_USERNAME, a.access_key.c_str());
    curl_easy_setopt(e, CURLOPT_PASSWORD, a.secret_key.c_str());
    // curl 7.88 signs with the hash this header gives, and S3 requires the header.
    headers = curl_slist_append(headers, ("x-amz-content-sha256: " + a.payload_hash).c_str());
    if (!a.amz_date.empty()) headers = curl_slist_append(headers, ("x-amz-date: " + a.amz_date).c_str());
    if (!a.session_token.empty())
        headers = curl_slist_append(headers, ("x-amz-security-token: " + a.session_token).c_str());
}

/// pugixml by local name: S3-compatible servers differ in namespaces (s3rver's is not
/// AWS's), so names are matched without their prefix.
inline bool local_name_is(const pugi::xml_node& n, std::string_view name) {
    std::string_view full = n.name();
    if (const auto colon = full.find(':'); colon != std::string_view::npos) full.remove_prefix(colon + 1);
    return full == name;
}
inline pugi::xml_node xml_child(const pugi::xml_node& parent, std::string_view name) {
    for (auto c : parent.children())
        if (c.type() == pugi::node_element && local_name_is(c, name)) return c;
    return {};
}

/// An S3 error reply's body → "Code: Message (RequestId R)"; empty when it is not one.
/// Other elements (StringToSign, CanonicalRequest, AWSAccessKeyId...) are left out.
/// A body cut short (only its start is kept) still gives what was parsed before the cut.
inline std::string s3_error_text(std::string_view body) {
    pugi::xml_document doc;
    if (body.empty()) return {};
    (void)doc.load_buffer(body.data(), body.size());
    const auto err = doc.document_element();
    if (!local_name_is(err, "Error")) return {};
    std::string code = xml_child(err, "Code").text().get();
    std::string msg = xml_child(err, "Message").text().get();
    std::string id = xml_child(err, "RequestId").text().get();
    std::string s = code;
    if (!msg.empty()) s += (s.empty() ? "" : ": ") + msg;
    if (!id.empty()) s += " (RequestId " + id + ")";
    return s;
}

/// One page of ListObjectsV2.
struct s3_page {
    std::vector<std::string> keys;
    bool truncated = false;
    std::string next_token;
};

/// Parses a ListObjectsV2 reply; nothing when it is not one.
inline std::optional<s3_page> parse_list_v2(std::string_view body) {
    pugi::xml_document doc;
    if (!doc.load_buffer(body.data(), body.size())) return std::nullopt;
    const auto root = doc.document_element();
    if (!local_name_is(root, "ListBucketResult")) return std::nullopt;
    s3_page p;
    for (auto c : root.children()) {
        if (c.type() != pugi::node_element) continue;
        if (local_name_is(c, "Contents")) p.keys.emplace_back(xml_child(c, "Key").text().get());
        else if (local_name_is(c, "IsTruncated")) p.truncated = std::string_view(c.text().get()) == "true";
        else if (local_name_is(c, "NextContinuationToken")) p.next_token = c.text().get();
    }
    return p;
}

/// What a blocking GET returned.
struct s3_reply {
    CURLcode result = CURLE_OK;
    long status = 0;
    std::string body;
    char errbuf[CURL_ERROR_SIZE] = {};
};

/// A blocking GET for small replies (listings), signed per `a`.
/// A stop (`stop`) aborts it within about a second (CURLE_ABORTED_BY_CALLBACK).
inline void s3_get(const std::string& url, const s3_auth& a, s3_reply& r, const std::string& ca_file = {},
                   long timeout_s = 60, std::stop_token stop = {}) {
    static const bool global = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
    (void)global;
    CURL* e = curl_easy_init();
    if (!e) {
        r.result = CURLE_OUT_OF_MEMORY;
        return;
    }
    curl_slist* headers = nullptr;
    std::string sigv4;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r.errbuf);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT, timeout_s);
    if (!ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, ca_file.c_str());
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* ud) {
        static_cast<std::string*>(ud)->append(p, s * n);
        return s * n;
    });
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r.body);
    if (stop.stop_possible()) {  // curl asks at least once a second, also while it waits
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, &stop);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION,
                         +[](void* ud, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
                             return static_cast<std::stop_token*>(ud)->stop_requested() ? 1 : 0;
                         });
    }
    s3_sign(e, headers, a, sigv4);
    if (headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    r.result = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    curl_easy_cleanup(e);
    curl_slist_free_all(headers);
}

/// Why a request failed: curl's reason, or "HTTP 403 SignatureDoesNotMatch: ...
/// (RequestId ...)" (S3 and friends say why in an XML body). Used for fetch and listing.
inline std::string request_failure(CURLcode result, const char* errbuf, long status, std::string_view body) {
    if (result != CURLE_OK) {
        std::string s = curl_easy_strerror(result);
        if (errbuf[0]) s += " (" + std::string(errbuf) + ")";
        return s;
    }
    std::string s = "HTTP " + std::to_string(status);
    if (auto x = s3_error_text(body); !x.empty()) s += " " + x;
    return s;
}

/// Lists `s3://bucket/prefix` (every key under the prefix, in S3's order: by UTF-8
/// bytes) with ListObjectsV2, page by page. When the key has a wildcard (`*`, `?`,
/// `[`), the listing is of the prefix before it and keys are kept when the whole key
/// matches (fnmatch, `*` crossing '/'). Keys ending in '/' (folder markers) are left out.
/// Transient failures (503 SlowDown, 500, connection errors) are retried `retries` times
/// with jittered backoff.
/// `max_keys` (0: the server's default, 1,000 on AWS) sets the page size (tests).
/// A stop (`stop`) ends it within about a second, with detail::stopped.
inline std::vector<std::string> s3_list(const s3_options& opts, const std::string& url, unsigned retries = 8,
                                        unsigned max_keys = 0, std::stop_token stop = {}) {
    auto loc = parse_s3_url(url);
    if (!loc) throw source_error(url, "not an s3://bucket/prefix URL:");
    const s3_config c = resolve_s3(opts, url);
    const auto wild = loc->key.find_first_of("*?[");
    const std::string pattern = wild == std::string::npos ? std::string() : loc->key;
    const std::string prefix = loc->key.substr(0, wild);
    std::vector<std::string> out;
    std::string token;
    std::minstd_rand jitter(std::random_device{}());
    const s3_auth auth = auth_of(c);
    for (;;) {
        std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"}};
        if (!prefix.empty()) q.emplace_back("prefix", prefix);
        if (!token.empty()) q.emplace_back("continuation-token", token);
        if (max_keys) q.emplace_back("max-keys", std::to_string(max_keys));
        const std::string http = s3_http_url(c, {loc->bucket, ""}, s3_query(std::move(q)));
        s3_reply r;
        for (unsigned attempt = 0;; ++attempt) {
            r = s3_reply{};
            s3_get(http, auth, r, auth.ca_bundle, 60, stop);
            if (stop.stop_requested()) throw stopped{};
            const bool ok = r.result == CURLE_OK && r.status == 200;
            const bool transient = r.result != CURLE_OK ? retryable_curl(r.result) : retryable_status(r.status);
            if (ok) break;
            if (!transient || attempt >= retries) {
                std::string what = request_failure(r.result, r.errbuf, r.status, r.body);
                if (transient) what += " after " + std::to_string(attempt + 1) + " attempts";
                throw source_error(url, "cannot list (" + what + ")");
            }
            const long long ceiling = std::min(5000LL, 100LL << std::min(attempt, 20u));
            std::mutex m;
            std::condition_variable_any cv;
            std::unique_lock lock(m);
            cv.wait_for(lock, stop, std::chrono::milliseconds(jitter() % static_cast<unsigned long long>(ceiling + 1)),
                        [] { return false; });  // a stop ends the backoff at once
            if (stop.stop_requested()) throw stopped{};
        }
        auto page = parse_list_v2(r.body);
        if (!page) throw source_error(url, "cannot list (the reply is not a ListObjectsV2 result)");
        for (auto& k : page->keys) {
            if (k.ends_with('/')) continue;
            if (!pattern.empty() && ::fnmatch(pattern.c_str(), k.c_str(), 0) != 0) continue;
            out.push_back("s3://" + loc->bucket + "/" + k);
        }
        if (!page->truncated) break;
        if (page->next_token.empty() || page->next_token == token)
            throw source_error(url, "cannot list (the reply is truncated but gives no new continuation token)");
        token = std::move(page->next_token);
    }
    if (!pattern.empty() && out.empty())
        throw source_error(url, "no object matches", std::make_error_code(std::errc::no_such_file_or_directory));
    return out;
}

}  // namespace detail
}  // namespace sluice
