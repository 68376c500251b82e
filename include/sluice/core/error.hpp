#pragma once
// sluice::error: what the library throws and sends downstream in-band. The message names
// what failed and where (path or URL, byte offset, status); credentials never appear.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sluice {

class error : public std::runtime_error {
public:
    explicit error(const std::string& what, std::error_code code = {})
        : std::runtime_error(what), code_(code) {}
    /// The underlying condition: an errno (std::generic_category), a CURLcode
    /// (sluice::curl_category), an HTTP status (sluice::http_category), a zlib code
    /// (sluice::zlib_category) or a CUDA error (sluice::cuda_category).
    std::error_code code() const noexcept { return code_; }

protected:
    void set_code(std::error_code c) noexcept { code_ = c; }

private:
    std::error_code code_;
};

/// A failure to read a source: names the path or URL and, where known, the byte offset.
class source_error : public error {
public:
    /// `where` qualifies the offset, e.g. "of the uncompressed stream".
    source_error(std::string url, const std::string& what, std::error_code code = {},
                 std::uint64_t offset = npos, const std::string& where = {})
        : error(format(url, what, code, offset, where), code), url_(redact(url)), offset_(offset) {}
    static constexpr std::uint64_t npos = ~std::uint64_t{0};
    /// The path or URL, redacted as in the message.
    const std::string& url() const noexcept { return url_; }
    std::uint64_t offset() const noexcept { return offset_; }
    /// The same error with `c` as its code; the message is unchanged (it already says
    /// what failed in words).
    source_error with_code(std::error_code c) const {
        source_error e = *this;
        e.set_code(c);
        return e;
    }

    /// The URL as messages show it: without user:password@ and without the query string
    /// (presigned URLs carry their signature there), so no credential reaches a log.
    static std::string redact(const std::string& url) {
        const auto scheme = url.find("://");
        if (scheme == std::string::npos) return url;  // a local path
        std::string out = url;
        const auto query = out.find('?', scheme + 3);
        if (query != std::string::npos) out = out.substr(0, query) + "?...";
        const auto host_end = out.find_first_of("/?", scheme + 3);
        const auto at = out.rfind('@', host_end == std::string::npos ? out.size() : host_end);
        if (at != std::string::npos && at > scheme) out.erase(scheme + 3, at - (scheme + 3) + 1);
        return out;
    }

private:
    static std::string format(const std::string& url, const std::string& what,
                              std::error_code code, std::uint64_t offset, const std::string& where) {
        std::string s = "sluice: " + what + " '" + redact(url) + "'";
        if (offset != npos) s += " at byte " + std::to_string(offset);
        if (offset != npos && !where.empty()) s += " " + where;
        if (code) s += ": " + code.message();
        return s;
    }
    std::string url_;
    std::uint64_t offset_;
};

namespace detail {
/// Thrown inside a stage worker when the pipeline stops under it (a send to a cancelled
/// channel, a cancelled turn, a stop during a transfer or a listing); the stage runner
/// treats it as a clean stop, not an error.
struct stopped {};
}  // namespace detail

}  // namespace sluice
