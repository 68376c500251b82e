#pragma once
// The items that flow between the standard stages:
//   list -> std::string (a path or URL)
//   plan -> shard   (one object to read in one epoch, at its place in the epoch's order)
//   read/fetch -> chunk (a piece of a shard's bytes, in order, the last one flagged)
//   gunzip -> chunk (the same shard's bytes, inflated)
//   decode -> record (one record: a slice of a chunk, with where it came from),
//             or sample (WebDataset: the files of one key in a tar shard)
// Formats see only chunks, never where they came from; sources see only shards.

#include <sluice/core/bytes.hpp>
#include <sluice/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

/// One object (file, URL, S3 key) to read in one epoch.
struct shard {
    std::string url;
    std::uint32_t epoch = 0;
    /// Position of this shard in its epoch's order (after shuffling and rank split).
    std::uint64_t index = 0;

    static constexpr std::uint64_t all = ~std::uint64_t{0};
    /// The records of this shard that this rank takes (plan sets them when it splits
    /// records among ranks or resumes mid-epoch; decoders drop the others): the ordinals
    /// in [first, end), and those listed in `extra` (sorted, all below `first`).
    std::uint64_t first = 0;
    std::uint64_t end = all;
    std::shared_ptr<const std::vector<std::uint64_t>> extra = nullptr;
    /// How many records the shard holds, when known (record counts): decoders check it.
    std::uint64_t records = all;

    bool takes(std::uint64_t ordinal) const noexcept {
        if (ordinal >= first && ordinal < end) return true;
        return extra && std::binary_search(extra->begin(), extra->end(), ordinal);
    }
    bool takes_all() const noexcept { return first == 0 && end == all; }
};

/// A piece of a shard's bytes. Chunks of one shard arrive in order; the last one has
/// `last` set (it may be empty, e.g. for an empty file).
struct chunk {
    std::shared_ptr<const shard> source;
    std::uint64_t offset = 0;  // of data[0] within the shard
    bytes data;
    bool last = false;
    /// Set by gunzip(): offsets count bytes of the uncompressed stream, not of the shard.
    bool inflated = false;
    /// Bytes before this chunk were lost: gunzip() skipped a broken stream under
    /// on_corrupt::skip (and counted it). Parsers drop the record in progress.
    bool gap = false;
    std::size_t byte_size() const noexcept { return data.size(); }
};

/// One record: its bytes and where they came from.
struct record {
    bytes data;
    std::shared_ptr<const shard> source;
    std::uint64_t index = 0;   // ordinal of the record within its shard
    std::uint64_t offset = 0;  // byte offset of the record within its shard
    /// The member's path inside an archive (tar); empty for other formats.
    std::string name = {};
    /// Set only on the way from tfrecord() to the batch() that collates the record, where
    /// nothing but shuffles lie between: the masked CRC-32C its data must have, checked by
    /// batch as it copies the bytes, so they are read once (sluice::crc32c_copy). A user's
    /// code never receives a record with it set: the parser then checks the data itself.
    std::optional<std::uint32_t> unchecked_crc32c = std::nullopt;
    std::size_t byte_size() const noexcept { return data.size(); }
    /// "url#index": names the sample in messages and key lists.
    std::string key() const {
        return (source ? source->url : std::string("?")) + "#" + std::to_string(index);
    }
    /// Copy out of a large chunk when holding only a small part of it (see bytes::compact).
    void compact(buffer_source* from = nullptr) { data = data.compact(from); }
};

/// One file of a WebDataset sample: its extension ("jpg", "seg.png", "json") and bytes.
struct field {
    std::string name = {};
    bytes data;
};

/// A WebDataset sample: the files of a tar shard that share a key, the path up to the
/// first dot of the file name ("train/000123" for "train/000123.jpg" and
/// "train/000123.cls"), one field per extension, in archive order.
struct sample {
    std::string key;
    std::vector<field> fields;
    std::shared_ptr<const shard> source;
    std::uint64_t index = 0;   // ordinal of the sample within its shard
    std::uint64_t offset = 0;  // byte offset of its first file's data within the shard

    /// The field with this extension, or nullptr.
    const bytes* find(std::string_view ext) const noexcept {
        for (auto& f : fields)
            if (f.name == ext) return &f.data;
        return nullptr;
    }
    /// The field with this extension; a sluice::error naming the sample when it has none.
    const bytes& at(std::string_view ext) const {
        if (auto* b = find(ext)) return *b;
        std::string have;
        for (auto& f : fields) have += (have.empty() ? "" : ", ") + f.name;
        throw error("sluice: sample '" + key + "' of '" + (source ? source->url : std::string("?")) +
                    "' has no field '" + std::string(ext) + "' (it has: " + have + ")");
    }
    std::size_t byte_size() const noexcept {
        std::size_t n = 0;
        for (auto& f : fields) n += f.data.size();
        return n;
    }
    void compact(buffer_source* from = nullptr) {
        for (auto& f : fields) f.data = f.data.compact(from);
    }
};

/// Whether items of type T know their shard (a `source` member pointing to it), and so
/// their epoch: records, samples, and a user's type that copies `source` over.
template <class T>
inline constexpr bool has_epoch = requires(const T& v) { v.source->epoch; };

/// The epoch of an item that knows its shard (record, sample), else nothing: shuffle and
/// batch keep epochs apart by it.
template <class T>
std::optional<std::uint32_t> epoch_of(const T& v) noexcept {
    if constexpr (requires { v.source->epoch; }) {
        if (v.source) return v.source->epoch;
    }
    return std::nullopt;
}

}  // namespace sluice
