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
        growable_block carry;  // a line cut by a chunk boundary
        held_count held;       // carry's bytes, in the stage's held_bytes
        std::uint64_t carry_offset = 0;
        std::uint64_t next_index = 0;
        bool discarding = false;  // skipping the rest of a line over the limit
    };

public:
    explicit lines_decoder(std::shared_ptr<const parse_policy> pol = std::make_shared<parse_policy>())
        : pol_(std::move(pol)) {}

    void operator()(chunk&& c, std::vector<record>& out) {
        auto [it, fresh] = states_.try_emplace(c.source.get());
        state& st = it->second;
        if (fresh) st.held.use(&pol_->held);
        try {
            split(c, st, out);
        } catch (...) {
            states_.erase(it);
            throw;
        }
        if (c.last) states_.erase(it);
    }

private:
    void split(chunk& c, state& st, std::vector<record>& out) {
        const std::size_t lim = pol_->max_record_bytes;
        if (c.gap) {  // bytes were lost upstream: the cut line is gone
            st.carry.clear();
            st.held.set(0);
            st.discarding = false;
        }
        const char* base = reinterpret_cast<const char*>(c.data.data());
        const char* p = base;
        const char* end = base + c.data.size();
        auto at = [&](const char* q) { return c.offset + static_cast<std::uint64_t>(q - base); };
        auto emit = [&](bytes data, std::uint64_t offset) {
            if (!data.empty() && data.data()[data.size() - 1] == std::byte{'\r'})
                data = data.slice(0, data.size() - 1);
            out.push_back(record{std::move(data), c.source, st.next_index++, offset, {}});
        };
        // A line over the limit: an error, or under skip counted and passed over (it keeps
        // its index, so later lines keep theirs).
        auto too_long = [&](std::uint64_t offset) {
            st.next_index++;
            corrupt(*pol_, *c.source, c.inflated, "line" + over_limit(lim), offset);
        };
        auto newline = [&](const char* q) {
            return static_cast<const char*>(std::memchr(q, '\n', static_cast<std::size_t>(end - q)));
        };
        if (st.discarding) {
            const char* nl = newline(p);
            st.discarding = !nl;
            p = nl ? nl + 1 : end;
        } else if (st.carry.size()) {
            const char* nl = newline(p);
            const char* stop = nl ? nl : end;
            const auto n = static_cast<std::size_t>(stop - p);
            if (st.carry.size() + n > lim) {
                st.carry.clear();
                st.held.set(0);
                st.discarding = !nl;
                p = nl ? nl + 1 : end;
                too_long(st.carry_offset);
            } else {
                st.carry.append(reinterpret_cast<const std::byte*>(p), n, lim);
                st.held.set(st.carry.size());
                p = stop;
                if (nl) {  // the only copy: a line that straddles chunks, made as it came
                    emit(st.carry.release(), st.carry_offset);
                    st.held.set(0);
                    p = nl + 1;
                }
            }
        }
        while (p < end) {
            const char* nl = newline(p);
            if (!nl) break;
            const char* line = p;
            p = nl + 1;
            if (static_cast<std::size_t>(nl - line) > lim) too_long(at(line));
            else emit(c.data.slice(static_cast<std::size_t>(line - base), static_cast<std::size_t>(nl - line)), at(line));
        }
        if (p < end) {  // a line cut by the chunk's end
            const auto n = static_cast<std::size_t>(end - p);
            if (n > lim) {
                st.discarding = !c.last;
                too_long(at(p));
            } else {
                st.carry_offset = at(p);
                st.carry.append(reinterpret_cast<const std::byte*>(p), n, lim);
                st.held.set(st.carry.size());
            }
        }
        if (c.last && st.carry.size()) {
            emit(st.carry.release(), st.carry_offset);
            st.held.set(0);
        }
    }

    std::shared_ptr<const parse_policy> pol_;
    // Keyed by shard: chunks of several files may interleave.
    std::unordered_map<const shard*, state> states_;
};
}  // namespace detail

/// Takes: chunks. Gives: one record per line, the terminator ("\n" or "\r\n") dropped; a
/// last line without a terminator is a record too; an empty line is an empty record.
/// Records are slices of the chunk; only a line cut by a chunk boundary is copied (once,
/// as its pieces arrive).
/// Backpressure: holds one chunk's records plus the output channel (bounded in items and
/// bytes), and per shard in flight at most one line cut by chunk boundaries, of at most
/// `.max_record_bytes` (its "held_bytes" counter shows it).
/// Errors: a line longer than `.max_record_bytes` (its bytes before the "\n"; default
/// 1 GiB): a sluice::source_error naming the shard, the byte offset where the line starts
/// and the limit, after every line before it. Under on_corrupt::skip it is counted
/// ("corrupt"), passed over to its "\n" and the lines after it are given. Upstream errors
/// pass through.
/// Cancellation: stops at the next send.
/// Options: decode_options (`.on_corrupt`, `.gzip`, `.max_record_bytes`, `.on_skip`,
/// `.out`: {1024, 64 MiB} by default). gzip'd shards (".jsonl.gz") are inflated first
/// unless `.gzip = compression::none`; offsets then count uncompressed bytes.
/// Example: `| sluice::read() | sluice::lines({.max_record_bytes = 1 << 20}) | sluice::batch({.size = 1024})`
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, record> lines(decode_options o = {}) {
    return detail::format_stage<record>("lines", std::move(o), {.out = {1024, 64u << 20}},
                                        [](std::shared_ptr<const detail::parse_policy> pol) {
                                            return detail::lines_decoder(std::move(pol));
                                        });
}

}  // namespace sluice
