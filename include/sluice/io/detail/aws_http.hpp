#pragma once
// The small blocking requests to AWS and its kin (S3 listings, STS, instance metadata,
// container credentials) and how their error replies read: S3's and STS's XML, parsed
// namespace-agnostic with pugixml.

#include <sluice/io/detail/curl_global.hpp>
#include <sluice/io/detail/s3_sign.hpp>

#include <curl/curl.h>
#include <pugixml.hpp>

#include <cstddef>
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

/// The <Error> element of an error reply: S3's (the root), STS's (in <ErrorResponse>) or
/// moto's STS's (in <ErrorResponse><Errors>).
inline pugi::xml_node xml_error_of(const pugi::xml_document& doc) {
    const auto root = doc.document_element();
    if (local_name_is(root, "Error")) return root;
    if (!local_name_is(root, "ErrorResponse")) return {};
    if (auto e = xml_child(root, "Error")) return e;
    return xml_child(xml_child(root, "Errors"), "Error");
}

/// An S3 or STS error reply's body → "Code: Message (RequestId R)"; empty when it is not
/// one. Other elements (StringToSign, CanonicalRequest, AWSAccessKeyId...) are left out.
/// A body cut short (only its start is kept) still gives what was parsed before the cut.
inline std::string s3_error_text(std::string_view body) {
    pugi::xml_document doc;
    if (body.empty()) return {};
    (void)doc.load_buffer(body.data(), body.size());
    const auto err = xml_error_of(doc);
    if (!err) return {};
    std::string code = xml_child(err, "Code").text().get();
    std::string msg = xml_child(err, "Message").text().get();
    std::string id = xml_child(err, "RequestId").text().get();
    if (id.empty()) id = xml_child(doc.document_element(), "RequestId").text().get();  // STS's
    std::string s = code;
    if (!msg.empty()) s += (s.empty() ? "" : ": ") + msg;
    if (!id.empty()) s += " (RequestId " + id + ")";
    return s;
}

/// An error reply's code alone ("ExpiredToken"); empty when the body is not one.
inline std::string s3_error_code(std::string_view body) {
    pugi::xml_document doc;
    if (body.empty()) return {};
    (void)doc.load_buffer(body.data(), body.size());
    return xml_child(xml_error_of(doc), "Code").text().get();
}

/// Codes with which S3 refuses credentials that a fresh read of their source may mend:
/// temporary ones that expired or were rotated (see credential_provider).
inline bool refused_credentials(std::string_view code) {
    return code == "ExpiredToken" || code == "InvalidAccessKeyId" || code == "InvalidToken" ||
           code == "TokenRefreshRequired" || code == "ExpiredTokenException";
}

/// What a blocking GET returned.
struct s3_reply {
    CURLcode result = CURLE_OK;
    long status = 0;
    std::string body;
    std::string headers;  // the response's header lines, as received (the last response's after redirects too)
    char errbuf[CURL_ERROR_SIZE] = {};
};

/// A blocking request for small replies (listings, credentials).
struct blocking_request {
    std::string method = "GET";  // GET, PUT or POST
    std::string url;
    std::vector<std::string> headers = {};  // "Name: value"
    std::string body = {};                  // PUT and POST: sent with its Content-Length
    s3_auth auth = {};                      // SigV4 (auth.service), or nothing
    std::string ca_file = {};
    long timeout_ms = 60000;
    long connect_timeout_ms = 0;  // 0: curl's
    long stall_seconds = 0;       // no byte for this long fails it (0: only timeout_ms)
    bool no_proxy = false;        // link-local and loopback credential endpoints
    bool verify_tls = true;
    long max_redirects = 0;  // redirects followed (0: none)
    std::stop_token stop = {};
};

/// Performs `q` into `r`. A stop (q.stop) aborts it within about a second
/// (CURLE_ABORTED_BY_CALLBACK). `reuse`: an easy handle to reset and perform on (it keeps
/// its connections for the next request); by default a fresh one.
inline void blocking_call(const blocking_request& q, s3_reply& r, CURL* reuse = nullptr) {
    CURL* e = reuse ? reuse : curl_easy();
    if (!e) {
        r.result = CURLE_OUT_OF_MEMORY;
        return;
    }
    if (reuse) curl_easy_reset(e);
    curl_slist* headers = nullptr;
    std::string sigv4;
    curl_easy_setopt(e, CURLOPT_URL, q.url.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r.errbuf);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, q.timeout_ms);
    if (q.connect_timeout_ms) curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, q.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, q.stall_seconds > 0 ? 1L : 0L);  // reset on a reused handle too
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, q.stall_seconds > 0 ? q.stall_seconds : 0L);
    if (q.no_proxy) curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    if (!q.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, q.ca_file.c_str());
    if (q.max_redirects > 0) {
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, q.max_redirects);
    }
    if (!q.verify_tls) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (q.method != "GET") {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, q.body.c_str());
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body.size()));
        if (q.method != "POST") curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, q.method.c_str());
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* ud) {
        auto& body = *static_cast<std::string*>(ud);
        if (body.size() + s * n > (16u << 20)) return std::size_t{0};  // not a small reply: fail it
        body.append(p, s * n);
        return s * n;
    });
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* ud) {
        auto& h = *static_cast<std::string*>(ud);
        if (h.size() < (64u << 10)) h.append(p, s * n);
        return s * n;
    });
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &r.headers);
    std::stop_token stop = q.stop;
    if (stop.stop_possible()) {  // curl asks at least once a second, also while it waits
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, &stop);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION,
                         +[](void* ud, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
                             return static_cast<std::stop_token*>(ud)->stop_requested() ? 1 : 0;
                         });
    }
    for (const auto& h : q.headers) headers = curl_slist_append(headers, h.c_str());
    s3_sign(e, headers, q.auth, sigv4);
    if (headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    r.result = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    if (reuse) curl_easy_reset(e);  // it pointed at this call's buffers and headers
    else curl_easy_cleanup(e);
    curl_slist_free_all(headers);
}

/// A blocking GET for small replies (listings), signed per `a`.
inline void s3_get(const std::string& url, const s3_auth& a, s3_reply& r, const std::string& ca_file = {},
                   long timeout_s = 60, std::stop_token stop = {}) {
    blocking_call({.url = url, .auth = a, .ca_file = ca_file, .timeout_ms = timeout_s * 1000, .stop = std::move(stop)}, r);
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

}  // namespace sluice::detail
