#pragma once
// ListObjectsV2: its pages (parsed namespace-agnostic with pugixml) and the listing itself
// with its retries.

#include <sluice/core/error.hpp>
#include <sluice/io/detail/aws_credentials.hpp>
#include <sluice/io/detail/aws_http.hpp>
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
    const s3_config c = resolve_s3(opts, url, stop);
    const auto wild = loc->key.find_first_of("*?[");
    const std::string pattern = wild == std::string::npos ? std::string() : loc->key;
    const std::string prefix = loc->key.substr(0, wild);
    std::vector<std::string> out;
    std::string token;
    std::minstd_rand jitter(jitter_seed());
    bool reread = false;  // credentials read again after a refusal: once per listing
    for (;;) {
        std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"}};
        if (!prefix.empty()) q.emplace_back("prefix", prefix);
        if (!token.empty()) q.emplace_back("continuation-token", token);
        if (max_keys) q.emplace_back("max-keys", std::to_string(max_keys));
        const std::string http = s3_http_url(c, {loc->bucket, ""}, s3_query(std::move(q)));
        s3_reply r;
        for (unsigned attempt = 0;; ++attempt) {
            r = s3_reply{};
            refresh_credentials(c, url, stop);
            const s3_auth auth = auth_of(c);
            s3_get(http, auth, r, auth.ca_bundle, 60, stop);
            if (stop.stop_requested()) throw stopped{};
            const bool ok = r.result == CURLE_OK && r.status == 200;
            if (!ok && !reread && r.result == CURLE_OK && refused_credentials(s3_error_code(r.body))) {
                reread = true;
                if (reread_credentials(c, auth, url, stop)) {
                    --attempt;  // not one of the attempts (unsigned: the loop's ++ brings it back)
                    continue;
                }
            }
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
