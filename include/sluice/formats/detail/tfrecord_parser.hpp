#pragma once
// TFRecord, one shard: [uint64 length][uint32 masked crc32c(length)][data][uint32 masked crc32c(data)],
// little-endian.

#include <sluice/formats/crc32c.hpp>
#include <sluice/formats/detail/cursor.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace sluice::detail {

struct tfrecord_parser : parser_base {
    enum class phase { header, data, footer } at = phase::header;
    std::uint64_t start = 0;  // offset of the record being read
    std::uint64_t length = 0;
    std::uint64_t index = 0;
    bool resyncing = false;  // scanning for a valid header after a corrupt one
    bytes data;
    // Boundaries (parse_policy::index): `known`, kept from an earlier epoch for this very
    // file, gives record `index` (its entry `index`: known is used from the shard's start)
    // without reading its header and footer, and while it is set the record in progress
    // came from it; else `seen` collects them as they are parsed, kept at the shard's
    // sound end.
    bool looked = false;
    std::shared_ptr<const std::vector<record_index::entry>> known;
    std::optional<record_index::file_key> key;
    std::vector<record_index::entry> seen;
    std::size_t room = 0;  // entries `seen` may hold (record_index::room)
    bytes file_held;       // keeps the file open until finish() checks it is unchanged

    /// At the shard's first header: boundaries apply to a shard read by call from its
    /// start whose data checksums go to batch (the records are the same either way: the
    /// checksum batch checks covers their data; the headers were checked when kept).
    void look_up() {
        looked = true;
        const auto* f = cur.file();
        if (!pol->index || !pol->verify || !pol->defer_data_crc || inflated || cur.offset() != 0 || !f || !f->by_call())
            return;
        key = record_index::key_of(f->path(), f->fd());
        if (!key) return;  // also a file read by its path (no descriptor kept): not kept
        known = pol->index->find(*key);
        room = known ? 0 : pol->index->room(key->path);
        if (!known && room == 0) key.reset();  // nothing more can be kept
        if (key) file_held = cur.chunk_bytes().slice(0, 0);
    }
    /// Nothing of this shard is kept: what was collected is freed.
    void forget() noexcept {
        key.reset();
        std::vector<record_index::entry>{}.swap(seen);
        file_held = {};
    }

    void parse(std::vector<record>& out) {
        for (;;) {
            switch (at) {
            case phase::header: {
                if (!looked) look_up();
                if (known) {
                    if (index < known->size() && (*known)[index].start == cur.offset()) {
                        start = cur.offset();
                        length = (*known)[index].length;
                        cur.consume(12);
                        at = phase::data;
                        continue;  // on to the data, as after a header read below
                    }
                    known = nullptr;  // past what was kept (or not where it says): read on
                    forget();
                }
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
                std::uint32_t stored = 0;
                if (known) {
                    stored = (*known)[index].crc;
                    if (pol->indexed) pol->indexed->fetch_add(1, std::memory_order_relaxed);
                } else {
                    const std::byte* f = cur.peek(4);
                    if (!f) return;
                    stored = le32(f);
                    if (key) {
                        if (length <= UINT32_MAX && seen.size() < room)
                            seen.push_back({start, static_cast<std::uint32_t>(length), stored});
                        else
                            forget();  // more than can be kept (or a length over 32 bits): not kept
                    }
                }
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
        known = nullptr;  // bytes were lost: nothing of this shard is kept
        forget();
    }

    void finish(std::vector<record>&) {
        if (at == phase::header && cur.empty()) {
            // Parsed whole and sound: its boundaries serve the next epoch, if the file is
            // still the version it was when its parse began.
            if (key && !known && pol->index && file_held.file() &&
                record_index::key_of(key->path, file_held.file()->fd()) == key)
                pol->index->keep(*key, std::move(seen));
            forget();
            return;
        }
        if (resyncing) return;  // already reported: the tail held no valid record
        const std::uint64_t at_offset = at == phase::header && !cur.skipping() ? cur.offset() : start;
        bad("truncated TFRecord (the shard ends inside a record)", at_offset);
    }
};

}  // namespace sluice::detail
