#pragma once
// sluice::raw: one record per object (an image file, a document, a whole shard).

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/decode.hpp>

#include <cstring>
#include <unordered_map>
#include <vector>

namespace sluice {

namespace detail {
class raw_decoder {
    struct state {
        std::vector<bytes> parts;   // the object so far as slices, while they can end uncopied
        std::uint64_t held_size = 0;  // their bytes
        growable_block data;  // the object so far
        held_count held;      // data's bytes, in the stage's held_bytes
        bool dropped = false; // over the limit, or bytes lost upstream
    };

public:
    explicit raw_decoder(std::shared_ptr<const parse_policy> pol = std::make_shared<parse_policy>())
        : pol_(std::move(pol)) {}

    void operator()(chunk&& c, std::vector<record>& out) {
        const std::size_t lim = pol_->max_record_bytes;
        auto over = [&](std::uint64_t size, const char* how) {
            corrupt(*pol_, *c.source, c.inflated, std::string("object of ") + how + std::to_string(size) + " bytes" + over_limit(lim), 0);
        };
        // Over the limit: what is held goes, the object is dropped as its bytes arrive.
        auto drop_over = [&](state& st, std::uint64_t size, bool last) {
            st.dropped = true;
            st.parts.clear();
            st.data.clear();
            st.held.set(0);
            over(size, last ? "" : "at least ");
        };
        auto it = states_.find(c.source.get());
        if (it == states_.end() && c.offset == 0 && c.last && !c.gap) {  // the whole object in one chunk: no copy
            if (c.data.size() > lim) return over(c.data.size(), "");
            out.push_back(record{std::move(c.data), c.source, 0, 0, {}});
            return;
        }
        if (it == states_.end()) {
            it = states_.try_emplace(c.source.get()).first;
            it->second.held.use(&pol_->held);
        }
        state& st = it->second;
        try {
            // Kept as slices, not copied, while that can end in one record without a copy:
            // a fetched object comes as its bytes, then an empty last chunk; a mapped file
            // comes as windows laid end to end, which join in place (issue 17: whole small
            // objects over HTTP assembled cost a third of their rate).
            const bool joins = st.data.size() == 0 && !st.dropped && !c.gap &&
                               (st.parts.empty() ? c.offset == 0
                                                 : c.data.empty() || (c.data.file() && c.data.file() == st.parts.back().file() &&
                                                                      c.data.data() == st.parts.back().end()));
            if (joins) {
                const std::uint64_t size = st.held_size + c.data.size();
                if (size > lim) {
                    drop_over(st, size, c.last);
                } else {
                    if (!c.data.empty() || st.parts.empty()) st.parts.push_back(std::move(c.data));
                    st.held_size = size;
                    st.held.set(size);
                }
                if (c.last && !st.dropped) {
                    bytes whole = st.parts.size() == 1 ? std::move(st.parts[0]) : bytes::joined_in_place(st.parts);
                    if (st.parts.size() > 1 && !whole.file()) {  // not laid end to end after all: assemble
                        assemble_parts(st, lim);
                        whole = st.data.release();
                    }
                    out.push_back(record{std::move(whole), c.source, 0, 0, {}});
                }
                if (c.last) states_.erase(it);
                return;
            }
            assemble_parts(st, lim);  // from here on: assembled
            if (c.gap && !st.dropped) {  // bytes were lost upstream (and counted there): the object is gone
                st.dropped = true;
                st.data.clear();
                st.held.set(0);
            }
            if (!st.dropped) {
                const std::uint64_t size = std::uint64_t{st.data.size()} + c.data.size();
                if (size > lim) {
                    drop_over(st, size, c.last);
                } else {
                    // Copied in as it comes, so the chunk goes back at once: the object
                    // plus one chunk at most, not twice the object.
                    st.data.append(c.data.data(), c.data.size(), lim);
                    st.held.set(st.data.size());
                }
            }
            if (c.last && !st.dropped) out.push_back(record{st.data.release(), c.source, 0, 0, {}});
        } catch (...) {
            states_.erase(it);
            throw;
        }
        if (c.last) states_.erase(it);
    }

    /// Whether `c` may be copied into an object being assembled rather than kept as it is:
    /// bytes after an object's first chunk, unless they are a mapped window (which joins
    /// the last in place when laid end to end). An object's first chunk and an empty last
    /// one (as fetch sends a whole object) are kept. decode_worker moves the stage off the
    /// I/O loop at the first such chunk (format_defaults::hands_on).
    bool assembles(const chunk& c) const noexcept { return c.offset != 0 && !c.data.empty() && !c.data.file(); }

private:
    // The slices kept so far, copied into the block being assembled.
    static void assemble_parts(state& st, std::size_t lim) {
        for (auto& part : st.parts) st.data.append(part.data(), part.size(), lim);
        st.parts.clear();
    }

    std::shared_ptr<const parse_policy> pol_;
    std::unordered_map<const shard*, state> states_;
};
}  // namespace detail

/// Takes: chunks. Gives: one record per shard holding all its bytes. An object that fits
/// one chunk (followed, or not, by an empty last chunk, as fetch sends it) is passed on
/// without a copy; a larger one is assembled (one copy, made as
/// its chunks arrive, each chunk given back at once), so give read() a chunk_size above
/// your typical object size. Bytes are given as stored unless `.gzip` says otherwise
/// (or put sluice::gunzip() before raw()).
/// Runs on the CPU pool, or on the I/O loop where its records go straight to a batch and
/// its chunks come from there (format_defaults::hands_on), until an object must be
/// assembled: the stage then moves to the pool for the rest of the run.
/// Backpressure: per file in flight, the object being assembled, of at most
/// `.max_record_bytes` (its "held_bytes" counter shows it), plus the output channel
/// ({64, 256 MiB} by default; a record larger than its byte budget still passes, alone).
/// Memory: an object of N bytes in several chunks takes N bytes plus one chunk while it
/// is assembled (the block grows by realloc, which for large blocks remaps pages instead
/// of copying them), then the N-byte record.
/// Errors: an object larger than `.max_record_bytes` (default 1 GiB): a
/// sluice::source_error naming the shard, byte 0 and the limit. Under on_corrupt::skip it
/// is counted ("corrupt") and dropped as its bytes arrive, and the next objects are
/// given. An object that lost bytes upstream (gunzip skipping a broken member) is dropped
/// (gunzip counted it). Upstream errors pass through.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("images/*.jpg") | sluice::plan() | sluice::read() | sluice::raw()`
///          `... | sluice::raw({.max_record_bytes = std::size_t{3} << 30})` for objects up to 3 GiB.
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, record> raw(decode_options o = {}) {
    return detail::format_stage<record>("raw", std::move(o),
                                        {.gzip = compression::none, .out = {64, 256u << 20}, .reads_headers_only = true, .hands_on = true},
                                        [](std::shared_ptr<const detail::parse_policy> pol) {
                                            return detail::raw_decoder(std::move(pol));
                                        });
}

}  // namespace sluice
