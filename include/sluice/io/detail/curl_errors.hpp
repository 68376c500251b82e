#pragma once
// Error categories of the network layer: curl's codes and HTTP statuses, so a caller can
// branch on `e.code()` (which failures are retried: io/detail/retry.hpp).

#include <curl/curl.h>

#include <string>
#include <system_error>

namespace sluice {

/// libcurl's CURLcode values: `e.code() == std::error_code(CURLE_COULDNT_CONNECT,
/// sluice::curl_category())` for a refused connection.
inline const std::error_category& curl_category() noexcept {
    struct category final : std::error_category {
        const char* name() const noexcept override { return "curl"; }
        std::string message(int c) const override { return curl_easy_strerror(static_cast<CURLcode>(c)); }
    };
    static const category c;
    return c;
}

/// HTTP status codes of a reply that failed (403, 404, 503...): `e.code().value()` is
/// the status when `e.code().category() == sluice::http_category()`.
inline const std::error_category& http_category() noexcept {
    struct category final : std::error_category {
        const char* name() const noexcept override { return "http"; }
        std::string message(int c) const override { return "HTTP status " + std::to_string(c); }
        std::error_condition default_error_condition(int c) const noexcept override {
            switch (c) {
            case 401:
            case 403: return std::errc::permission_denied;
            case 404: return std::errc::no_such_file_or_directory;
            case 408:
            case 504: return std::errc::timed_out;
            default: return {c, *this};
            }
        }
    };
    static const category c;
    return c;
}

namespace detail {
/// The code of a failed request: curl's when the transfer failed, else the HTTP status.
inline std::error_code request_code(CURLcode result, long status) {
    if (result != CURLE_OK) return {static_cast<int>(result), curl_category()};
    return {static_cast<int>(status), http_category()};
}
}  // namespace detail
}  // namespace sluice

namespace sluice::detail {


}  // namespace sluice::detail
