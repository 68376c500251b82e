#pragma once
// Drives a format's parser directly over a byte string cut into chunks (fast enough for
// one-byte chunks), and gzip through zlib, for the format tests.

#include <sluice/core/detail/random.hpp>
#include <sluice/formats/detail/cursor.hpp>
#include <sluice/formats/detail/gzip_inflater.hpp>

#include <zlib.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace sluice_test {

inline std::shared_ptr<const sluice::shard> make_shard(const std::string& url) {
    return std::make_shared<const sluice::shard>(sluice::shard{url, 0, 0});
}

/// `data` as chunks of the given sizes (cycled), each chunk in a buffer of its own (as a
/// source gives them), the last flagged.
inline std::vector<sluice::chunk> cut(const std::string& data, const std::vector<std::size_t>& sizes,
                                      const std::string& url = "shard") {
    auto s = make_shard(url);
    std::vector<sluice::chunk> out;
    std::size_t off = 0, k = 0;
    do {
        const auto n = std::min(sizes[k++ % sizes.size()], data.size() - off);
        sluice::chunk c{s, off, sluice::bytes::copy_of(std::string_view(data).substr(off, n)), off + n == data.size(),
                        false};
        out.push_back(std::move(c));
        off += n;
    } while (off < data.size());
    return out;
}

/// Random chunk sizes from 1 byte to `max`, spread over orders of magnitude.
inline std::vector<std::size_t> random_sizes(sluice::detail::rng& r, std::size_t max, int n = 64) {
    std::vector<std::size_t> sizes;
    for (int i = 0; i < n; ++i) {
        const unsigned bits = static_cast<unsigned>(r.below(64 - static_cast<unsigned>(__builtin_clzll(max))));
        sizes.push_back(1 + r.below(std::min<std::uint64_t>(max, std::uint64_t{1} << bits)));
    }
    return sizes;
}

/// What a parse gave: outputs, the corruptions counted, and the error if one was thrown.
template <class Out>
struct parsed {
    std::vector<Out> out;
    std::uint64_t skipped = 0;
    std::uint64_t incomplete = 0;  // WebDataset samples dropped as cut by a loss
    std::uint64_t held_peak = 0;   // the most bytes held between chunks
    std::uint64_t held_after = 0;  // held when the parse ended (0 unless broken off)
    std::string error;
    bool slices_of_chunks = true;  // every output lying inside one chunk was a slice of it
};

struct policy_opts {
    sluice::on_corrupt corrupt = sluice::on_corrupt::error;
    bool verify = true;
    std::size_t max_record_bytes = std::size_t{1} << 30;
    bool gunzip = false;
    std::size_t data_at = 0;  // bytes from a record's offset to its data (header size)
    std::vector<std::string> required = {};  // WebDataset
};

inline std::string bytes_str(const sluice::bytes& b) { return std::string(b.view()); }

/// The records' bytes as strings.
inline std::vector<std::string> strings(const std::vector<sluice::record>& rs) {
    std::vector<std::string> v;
    for (auto& r : rs) v.push_back(bytes_str(r.data));
    return v;
}

/// Runs Parser over the chunks (through gzip first when asked).
template <class Parser, class Out>
parsed<Out> parse_chunks(std::vector<sluice::chunk> chunks, policy_opts po = {}) {
    parsed<Out> p;
    std::atomic<std::uint64_t> skipped{0}, ignored{0}, incomplete{0}, held{0}, held_peak{0};
    auto pol = std::make_shared<sluice::detail::parse_policy>();
    pol->incomplete = &incomplete;
    pol->required = po.required;
    pol->held = {&held, &held_peak};
    pol->corrupt = po.corrupt;
    pol->verify = po.verify;
    pol->max_record_bytes = po.max_record_bytes;
    pol->skipped = &skipped;
    pol->ignored = &ignored;
    try {
        if (po.gunzip) {
            sluice::detail::gunzip_decoder z(pol, sluice::compression::detect, 64 << 10);
            std::vector<sluice::chunk> inflated;
            for (auto& c : chunks) z(std::move(c), inflated);
            chunks = std::move(inflated);
        }
        sluice::detail::shard_parsers<Parser, Out> d(pol);
        std::vector<Out> out;
        for (auto& c : chunks) {
            const std::byte* lo = c.data.data();
            const std::byte* hi = lo + c.data.size();
            out.clear();
            try {
                d(std::move(c), out);
            } catch (...) {
                for (auto& o : out) p.out.push_back(std::move(o));
                throw;
            }
            for (auto& o : out) {
                if constexpr (std::is_same_v<Out, sluice::record>) {
                    // A record whose bytes all came from this chunk must point into it.
                    const bool inside = o.data.data() >= lo && o.data.data() + o.data.size() <= hi;
                    const std::uint64_t from = o.offset + po.data_at, to = from + o.data.size();
                    if (!inside && !o.data.empty() && from >= c.offset && to <= c.offset + (hi - lo))
                        p.slices_of_chunks = false;
                }
                p.out.push_back(std::move(o));
            }
        }
    } catch (const sluice::source_error& e) {
        p.error = e.what();
    }
    p.skipped = skipped.load();
    p.incomplete = incomplete.load();
    p.held_peak = held_peak.load();
    p.held_after = held.load();
    return p;
}

/// gzip of `data` (one member), at the given level.
inline std::string gzip(const std::string& data, int level = 6) {
    z_stream z{};
    if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("zlib");
    std::string out(deflateBound(&z, data.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("zlib deflate");
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

}  // namespace sluice_test
