#pragma once
// The items that flow between the standard stages:
//   list -> std::string (a path or URL)
//   plan -> shard   (one object to read in one epoch, at its place in the epoch's order)
//   read/fetch -> chunk (a piece of a shard's bytes, in order, the last one flagged)
//   decode -> record (one record: a slice of a chunk, with where it came from)
// Formats see only chunks, never where they came from; sources see only shards.

#include <sluice/core/bytes.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace sluice {

/// One object (file, URL, S3 key) to read in one epoch.
struct shard {
    std::string url;
    std::uint32_t epoch = 0;
    /// Position of this shard in its epoch's order (after shuffling and rank split).
    std::uint64_t index = 0;
};

/// A piece of a shard's bytes. Chunks of one shard arrive in order; the last one has
/// `last` set (it may be empty, e.g. for an empty file).
struct chunk {
    std::shared_ptr<const shard> source;
    std::uint64_t offset = 0;  // of data[0] within the shard
    bytes data;
    bool last = false;
    std::size_t byte_size() const noexcept { return data.size(); }
};

/// One record: its bytes and where they came from.
struct record {
    bytes data;
    std::shared_ptr<const shard> source;
    std::uint64_t index = 0;   // ordinal of the record within its shard
    std::uint64_t offset = 0;  // byte offset of the record within its shard
    std::size_t byte_size() const noexcept { return data.size(); }
    /// "url#index": names the sample in messages and key lists.
    std::string key() const {
        return (source ? source->url : std::string("?")) + "#" + std::to_string(index);
    }
    /// Copy out of a large chunk when holding only a small part of it (see bytes::compact).
    void compact(buffer_source* from = nullptr) { data = data.compact(from); }
};

}  // namespace sluice
