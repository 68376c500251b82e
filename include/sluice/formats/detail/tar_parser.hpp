#pragma once
// POSIX tar, one shard: 512-byte headers, each followed by the member's data padded to 512.
// Understood: ustar (name + prefix), GNU long names and long links (typeflag 'L' / 'K',
// "././@LongLink"), pax extended headers ('x': path and size; 'g' global headers are
// read and ignored), base-256 sizes. Regular files ('0', '\0', '7') become records;
// directories, links, devices, FIFOs and GNU sparse files are skipped. A zero block ends
// the archive; anything after it must be zeros too.
// WebDataset grouping on top: consecutive files with the same key form a sample.

#include <sluice/formats/detail/cursor.hpp>

#include <cctype>
#include <string_view>

namespace sluice::detail {

inline constexpr std::size_t tar_block = 512;

struct tar_header {
    std::string name;
    std::uint64_t size = 0;
    char type = 0;
};

// A numeric field: octal digits (leading spaces or NULs allowed, ended by a space or NUL)
// or, with the top bit of the first byte set, a big-endian binary number (GNU, for sizes
// of 8 GiB and more). False when it is neither.
inline bool tar_number(const std::byte* f, std::size_t n, std::uint64_t& v) {
    const auto* u = reinterpret_cast<const unsigned char*>(f);
    v = 0;
    if (u[0] & 0x80u) {
        if (u[0] == 0xffu) return false;  // negative
        for (std::size_t i = 0; i < n; ++i) {
            const unsigned b = i == 0 ? (u[0] & 0x7fu) : u[i];
            if (v >> 56) return false;
            v = v << 8 | b;
        }
        return true;
    }
    std::size_t i = 0;
    while (i < n && (u[i] == ' ' || u[i] == 0)) ++i;
    if (i == n) return true;  // empty: zero
    bool digits = false;
    for (; i < n && u[i] >= '0' && u[i] <= '7'; ++i) {
        if (v >> 60) return false;
        v = v * 8 + (u[i] - '0');
        digits = true;
    }
    for (; i < n; ++i)
        if (u[i] != ' ' && u[i] != 0) return false;
    return digits;
}

inline std::string tar_string(const std::byte* f, std::size_t n) {
    const char* s = reinterpret_cast<const char*>(f);
    return std::string(s, strnlen(s, n));
}

inline bool tar_checksum_ok(const std::byte* h) {
    std::uint64_t stored = 0;
    if (!tar_number(h + 148, 8, stored)) return false;
    std::uint64_t u = 0;
    std::int64_t s = 0;
    const auto* b = reinterpret_cast<const unsigned char*>(h);
    for (std::size_t i = 0; i < tar_block; ++i) {
        const bool in_field = i >= 148 && i < 156;
        u += in_field ? ' ' : b[i];
        s += in_field ? ' ' : static_cast<signed char>(b[i]);  // some old tars summed signed
    }
    return stored == u || static_cast<std::int64_t>(stored) == s;
}

inline bool all_zero(const std::byte* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        if (p[i] != std::byte{0}) return false;
    return true;
}

struct tar_parser : parser_base {
    enum class phase { header, body } at = phase::header;
    tar_header h;
    std::uint64_t header_offset = 0;
    std::uint64_t index = 0;  // ordinal of the regular file within the archive
    bool ended = false;       // a zero block was seen
    bool resyncing = false;
    std::string long_name;  // from a GNU 'L' member, for the next member
    std::string pax_path;   // from a pax 'x' header, for the next member
    std::uint64_t pax_size = 0;
    bool has_pax_size = false;
    bytes data;
    /// Where corruptions lost bytes, as the number of files the current parse() call had
    /// given out by then, and the lost member's path when known (WebDataset drops the
    /// samples they cut).
    struct loss {
        std::size_t at;
        std::string member;
    };
    std::vector<loss> losses;
    bool track_losses = false;  // only WebDataset reads them

    /// A corruption that loses bytes (`member`: the one lost, when its header was sound):
    /// reported (thrown under on_corrupt::error), then marked for the WebDataset grouping.
    void bad(const std::string& what, std::uint64_t offset, std::string member = {}) {
        parser_base::bad(what, offset);
        if (track_losses) losses.push_back({given ? given->size() : 0, std::move(member)});
    }

    void parse(std::vector<record>& out) {
        given = &out;
        struct unset {
            std::vector<record>*& g;
            ~unset() { g = nullptr; }
        } u{given};
        for (;;) {
            if (at == phase::header) {
                const std::byte* b = cur.peek(tar_block);
                if (!b) return;
                if (all_zero(b, tar_block)) {
                    if (!resyncing) ended = true;
                    cur.consume(tar_block);
                    continue;
                }
                if (!read_header(b)) {
                    cur.consume(tar_block);  // look for the next valid header, block by block
                    continue;
                }
                header_offset = cur.offset();
                cur.consume(tar_block);
                if (!wants_body()) {
                    skip_member();
                    continue;
                }
                at = phase::body;
            }
            if (!cur.take(static_cast<std::size_t>(h.size), data)) return;
            cur.consume(padding(h.size));
            at = phase::header;
            body(out);
        }
    }

