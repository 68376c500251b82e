#pragma once
// Record counters of the formats (see core/detail/shard_counting.hpp): each walks a
// shard by offset and counts what its decoder would number, reading only what locates
// the records: tar headers (and the GNU long names and pax headers a WebDataset key
// needs), TFRecord's length and its checksum, RecordIO's part headers. Lines reads every
// byte; raw reads none. A shard the decoder would call corrupt is an error here too,
// naming the shard and the byte offset: counts that do not hold would misplace every rank.

#include <sluice/core/detail/shard_counting.hpp>
#include <sluice/core/record.hpp>
#include <sluice/formats/crc32c.hpp>
#include <sluice/formats/detail/gzip_inflater.hpp>
#include <sluice/formats/detail/recordio_parser.hpp>
#include <sluice/formats/detail/tar_parser.hpp>

#include <cstring>
#include <string>

namespace sluice::detail {

[[noreturn]] inline void uncountable(const shard_reader& r, const std::string& what, std::uint64_t offset) {
    throw source_error(r.url(), "cannot count records: " + what + " in", {}, offset);
}

/// A gzip'd shard cannot be walked by offset: counting it means inflating all of it, which
/// is a first epoch's read. Refused, with what to do instead.
inline void refuse_gzip(shard_reader& r, compression mode) {
    if (mode == compression::none) return;
    const bool named = r.url().ends_with(".gz");
    const std::byte* m = r.size() >= 2 ? r.at(0, 2) : nullptr;
    const bool magic = m && m[0] == std::byte{0x1f} && m[1] == std::byte{0x8b};
    if (named || magic || mode == compression::gzip)
        throw source_error(r.url(), "cannot count the records of a gzip'd shard without inflating all of it; pass "
                           "plan_options::counts (sluice-probe --write-counts makes them once):",
                           std::make_error_code(std::errc::not_supported));
}

/// tar (`samples` false: regular files) or WebDataset (`samples` true: runs of files with
/// the same key, files without an extension ignored), as tar_parser and webdataset_parser
/// number them.
inline std::uint64_t count_tar(shard_reader& r, bool samples) {
    std::uint64_t files = 0, groups = 0, off = 0;
    std::string long_name, pax_path, open_key, key, ext;
    std::uint64_t pax_size = 0;
    bool has_pax_size = false, have_open = false;
    auto body = [&](std::uint64_t at, std::uint64_t size) {
        if (size > (1u << 20)) uncountable(r, "tar extension header of " + std::to_string(size) + " bytes", at);
        const std::byte* b = r.at(at + tar_block, static_cast<std::size_t>(size));
        if (!b) uncountable(r, "truncated tar archive (the shard ends inside an extension header)", at);
        return std::string_view(reinterpret_cast<const char*>(b), static_cast<std::size_t>(size));
    };
    while (off < r.size()) {
        const std::byte* h = r.at(off, tar_block);
        if (!h) uncountable(r, "truncated tar archive (the shard ends inside a header)", off);
        if (all_zero(h, tar_block)) {
            off += tar_block;
            continue;
        }
        std::uint64_t size = 0;
        if (!tar_checksum_ok(h)) uncountable(r, "bad tar header checksum", off);
        if (!tar_number(h + 124, 12, size) || size >= (std::uint64_t{1} << 62)) uncountable(r, "bad tar header (size field)", off);
        const char type = static_cast<char>(h[156]);
        std::string name = tar_string(h, 100);
        if (std::memcmp(h + 257, "ustar\0", 6) == 0)
            if (std::string prefix = tar_string(h + 345, 155); !prefix.empty()) name = prefix + "/" + name;
        if (type == 'L' || type == 'x') {
            const auto s = body(off, size);
            if (type == 'L') {
                long_name = std::string(s.substr(0, s.find('\0')));
            } else {  // pax records "LEN KEY=VALUE\n": path and size matter here
                for (std::string_view rest = s; !rest.empty() && rest.front() != '\0';) {
                    std::size_t len = 0, i = 0;
                    while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9' && len < rest.size())
                        len = len * 10 + static_cast<std::size_t>(rest[i++] - '0');
                    if (i == 0 || i >= rest.size() || rest[i] != ' ' || len <= i + 1 || len > rest.size() || rest[len - 1] != '\n')
                        uncountable(r, "bad pax extended header", off);
                    const std::string_view kv = rest.substr(i + 1, len - i - 2);
                    if (kv.starts_with("path=")) pax_path = std::string(kv.substr(5));
                    if (kv.starts_with("size=")) {
                        const std::string_view v = kv.substr(5);
                        std::uint64_t n = 0;
                        bool ok = !v.empty() && v.size() < 20;
                        for (char c : v) ok = ok && c >= '0' && c <= '9', n = n * 10 + static_cast<unsigned>(c - '0');
                        if (!ok) uncountable(r, "bad pax size", off);
                        pax_size = n;
                        has_pax_size = true;
                    }
                    rest.remove_prefix(len);
                }
            }
        } else if (type != 'K' && type != 'g') {
            if (!long_name.empty()) name = std::move(long_name);
            if (!pax_path.empty()) name = std::move(pax_path);
            if (has_pax_size) size = pax_size;
            long_name.clear(), pax_path.clear(), has_pax_size = false;
            const bool regular = type == '0' || type == '7' || (type == '\0' && (name.empty() || name.back() != '/'));
            if (regular) {
                ++files;
                if (samples && webdataset_key(name, key, ext) && !(have_open && key == open_key)) {
                    ++groups;
                    open_key = key;
                    have_open = true;
                }
            }
        }
        const std::uint64_t next = off + tar_block + size + (tar_block - size % tar_block) % tar_block;
        if (next > r.size()) uncountable(r, "truncated tar archive (the shard ends inside a member)", off);
        off = next;
    }
    return samples ? groups : files;
}

/// TFRecord: [uint64 length][uint32 masked crc32c(length)][data][uint32 crc], walked by
/// its lengths (each length's checksum checked under `verify`; the data's is the
/// decoder's to check).
inline std::uint64_t count_tfrecord(shard_reader& r, bool verify) {
    std::uint64_t n = 0, off = 0;
    while (off < r.size()) {
        const std::byte* h = r.at(off, 12);
        if (!h) uncountable(r, "truncated TFRecord (the shard ends inside a record)", off);
        const std::uint64_t len = le64(h);
        if (verify && crc32c_mask(crc32c(h, 8)) != le32(h + 8)) uncountable(r, "bad TFRecord length checksum", off);
        if (len > r.size() - off || r.size() - off - len < 16)
            uncountable(r, "truncated TFRecord (the shard ends inside a record)", off);
        off += 12 + len + 4;
        ++n;
    }
    return n;
}

/// RecordIO: whole records (cflag 0) and the first parts of split ones (cflag 1).
inline std::uint64_t count_recordio(shard_reader& r) {
    std::uint64_t n = 0, off = 0;
    while (off < r.size()) {
        const std::byte* h = r.at(off, 8);
        if (!h) uncountable(r, "truncated RecordIO record (the shard ends inside a part)", off);
        if (le32(h) != recordio_magic) uncountable(r, "bad RecordIO magic", off);
        const std::uint32_t lrec = le32(h + 4), cflag = lrec >> 29, len = lrec & ((1u << 29) - 1);
        if (cflag > 3) uncountable(r, "bad RecordIO continuation flag " + std::to_string(cflag), off);
        if (cflag == 0 || cflag == 1) ++n;
        const std::uint64_t next = off + 8 + len + (4 - len % 4) % 4;
        if (next > r.size()) uncountable(r, "truncated RecordIO record (the shard ends inside a part)", off);
        off = next;
    }
    return n;
}

/// Lines: every '\n', and a last line without one.
inline std::uint64_t count_lines(shard_reader& r) {
    constexpr std::size_t step = 1u << 20;
    std::uint64_t n = 0, off = 0;
    bool open = false;
    while (off < r.size()) {
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(step, r.size() - off));
        const char* p = reinterpret_cast<const char*>(r.at(off, len));
        for (const char *q = p, *end = p + len; (q = static_cast<const char*>(std::memchr(q, '\n', static_cast<std::size_t>(end - q))));
             ++q)
            ++n;
        open = p[len - 1] != '\n';
        off += len;
    }
    return n + (open ? 1 : 0);
}

}  // namespace sluice::detail
