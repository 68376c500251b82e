#pragma once
// sluice::tfrecord: TensorFlow's record files (optionally gzip'd).

#include <sluice/formats/decode.hpp>
#include <sluice/formats/detail/tfrecord_parser.hpp>

namespace sluice {

/// Takes: chunks. Gives: one record per TFRecord record (its data; offset = where its
/// length field starts). Both CRC32C checksums are checked unless `verify = false`
/// (SSE4.2 where the CPU has it: bench/RESULTS.md). Records are slices of the chunk;
/// only one cut by a chunk boundary is copied.
/// Where its records go straight to batch() (through shuffles only) and corrupt input is
/// an error, batch checks each record's data checksum as it copies the record into the
/// batch, so the bytes are read once, not twice (the parser still checks the length's;
/// "checks_deferred" in the stage's counters says how many it left). The error is the
/// same, text, shard and offset, thrown by batch when the record's batch is made (or
/// dropped, under drop_last). Gzip'd shards, any other stage after it (a map reads the
/// bytes) or on_corrupt::skip: the parser checks.
/// There, a shard read by call (read()'s default) and parsed whole and sound leaves its
/// record boundaries for the next epoch (detail::record_index: 16 bytes a record, at most
/// 2^20 records in all, bookkeeping counted): the same version of the file (path, device,
/// inode, size, modification and status-change times) is then parsed without reading
/// its headers and footers ("indexed" counts those records). Batch still checks every
/// record's data checksum; a header or footer damaged after the first epoch without a
/// write to the file (which would change its status-change time) is not seen.
/// Backpressure: one record being assembled per shard plus the output channel.
/// Errors: bad length or data checksum, a length over max_record_bytes, a truncated last
/// record: a sluice::source_error naming the shard and byte offset, after every record
/// before it. Under on_corrupt::skip: a record with a bad data checksum is dropped (its
/// length was sound, so the next one is found); after a bad length the parser scans byte
/// by byte for the next header whose length checksum holds. Each is counted in the
/// stage's "corrupt" counter.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("train-*.tfrecord.gz") | sluice::plan() | sluice::read() | sluice::tfrecord()`
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, record> tfrecord(decode_options o = {}) {
    return detail::decoder<detail::tfrecord_parser, record>("tfrecord", std::move(o), {.defers_data_crc = true, .reads_headers_only = true});
}

}  // namespace sluice
