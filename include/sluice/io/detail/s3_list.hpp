#pragma once
// S3's XML (error replies, ListObjectsV2 pages, parsed namespace-agnostic with pugixml),
// the blocking GET listings use, and the listing itself with its retries.

#include <sluice/core/error.hpp>
#include <sluice/io/detail/curl_errors.hpp>
#include <sluice/io/detail/retry.hpp>
#include <sluice/io/detail/s3_sign.hpp>

#include <curl/curl.h>
#include <pugixml.hpp>

#include <fnmatch.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::detail {

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
/// Transient failures (503 SlowDown, 500, connection errors) are retried per `retry`
/// (detail::backoff_policy, the one fetch uses).
/// `max_keys` (0: the server's default, 1,000 on AWS) sets the page size (tests).
/// A stop (`stop`) ends it within about a second, with detail::stopped.
inline std::vector<std::string> s3_list(const s3_options& opts, const std::string& url, backoff_policy retry = {},
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
            if (!transient || attempt >= retry.retries) {
                std::string what = request_failure(r.result, r.errbuf, r.status, r.body);
                if (transient) what += " after " + std::to_string(attempt + 1) + " attempts";
                throw source_error(url, "cannot list (" + what + ")").with_code(request_code(r.result, r.status));
            }
            std::mutex m;
            std::condition_variable_any cv;
            std::unique_lock lock(m);
            cv.wait_for(lock, stop, retry.delay(attempt, jitter), [] { return false; });  // a stop ends it at once
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

}  // namespace sluice::detail
