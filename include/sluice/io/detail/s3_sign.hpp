#pragma once
// Signing S3 requests: libcurl's CURLOPT_AWS_SIGV4 plus what curl 7.88 leaves out (the
// x-amz-content-sha256 header, the session token header). See io/s3.hpp.

#include <sluice/io/detail/s3_config.hpp>

#include <curl/curl.h>

#include <string>

namespace sluice::detail {

/// What one S3 (or STS) request needs beyond its URL: the parts of s3_config curl needs,
/// owned by the request. `s3` false: not an AWS request (nothing is set).
struct s3_auth {
    bool s3 = false;
    bool sign = false;
    std::string region = {}, access_key = {}, secret_key = {}, session_token = {};
    /// The x-amz-content-sha256 value: our S3 requests are GETs without a body. Other
    /// services (STS) go without the header: curl then signs the hash of the POST body.
    std::string payload_hash = "UNSIGNED-PAYLOAD";
    std::string service = "s3";
    std::string amz_date = {};  // tests: sign as of this time (YYYYMMDDTHHMMSSZ); else now
    std::string ca_bundle = {};
};

/// The signature of a request with `creds` in `region`, for `service`.
inline s3_auth auth_with(const s3_credentials& creds, const std::string& region, std::string service = "s3") {
    return {.s3 = true,
            .sign = true,
            .region = region,
            .access_key = creds.access_key,
            .secret_key = creds.secret_key,
            .session_token = creds.session_token,
            .service = std::move(service)};
}

/// The signature of a request now: the provider's current credentials.
inline s3_auth auth_of(const s3_config& c) {
    if (c.anonymous || !c.credentials) return {.s3 = true, .ca_bundle = c.ca_bundle};
    s3_auth a = auth_with(c.creds(), c.region);
    a.ca_bundle = c.ca_bundle;
    return a;
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
    sigv4_param = "aws:amz:" + a.region + ":" + a.service;
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4_param.c_str());  // copied by curl
    curl_easy_setopt(e, CURLOPT_USERNAME, a.access_key.c_str());
    curl_easy_setopt(e, CURLOPT_PASSWORD, a.secret_key.c_str());
    // curl 7.88 signs with the hash this header gives, and S3 requires the header.
    if (a.service == "s3") headers = curl_slist_append(headers, ("x-amz-content-sha256: " + a.payload_hash).c_str());
    if (!a.amz_date.empty()) headers = curl_slist_append(headers, ("x-amz-date: " + a.amz_date).c_str());
    if (!a.session_token.empty())
        headers = curl_slist_append(headers, ("x-amz-security-token: " + a.session_token).c_str());
}

}  // namespace sluice::detail
