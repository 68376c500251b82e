#pragma once
// RecordIO (MXNet / dmlc-core), one shard: each part is
//   [uint32 magic 0xced7230a][uint32 lrec: cflag in bits 29-31, length in bits 0-28]
//   [length bytes][zero padding to a multiple of 4]
// cflag 0: a whole record; 1, 2..., 3: first, middle and last parts of a record that the
// writer split where its data held the magic word at a 4-byte boundary. The magic word is
// not stored: the reader puts it back between parts.

#include <sluice/formats/detail/cursor.hpp>

namespace sluice::detail {

inline constexpr std::uint32_t recordio_magic = 0xced7230au;

struct recordio_parser : parser_base {
    enum class phase { header, data } at = phase::header;
    std::uint32_t cflag = 0;
    std::uint32_t length = 0;
    std::uint64_t part_start = 0;
    std::uint64_t record_start = 0;  // of the first part of a split record
    std::uint64_t index = 0;
    bool resyncing = false;
    std::vector<bytes> parts;  // of a split record, before the last one
    std::size_t parts_bytes = 0;
    bytes data;

    void parse(std::vector<record>& out) {
        for (;;) {
            switch (at) {
            case phase::header: {
                const std::byte* h = cur.peek(8);
                if (!h) return;
                const std::uint32_t magic = le32(h), lrec = le32(h + 4);
                const bool too_long = (lrec & ((1u << 29) - 1)) > pol->max_record_bytes;
                if (magic != recordio_magic || too_long) {
                    // Parts start at multiples of 4: look for the next magic word there.
                    if (!resyncing)
                        bad(too_long && magic == recordio_magic
                                ? "RecordIO part of " + std::to_string(lrec & ((1u << 29) - 1)) + " bytes" +
                                      over_limit(pol->max_record_bytes)
                                : std::string("bad RecordIO magic"),
                            cur.offset());
                    resyncing = true;
                    if (split_open) discarding = true;  // its remaining parts are lost too
                    drop_split();
                    cur.consume(4);
                    continue;
                }
                resyncing = false;
                part_start = cur.offset();
                cflag = lrec >> 29;
                length = lrec & ((1u << 29) - 1);
                cur.consume(8);
                if (split_open && !discarding && (cflag == 2 || cflag == 3) &&
                    parts_bytes + 4 * parts.size() + length > pol->max_record_bytes) {
                    // The joined record would pass the limit: drop it before this part
                    // is held (what is held stays within the limit).
                    const std::uint64_t size = parts_bytes + 4 * parts.size() + length;
                    drop_split();
                    discarding = cflag == 2;
                    ++index;
                    cur.consume(length + (4 - length % 4) % 4);
                    bad("RecordIO split record of at least " + std::to_string(size) + " bytes" +
                            over_limit(pol->max_record_bytes),
                        record_start);
                    continue;
                }
                at = phase::data;
                [[fallthrough]];
            }
            case phase::data:
                if (!cur.take(length, data)) return;
                cur.consume((4 - length % 4) % 4);
                at = phase::header;
                part(out);
                break;
            }
        }
    }

    void part(std::vector<record>& out) {
        if (discarding) {  // swallow the parts of a record already counted as lost
            if (cflag == 2) return void(data = {});
            discarding = false;
            if (cflag == 3) return void(data = {});
        }
        const bool in_split = split_open;
        switch (cflag) {
        case 0:
            if (in_split) broken_split("a whole record inside a split record");
            emit(out, std::move(data), part_start);
            break;
        case 1:
            if (in_split) broken_split("a split record starts inside another");
            record_start = part_start;
            split_open = true;
            add_part();
            break;
        case 2:
            if (!in_split) return orphan("a middle part without a first part");
            add_part();
            break;
        case 3: {
            if (!in_split) return orphan("a last part without a first part");
            add_part();
            if (split_open) emit(out, join(), record_start);  // not dropped as too large
            break;
        }
        default:
            if (in_split) drop_split();
            bad("bad RecordIO continuation flag " + std::to_string(cflag), part_start);
            ++index;
        }
        data = {};
    }

    void reset() {
        at = phase::header;
        resyncing = false;
        discarding = false;
        drop_split();
        data = {};
    }

    void finish(std::vector<record>&) {
        if (resyncing) return;
        if (at != phase::header || !cur.empty())
            bad("truncated RecordIO record (the shard ends inside a part)",
                at == phase::header && !cur.skipping() ? cur.offset() : part_start);
        else if (split_open)
            bad("truncated RecordIO record (the shard ends before its last part)", record_start);
    }

private:
    bool split_open = false;
    bool discarding = false;  // the rest of a split record already reported as lost
    held_count held;          // parts_bytes, in the stage's held_bytes

    void add_part() {
        // The joined record: the parts plus the magic word put back between them.
        if (parts_bytes + data.size() + 4 * parts.size() > pol->max_record_bytes) {
            drop_split();
            discarding = true;
            bad("RecordIO split record of at least " + std::to_string(parts_bytes + data.size()) + " bytes" +
                    over_limit(pol->max_record_bytes),
                record_start);
            ++index;
            return;
        }
        parts_bytes += data.size();
        parts.push_back(std::move(data));
        data = {};
        held.use(&pol->held);
        held.set(parts_bytes);
    }
    void drop_split() {
        parts.clear();
        parts_bytes = 0;
        held.set(0);
        split_open = false;
    }
    void broken_split(const std::string& what) {
        drop_split();
        bad("broken RecordIO split record: " + what, record_start);
        ++index;
    }
    void orphan(const std::string& what) {
        bad("broken RecordIO split record: " + what, part_start);
        data = {};
        ++index;
    }
    bytes join() {
        const std::size_t total = parts_bytes + 4 * (parts.size() - 1);
        auto buf = pol->mem ? pol->mem->allocate(total ? total : 1) : std::make_shared<buffer>(total ? total : 1);
        std::byte* d = buf->data();
        unsigned char magic[4] = {0x0a, 0x23, 0xd7, 0xce};  // recordio_magic, little-endian
        for (std::size_t i = 0; i < parts.size(); ++i) {
            if (i) {
                std::memcpy(d, magic, 4);
                d += 4;
            }
            if (!parts[i].empty()) std::memcpy(d, parts[i].data(), parts[i].size());
            d += parts[i].size();
        }
        drop_split();
        return bytes(std::move(buf), total);
    }
    void emit(std::vector<record>& out, bytes d, std::uint64_t offset) {
        if (d.size() > pol->max_record_bytes) {
            bad("RecordIO record of " + std::to_string(d.size()) + " bytes" + over_limit(pol->max_record_bytes), offset);
            ++index;
            return;
        }
        record r{std::move(d), src, index++, offset, {}};
        out.push_back(std::move(r));
    }
};

}  // namespace sluice::detail
