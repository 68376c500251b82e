#pragma once
// sluice::list: the first stage: turns patterns into the paths or URLs to read.

#include <sluice/core/error.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/io/detail/braces.hpp>
#include <sluice/io/detail/s3_list.hpp>
#include <sluice/io/s3.hpp>

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stop_token>
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

inline void expand_local(const std::string& path, std::vector<std::string>& out);

// A directory stands for the regular files below it, in byte order; how many it added.
inline std::size_t expand_directory(const std::string& path, std::vector<std::string>& out) {
    std::error_code ec;
    std::vector<std::string> files;
    std::filesystem::recursive_directory_iterator it(path, ec), end;
    for (; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) files.push_back(it->path().string());
    if (ec) throw source_error(it != end ? it->path().string() : path, "cannot list directory", ec);
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
    return files.size();
}

inline void expand_local(const std::string& path, std::vector<std::string>& out) {
    std::error_code ec;
    if (has_wildcard(path)) {
        // Sorted by bytes, not by the locale's collation: every rank must list the same
        // order, whatever LC_COLLATE its node has, or plan's rank split breaks.
        thread_local std::string failed_path;
        thread_local int failed_errno = 0;
        failed_errno = 0;
        glob_t g{};
        const int rc = ::glob(path.c_str(), GLOB_ERR | GLOB_NOSORT,
                              [](const char* p, int e) {
                                  failed_path = p;
                                  failed_errno = e;
                                  return 1;
                              },
                              &g);
        std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
        globfree(&g);
        if (rc == GLOB_NOMATCH)
            throw source_error(path, "no file matches", std::make_error_code(std::errc::no_such_file_or_directory));
        if (rc != 0) {
            if (failed_errno) throw source_error(failed_path, "cannot list directory", {failed_errno, std::generic_category()});
            throw source_error(path, "cannot expand", std::make_error_code(std::errc::io_error));
        }
        std::sort(matches.begin(), matches.end());
        // A matched directory stands for its files; an empty one adds none, and is an
        // error only when the whole pattern then gives no file.
        std::size_t added = 0;
        for (auto& m : matches) {
            if (std::filesystem::is_directory(m, ec)) {
                added += expand_directory(m, out);
            } else {
                out.push_back(std::move(m));
                ++added;
            }
        }
        if (added == 0)
            throw source_error(path, "no file matches (only empty directories)",
                               std::make_error_code(std::errc::no_such_file_or_directory));
        return;
    }
    // Like a glob that matches nothing, a directory with no file is a mistake (a wrong
    // path, a download that has not happened), not zero samples and success.
    if (std::filesystem::is_directory(path, ec)) {
        if (expand_directory(path, out) == 0)
            throw source_error(path, "no file in directory", std::make_error_code(std::errc::no_such_file_or_directory));
        return;
    }
    out.push_back(path);  // existence is checked when it is read, with the path named
}
}  // namespace detail

