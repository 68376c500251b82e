#pragma once
// sluice::list: the first stage: turns patterns into the paths or URLs to read.

#include <sluice/core/error.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/io/detail/braces.hpp>

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace sluice {

namespace detail {
inline bool has_scheme(std::string_view s) {
    const auto p = s.find("://");
    return p != std::string_view::npos && p > 0 && s.substr(0, p).find('/') == std::string_view::npos;
}
inline bool has_wildcard(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

inline void expand_local(const std::string& path, std::vector<std::string>& out) {
    std::error_code ec;
    if (has_wildcard(path)) {
        glob_t g{};
        const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
        if (rc == GLOB_NOMATCH) {
            globfree(&g);
            throw source_error(path, "no file matches", std::make_error_code(std::errc::no_such_file_or_directory));
        }
        if (rc != 0) {
            globfree(&g);
            throw source_error(path, "cannot expand", std::make_error_code(std::errc::io_error));
        }
        for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
        globfree(&g);
        return;
    }
    if (std::filesystem::is_directory(path, ec)) {
        // A directory stands for the regular files below it, in sorted order.
        std::vector<std::string> files;
        for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
             !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
            if (it->is_regular_file(ec)) files.push_back(it->path().string());
        if (ec) throw source_error(path, "cannot list directory", ec);
        std::sort(files.begin(), files.end());
        out.insert(out.end(), files.begin(), files.end());
        return;
    }
    out.push_back(path);  // existence is checked when it is read, with the path named
}
}  // namespace detail

/// Expand patterns eagerly: braces everywhere; for local paths also globs (`*`, `?`,
/// `[...]`, sorted) and directories (their regular files, recursively, sorted).
/// `file://` prefixes are dropped; other URLs (http://, s3://) get brace expansion only.
/// Throws sluice::source_error naming the pattern when a glob matches nothing.
inline std::vector<std::string> expand(const std::vector<std::string>& patterns) {
    std::vector<std::string> out;
    for (const auto& p : patterns) {
        for (auto& e : detail::expand_braces(p)) {
            if (e.rfind("file://", 0) == 0) e.erase(0, 7);
            if (detail::has_scheme(e)) out.push_back(std::move(e));
            else detail::expand_local(e, out);
        }
    }
    return out;
}

/// Takes: patterns (paths, globs, brace ranges like `shard-{000..127}.tar`, directories,
/// URLs). Gives: one path or URL per item, in pattern order.
/// Backpressure: suspends while downstream is full.
/// Errors: a glob that matches nothing is sent downstream as sluice::source_error naming
/// the pattern.
/// Cancellation: stops at the next send.
/// Example: `sluice::list({"data/shard-{000..063}.txt"}) | sluice::plan({.epochs = 2})`
inline source<std::string> list(std::vector<std::string> patterns) {
    auto pats = std::make_shared<const std::vector<std::string>>(std::move(patterns));
    return make_stage<void, std::string>(
        "list", {.on = pool::io, .buffer = {1024, 0}},
        [pats](stage_context<void, std::string>& ctx) -> task<void> {
            for (auto& path : expand(*pats)) co_await ctx.out.send(std::move(path));
        });
}
inline source<std::string> list(std::string pattern) {
    return list(std::vector<std::string>{std::move(pattern)});
}

}  // namespace sluice