    void reset() {
        at = phase::header;
        resyncing = false;
        ended = false;
        long_name.clear();
        clear_pax();
        data = {};
    }

    void finish(std::vector<record>& out) {
        given = &out;
        struct unset {
            std::vector<record>*& g;
            ~unset() { g = nullptr; }
        } u{given};
        if (resyncing) return;  // reported when it began
        if (at == phase::body)
            bad("truncated tar archive (the shard ends inside member '" + h.name + "')", header_offset);
        else if (cur.skipping())
            bad("truncated tar archive (the shard ends inside the data or padding of member '" + h.name + "')",
                header_offset);
        else if (!cur.empty())
            bad("truncated tar archive (the shard ends inside a header)", cur.offset());
    }

private:
    std::vector<record>* given = nullptr;  // parse()'s output, while it runs

    static std::uint64_t padding(std::uint64_t size) { return (tar_block - size % tar_block) % tar_block; }

    bool read_header(const std::byte* b) {
        std::uint64_t size = 0;
        const bool sum_ok = tar_checksum_ok(b);
        const bool size_ok = tar_number(b + 124, 12, size) && size < (std::uint64_t{1} << 62);
        if (!sum_ok || !size_ok) {
            if (!resyncing)
                bad(sum_ok ? "bad tar header (size field)" : "bad tar header checksum", cur.offset());
            resyncing = true;
            long_name.clear();
            clear_pax();
            return false;
        }
        if (ended) {
            // Reported, but nothing is lost: under skip the member is read.
            if (!resyncing) parser_base::bad("tar member after the end-of-archive marker", cur.offset());
            ended = false;  // under skip: read on, nothing is lost
        }
        resyncing = false;
        h.type = static_cast<char>(b[156]);
        h.size = size;
        const bool posix = std::memcmp(b + 257, "ustar\0", 6) == 0;  // not GNU's "ustar  "
        h.name = tar_string(b, 100);
        if (posix) {
            std::string prefix = tar_string(b + 345, 155);
            if (!prefix.empty()) h.name = prefix + "/" + h.name;
        }
        if (h.type == 'L' || h.type == 'K' || h.type == 'x' || h.type == 'g') return true;
        // An ordinary member: the overrides of the extension headers before it apply.
        if (!long_name.empty()) h.name = std::move(long_name);
        if (!pax_path.empty()) h.name = std::move(pax_path);
        if (has_pax_size) h.size = pax_size;
        long_name.clear();
        clear_pax();
        return true;
    }

    void clear_pax() {
        pax_path.clear();
        has_pax_size = false;
        pax_size = 0;
    }

    bool regular() const {
        // '\0' is the pre-POSIX regular file, and a name ending in '/' was its directory.
        return h.type == '0' || h.type == '7' || (h.type == '\0' && (h.name.empty() || h.name.back() != '/'));
    }

    bool wants_body() {
        if (h.type == 'L' || h.type == 'K' || h.type == 'x') {
            if (h.size > (1u << 20)) {  // names and pax records are small
                bad("tar extension header of " + std::to_string(h.size) + " bytes", header_offset);
                return false;
            }
            return true;
        }
        if (!regular()) return false;
        if (h.size > pol->max_record_bytes) {
            bad("tar member '" + h.name + "' of " + std::to_string(h.size) + " bytes" + over_limit(pol->max_record_bytes),
                header_offset, h.name);
            return false;
        }
        return true;
    }

    void skip_member() { cur.consume(h.size + padding(h.size)); }

    void body(std::vector<record>& out) {
        if (h.type == 'L' || h.type == 'x') data = readable(data);  // read here: not through a by-call mapping
        switch (h.type) {
        case 'L': {
            auto s = std::string_view(reinterpret_cast<const char*>(data.data()), data.size());
            long_name = std::string(s.substr(0, s.find('\0')));
            break;
        }
        case 'K':
            break;  // long link target: links are skipped
        case 'x':
            parse_pax();
            break;
        default: {
            record r{std::move(data), src, index++, header_offset + tar_block, h.name};
            out.push_back(std::move(r));
        }
        }
        data = {};
    }

