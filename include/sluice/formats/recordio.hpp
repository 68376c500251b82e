#pragma once
// sluice::recordio: MXNet's RecordIO files (.rec; optionally gzip'd).

#include <sluice/formats/decode.hpp>
#include <sluice/formats/detail/recordio_parser.hpp>

namespace sluice {

/// Takes: chunks. Gives: one record per RecordIO record (its payload; offset = where its
/// first part's header starts). Records that the writer split into continuation parts
/// are joined, with the magic word put back between parts as MXNet's reader does (one
/// copy); other records are slices of the chunk.
/// Backpressure: one record being assembled per shard plus the output channel.
/// Errors: a bad magic word, a bad continuation flag or part sequence, a truncated
/// record: a sluice::source_error naming the shard and byte offset, after every record
/// before it. Under on_corrupt::skip each is counted ("corrupt") and the parser looks for
/// the next magic word at a 4-byte boundary.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("train.rec") | sluice::plan() | sluice::read() | sluice::recordio()`
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, record> recordio(decode_options o = {}) {
    return detail::decoder<detail::recordio_parser, record>("recordio", std::move(o));
}

}  // namespace sluice
