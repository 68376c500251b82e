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
public:
    void operator()(chunk&& c, std::vector<record>& out) {
        if (c.offset == 0 && c.last) {  // the whole object in one chunk: no copy
            out.push_back(record{std::move(c.data), c.source, 0, 0, {}});
            return;
        }
        // Keep the parts (slices, no copy) and join them once at the end.
        auto& parts = partial_[c.source.get()];
        parts.push_back(std::move(c.data));
        if (!c.last) return;
        std::size_t total = 0;
        for (auto& p : parts) total += p.size();
        auto joined = std::make_shared<buffer>(total ? total : 1);
        std::byte* dst = joined->data();
        for (auto& p : parts) {
            if (!p.empty()) std::memcpy(dst, p.data(), p.size());
            dst += p.size();
        }
        out.push_back(record{bytes(std::move(joined), total), c.source, 0, 0, {}});
        partial_.erase(c.source.get());
    }

private:
    std::unordered_map<const shard*, std::vector<bytes>> partial_;
};
}  // namespace detail

/// Takes: chunks. Gives: one record per shard holding all its bytes. An object that fits
/// one chunk is passed on without a copy; a larger one is assembled (one copy), so give
/// read() a chunk_size above your typical object size. Bytes are given as stored: put
/// sluice::gunzip() before raw() to inflate gzip'd objects.
/// Backpressure: holds at most one object per file in flight while assembling it.
/// Errors: none of its own; upstream errors pass through.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("images/*.jpg") | sluice::plan() | sluice::read() | sluice::raw()`
inline stage<chunk, record> raw(channel_limits out = {64, 256u << 20}) {
    return make_item_stage<chunk, record>("raw", {.on = pool::cpu, .buffer = out}, detail::selecting<detail::raw_decoder>{},
                                          /*counts_records=*/true);
}

}  // namespace sluice