    // Records "LEN KEY=VALUE\n", LEN counting the whole record in decimal.
    void parse_pax() {
        std::string_view s(reinterpret_cast<const char*>(data.data()), data.size());
        while (!s.empty() && s.front() != '\0') {
            std::size_t len = 0, i = 0;
            while (i < s.size() && s[i] >= '0' && s[i] <= '9' && len < s.size()) len = len * 10 + (s[i++] - '0');
            if (i == 0 || i >= s.size() || s[i] != ' ' || len <= i + 1 || len > s.size() || s[len - 1] != '\n') {
                bad("bad pax extended header", header_offset);
                clear_pax();
                return;
            }
            const std::string_view kv = s.substr(i + 1, len - i - 2);
            const std::size_t eq = kv.find('=');
            if (eq != std::string_view::npos) {
                const std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
                if (k == "path") {
                    pax_path = std::string(v);
                } else if (k == "size") {
                    std::uint64_t n = 0;
                    bool ok = !v.empty() && v.size() < 20;
                    for (char c : v) ok = ok && c >= '0' && c <= '9', n = n * 10 + static_cast<unsigned>(c - '0');
                    if (!ok) {
                        bad("bad pax size '" + std::string(v.substr(0, 32)) + "'", header_offset);
                        clear_pax();
                        return;
                    }
                    pax_size = n;
                    has_pax_size = true;
                }
            }
            s.remove_prefix(len);
        }
    }
};

/// Splits "dir/000123.seg.png" into key "dir/000123" and extension "seg.png" (lower
/// case), as WebDataset does. False for a file name with no dot after its first character.
inline bool webdataset_key(const std::string& path, std::string& key, std::string& ext) {
    const std::size_t slash = path.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    const std::size_t dot = path.find('.', base);
    if (dot == std::string::npos || dot == base) return false;
    key = path.substr(0, dot);
    ext = path.substr(dot + 1);
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return true;
}

/// WebDataset: the tar parser's files grouped into samples by key. A file whose name has
/// no extension is ignored (counted in the policy's `ignored`), as WebDataset does.
/// Under on_corrupt::skip a corruption that loses bytes may cut the sample open at it and
/// the one begun right after it (its first files may have been in the lost bytes): both
/// are dropped and counted in `incomplete`, never given out partial. When the lost member
/// is known (a sound header over max_record_bytes), only the sample of its key is. A
/// sample without one of the policy's `required` fields is a corrupt record.
struct webdataset_parser : tar_parser {
    sample open;
    bool open_cut = false;  // `open` may have lost files to a corruption
    bool next_cut = false;  // the next sample to begin may have lost its first files
    std::string next_key;   // ... if it has this key (empty: whatever its key)
    std::uint64_t samples = 0;
    std::vector<record> files;

    webdataset_parser() { track_losses = true; }

    void parse(std::vector<sample>& out) {
        try {
            tar_parser::parse(files);
        } catch (...) {
            group(out);  // the complete samples before the corruption go first
            throw;
        }
        group(out);
    }
    void finish(std::vector<sample>& out) {
        try {
            tar_parser::finish(files);
        } catch (...) {
            group(out);
            throw;
        }
        group(out);
        flush(out);
    }
    void reset() {  // bytes were lost upstream (gunzip skipped a broken member)
        tar_parser::reset();
        losses.push_back({0, {}});
    }

private:
    void lost(const std::string& member) {
        std::string key, ext;
        if (member.empty()) {  // unknown: the open sample and the next may have lost files
            if (!open.fields.empty()) open_cut = true;
            next_cut = true;
            next_key.clear();
        } else if (webdataset_key(member, key, ext)) {
            if (!open.fields.empty() && key == open.key) {
                open_cut = true;
            } else if (!next_cut || !next_key.empty()) {
                next_cut = true;
                next_key = key;
            }
        }
    }
    void group(std::vector<sample>& out) {
        std::string key, ext;
        std::size_t li = 0;
        for (std::size_t i = 0;; ++i) {
            for (; li < losses.size() && losses[li].at <= i; ++li) lost(losses[li].member);
            if (i == files.size()) break;
            auto& f = files[i];
            if (!webdataset_key(f.name, key, ext)) {
                if (pol->ignored) pol->ignored->fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            if (!open.fields.empty() && key != open.key) flush(out);
            if (open.fields.empty()) {
                open.key = key;
                open.source = f.source;
                open.offset = f.offset;
                open_cut = next_cut && (next_key.empty() || next_key == key);
            } else if (open.find(ext)) {
                parser_base::bad("duplicate file '" + f.name + "' in WebDataset sample '" + key + "'", f.offset);
                continue;
            }
            next_cut = false;
            open.fields.push_back(field{ext, std::move(f.data)});
        }
        losses.clear();
        files.clear();
    }
    void flush(std::vector<sample>& out) {
        if (open.fields.empty()) return;
        sample s = std::move(open);
        const bool cut = open_cut;
        open = sample{};
        open_cut = false;
        s.index = samples++;
        if (cut) {  // under skip only: an error was thrown at the corruption otherwise
            if (pol->incomplete) pol->incomplete->fetch_add(1, std::memory_order_relaxed);
            return;
        }
        for (auto& r : pol->required)
            if (!s.find(r)) {
                parser_base::bad("WebDataset sample '" + s.key + "' has no '" + r + "' file (a required field)", s.offset);
                return;
            }
        out.push_back(std::move(s));
    }
};

}  // namespace sluice::detail
