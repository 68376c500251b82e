#pragma once
// sluice::raw: one record per object (an image file, a document, a whole shard).

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>

#include <cstring>
#include <unordered_map>
#include <vector>

namespace sluice {

namespace detail {
class raw_decoder {
public:
    void operator()(chunk&& c, std::vector<record>& out) {
        if (c.offset == 0 && c.last) {  // the whole object in one chunk: no copy
            out.push_back(record{std::move(c.data), c.source, 0, 0});
            return;
        }
        auto& acc = partial_[c.source.get()];
        acc.insert(acc.end(), c.data.begin(), c.data.end());
        if (c.last) {
            out.push_back(record{bytes::copy_of(std::span<const std::byte>(acc)), c.source, 0, 0});
            partial_.erase(c.source.get());
        }
    }

private:
    std::unordered_map<const shard*, std::vector<std::byte>> partial_;
};
}  // namespace detail

/// Takes: chunks. Gives: one record per shard holding all its bytes. An object that fits
/// one chunk is passed on without a copy; a larger one is assembled (one copy), so give
/// read() a chunk_size above your typical object size.
/// Backpressure: holds at most one object per file in flight while assembling it.
/// Errors: none of its own; upstream errors pass through.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("images/*.jpg") | sluice::plan() | sluice::read() | sluice::raw()`
inline stage<chunk, record> raw(channel_limits out = {64, 256u << 20}) {
    return make_item_stage<chunk, record>("raw", {.on = pool::cpu, .buffer = out}, detail::raw_decoder{},
                                          /*counts_records=*/true);
}

}  // namespace sluice
