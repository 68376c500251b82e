#pragma once
// Writers for the record formats sluice reads: to make test shards and benchmark
// datasets (sluice-gen), and for users who need a few small files of their own. They
// append to a std::string; for large datasets write each shard's string out as you go.

#include <sluice/formats/crc32c.hpp>
#include <sluice/formats/detail/recordio_parser.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sluice {

namespace detail {
inline void put_le(std::string& out, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
}  // namespace detail

/// Appends one TFRecord record.
inline void append_tfrecord(std::string& out, std::string_view data) {
    std::string len;
    detail::put_le(len, data.size(), 8);
    out += len;
    detail::put_le(out, crc32c_mask(crc32c(len.data(), 8)), 4);
    out += data;
    detail::put_le(out, crc32c_mask(crc32c(data.data(), data.size())), 4);
}

/// Appends one RecordIO record as MXNet's writer does: where the data holds the magic
/// word at a multiple of 4 bytes, the record is split into parts there (the magic itself
/// is not stored); parts are padded to 4 bytes.
inline void append_recordio(std::string& out, std::string_view data) {
    if (data.size() >= (1u << 29)) throw std::length_error("sluice: RecordIO records are under 512 MiB");
    const unsigned char magic[4] = {0x0a, 0x23, 0xd7, 0xce};
    auto part = [&](std::uint32_t cflag, std::string_view d) {
        detail::put_le(out, detail::recordio_magic, 4);
        detail::put_le(out, (cflag << 29) | static_cast<std::uint32_t>(d.size()), 4);
        out += d;
        out.append((4 - d.size() % 4) % 4, '\0');
    };
    std::size_t from = 0;
    for (std::size_t i = 0; i + 4 <= data.size(); i += 4) {
        if (std::memcmp(data.data() + i, magic, 4) != 0) continue;
        part(from == 0 ? 1u : 2u, data.substr(from, i - from));
        from = i + 4;
    }
    part(from == 0 ? 0u : 3u, data.substr(from));
}

namespace detail {
inline void tar_header(std::string& out, std::string_view name, std::uint64_t size, char type) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
    std::snprintf(h + 100, 8, "%07o", 0644u);
    std::snprintf(h + 108, 8, "%07o", 0u);
    std::snprintf(h + 116, 8, "%07o", 0u);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
    std::snprintf(h + 136, 12, "%011o", 0u);
    h[156] = type;
    std::memcpy(h + 257, "ustar\0" "00", 8);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);  // six digits, NUL, space
    h[155] = ' ';
    out.append(h, 512);
}
inline void tar_pad(std::string& out) { out.append((512 - out.size() % 512) % 512, '\0'); }
}  // namespace detail

/// Appends one regular file to a tar archive (ustar; a name over 100 bytes gets a GNU
/// long-name member first). `out` must hold whole 512-byte blocks.
inline void append_tar_file(std::string& out, std::string_view name, std::string_view data) {
    if (name.size() > 100) {
        std::string n(name);
        n.push_back('\0');
        detail::tar_header(out, "././@LongLink", n.size(), 'L');
        out += n;
        detail::tar_pad(out);
    }
    detail::tar_header(out, name, data.size(), '0');
    out += data;
    detail::tar_pad(out);
}

/// Ends a tar archive: two zero blocks.
inline void end_tar(std::string& out) { out.append(1024, '\0'); }

}  // namespace sluice
