#pragma once
// TFRecord, one shard: [uint64 length][uint32 masked crc32c(length)][data][uint32 masked crc32c(data)],
// little-endian.

#include <sluice/formats/crc32c.hpp>
#include <sluice/formats/detail/cursor.hpp>

namespace sluice::detail {

struct tfrecord_parser : parser_base {
    enum class phase { header, data, footer } at = phase::header;
    std::uint64_t start = 0;  // offset of the record being read
    std::uint64_t length = 0;
    std::uint64_t index = 0;
    bool resyncing = false;  // scanning for a valid header after a corrupt one
    bytes data;

    void parse(std::vector<record>& out) {
        for (;;) {
            switch (at) {
            case phase::header: {
                const std::byte* h = cur.peek(12);
                if (!h) return;
                const std::uint64_t len = le64(h);
                const bool len_ok = !pol->verify || crc32c_mask(crc32c(h, 8)) == le32(h + 8);
                if (len_ok && pol->verify && len > pol->max_record_bytes && len < (std::uint64_t{1} << 62) &&
                    !resyncing) {
                    // A sound length, just too large: skip the whole record.
                    bad("TFRecord length " + std::to_string(len) + over_limit(pol->max_record_bytes), cur.offset());
                    cur.consume(12 + len + 4);
                    ++index;
                    continue;
                }
                if (!len_ok || len > pol->max_record_bytes) {
                    // A length we cannot trust: nothing after it can be located except by
                    // looking for the next header whose length checksum holds.
                    if (!resyncing)
                        bad(len_ok ? "TFRecord length " + std::to_string(len) + over_limit(pol->max_record_bytes)
                                   : std::string("bad TFRecord length checksum"),
                            cur.offset());
                    resyncing = true;
                    cur.consume(1);
                    continue;
                }
                resyncing = false;
                start = cur.offset();
                length = len;
                cur.consume(12);
                at = phase::data;
                [[fallthrough]];
            }
            case phase::data:
                if (!cur.take(static_cast<std::size_t>(length), data)) return;
                at = phase::footer;
                [[fallthrough]];
            case phase::footer: {
                const std::byte* f = cur.peek(4);
                if (!f) return;
                const std::uint32_t stored = le32(f);
                cur.consume(4);
                at = phase::header;
                const std::uint64_t i = index++;
                if (pol->verify && pol->defer_data_crc && !inflated) {  // batch checks it as it copies
                    record r{std::move(data), src, i, start, {}, stored};
                    data = {};
                    if (pol->deferred) pol->deferred->fetch_add(1, std::memory_order_relaxed);
                    out.push_back(std::move(r));
                    break;
                }
                if (pol->verify && crc32c_mask(crc32c(data.data(), data.size())) != stored) {
                    bad(bad_tfrecord_data(i), start);
                    data = {};
                    continue;  // the length was sound: the next record starts right here
                }
                record r{std::move(data), src, i, start, {}};
                data = {};
                out.push_back(std::move(r));
                break;
            }
            }
        }
    }

    void reset() {
        at = phase::header;
        resyncing = false;
        data = {};
    }

    void finish(std::vector<record>&) {
        if (at == phase::header && cur.empty()) return;
        if (resyncing) return;  // already reported: the tail held no valid record
        const std::uint64_t at_offset = at == phase::header && !cur.skipping() ? cur.offset() : start;
        bad("truncated TFRecord (the shard ends inside a record)", at_offset);
    }
};

}  // namespace sluice::detail
