#pragma once
// S3's URLs and settings: `s3://bucket/key`, SigV4's URI encoding and canonical query, and
// the endpoint, region, addressing and credentials resolved as the AWS CLI does (see
// s3_options in io/s3.hpp).

#include <sluice/core/error.hpp>
#include <sluice/io/s3.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
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

}  // namespace sluice::detail
