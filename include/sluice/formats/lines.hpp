#pragma once
// sluice::lines: one record per line (JSON lines, CSV, text).

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/decode.hpp>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace sluice {

namespace detail {
class lines_decoder {
    struct state {
        std::string carry;  // a line cut by a chunk boundary
        std::uint64_t carry_offset = 0;
        std::uint64_t next_index = 0;
    };

public:
    void operator()(chunk&& c, std::vector<record>& out) {
        auto& st = states_[c.source.get()];
        if (c.gap) st.carry.clear();  // bytes were lost upstream: the cut line is gone
        const char* base = reinterpret_cast<const char*>(c.data.data());
        const char* p = base;
        const char* end = base + c.data.size();
        auto emit = [&](bytes data, std::uint64_t offset) {
            if (!data.empty() && data.data()[data.size() - 1] == std::byte{'\r'})
                data = data.slice(0, data.size() - 1);
            out.push_back(record{std::move(data), c.source, st.next_index++, offset, {}});
        };
        if (!st.carry.empty()) {
            const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
            const char* stop = nl ? nl : end;
            st.carry.append(p, stop);
            if (nl) {  // the only copy: a line that straddles two chunks
                emit(bytes::copy_of(st.carry), st.carry_offset);
                st.carry.clear();
                p = nl + 1;
            } else {
                p = end;
            }
        }
        while (p < end) {
            const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
            if (!nl) break;
            emit(c.data.slice(static_cast<std::size_t>(p - base), static_cast<std::size_t>(nl - p)),
                 c.offset + static_cast<std::uint64_t>(p - base));
            p = nl + 1;
        }
        if (p < end) {
            if (st.carry.empty()) st.carry_offset = c.offset + static_cast<std::uint64_t>(p - base);
            st.carry.append(p, end);
        }
        if (c.last) {
            if (!st.carry.empty()) emit(bytes::copy_of(st.carry), st.carry_offset);
            states_.erase(c.source.get());
        }
    }

private:
    // Keyed by shard: chunks of several files may interleave.
    std::unordered_map<const shard*, state> states_;
};
}  // namespace detail

/// Takes: chunks. Gives: one record per line, the terminator ("\n" or "\r\n") dropped; a
/// last line without a terminator is a record too; an empty line is an empty record.
/// Records are slices of the chunk; only a line cut by a chunk boundary is copied.
/// Backpressure: holds one chunk's records plus the output channel (bounded in items and
/// bytes).
/// Errors: none of its own (any byte sequence is lines); upstream errors pass through.
/// Cancellation: stops at the next send.
/// gzip'd shards (".jsonl.gz") are inflated first unless `gz` is compression::none.
/// Example: `| sluice::read() | sluice::lines() | sluice::batch({.size = 1024})`
inline stage<chunk, record> lines(channel_limits out = {1024, 64u << 20}, compression gz = compression::detect) {
    auto split = make_item_stage<chunk, record>("lines", {.on = pool::cpu, .buffer = out},
                                                detail::selecting<detail::lines_decoder>{}, /*counts_records=*/true);
    if (gz == compression::none) return split;
    return gunzip({.mode = gz}) | std::move(split);
}

}  // namespace sluice