/// Expand patterns eagerly: braces everywhere; for local paths also globs (`*`, `?`,
/// `[...]`, sorted by bytes) and directories, named or matched (their regular files,
/// recursively, sorted by bytes).
/// `file://` prefixes are dropped; http:// URLs get brace expansion only.
/// `s3://bucket/key` is one object; `s3://bucket/prefix/` (a trailing '/') and
/// `s3://bucket` stand for every object under the prefix, listed with ListObjectsV2 (in
/// S3's byte order); `s3://bucket/prefix/shard-*.tar` lists the prefix before the first
/// wildcard and keeps the keys the pattern matches (`*` crosses '/'). A listing that
/// finds nothing is an error, as a glob that matches nothing is. `s3` says where and as
/// whom (see s3_options).
/// `@FILE` reads patterns from FILE, one per line (blank lines and `#` comments skipped),
/// each expanded as above: a list of URLs or paths kept beside the dataset.
/// Throws sluice::source_error naming the pattern when a glob matches nothing (or only
/// empty directories), the directory when a named directory holds no regular file, or
/// the file when a list file cannot be read: an empty listing is never 0 items.
/// A stop (`stop`) ends an S3 listing within about a second (detail::stopped).
inline std::vector<std::string> expand(const std::vector<std::string>& patterns, const s3_options& s3 = {},
                                       int depth = 0, std::stop_token stop = {}) {
    std::vector<std::string> out;
    for (const auto& p : patterns) {
        if (p.starts_with("@")) {
            const std::string file = p.substr(1);
            if (depth >= 8) throw source_error(file, "list files nested too deep (a loop?) at");
            errno = 0;
            std::ifstream in(file);
            if (!in)
                throw source_error(file, "cannot read the list file",
                                   errno ? std::error_code(errno, std::generic_category())
                                         : std::make_error_code(std::errc::no_such_file_or_directory));
            // Relative local entries are relative to the list file, as beside a dataset.
            const auto dir = std::filesystem::path(file).parent_path();
            std::vector<std::string> listed;
            for (std::string line; std::getline(in, line);) {
                while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
                const auto start = line.find_first_not_of(" \t");
                if (start == std::string::npos || line[start] == '#') continue;
                std::string entry = line.substr(start);
                const bool local = !detail::has_scheme(entry) && !entry.starts_with("file://");
                if (local && !entry.starts_with("/") && !entry.starts_with("@") && !dir.empty())
                    entry = (dir / entry).string();
                listed.push_back(std::move(entry));
            }
            for (auto& e : expand(listed, s3, depth + 1, stop)) out.push_back(std::move(e));
            continue;
        }
        for (auto& e : detail::expand_braces(p)) {
            if (e.rfind("file://", 0) == 0) e.erase(0, 7);
            if (auto loc = detail::parse_s3_url(e);
                loc && (loc->key.empty() || loc->key.ends_with('/') || detail::has_wildcard(loc->key))) {
                auto keys = detail::s3_list(s3, e, {}, 0, stop);
                if (keys.empty())
                    throw source_error(e, "no object under", std::make_error_code(std::errc::no_such_file_or_directory));
                for (auto& k : keys) out.push_back(std::move(k));
            } else if (detail::has_scheme(e)) out.push_back(std::move(e));
            else detail::expand_local(e, out);
        }
    }
    return out;
}

/// Takes: patterns (paths, globs, brace ranges like `shard-{000..127}.tar`, directories,
/// URLs, `@list-file`). Gives: one path or URL per item, in pattern order.
/// Backpressure: suspends while downstream is full.
/// Errors: a glob, directory or S3 listing that gives nothing, or a listing that fails
/// (HTTP 403 AccessDenied...), is sent downstream as sluice::source_error naming the
/// pattern or directory.
/// Cancellation: stops at the next send; a stop also ends an S3 listing page in flight
/// and its backoff (within about a second).
/// Example: `sluice::list({"data/shard-{000..063}.txt"}) | sluice::plan({.epochs = 2})`
template <class = void>  // compiled only where used (see make_stage)
source<std::string> list(std::vector<std::string> patterns, s3_options s3 = {}) {
    auto pats = std::make_shared<const std::vector<std::string>>(std::move(patterns));
    return make_stage<void, std::string>(
        // On the CPU pool: listing blocks (globs, directories, S3 pages), and the I/O
        // thread is what every fetch and read shares.
        "list", {.on = pool::cpu, .out = {1024, 0}},
        [pats, s3](stage_context<void, std::string>& ctx) -> task<void> {
            for (auto& path : expand(*pats, s3, 0, ctx.stop)) co_await ctx.out.send(std::move(path));
        });
}
template <class = void>  // compiled only where used (see make_stage)
source<std::string> list(std::string pattern, s3_options s3 = {}) {
    return list(std::vector<std::string>{std::move(pattern)}, std::move(s3));
}

}  // namespace sluice
