#pragma once
// sluice::tar and sluice::webdataset: POSIX tar shards (ustar, GNU, pax; optionally
// gzip'd), as files or as WebDataset samples.

#include <sluice/formats/decode.hpp>
#include <sluice/formats/detail/tar_parser.hpp>

namespace sluice {

/// Takes: chunks. Gives: one record per regular file in the archive, with its path in
/// `record.name` (after GNU long names and pax `path`/`size` are applied) and
/// offset = where its data starts. Directories, links, devices and other non-regular
/// members are skipped. Contents are slices of the chunk; a file cut by a chunk boundary
/// is copied.
/// Backpressure: one file being assembled per shard plus the output channel.
/// Errors: a bad header checksum or field, a bad pax header, a file over
/// max_record_bytes, a truncated archive, a member after the end-of-archive marker: a
/// sluice::source_error naming the shard and byte offset, after every file before it.
/// Under on_corrupt::skip each is counted ("corrupt") and the parser looks for the next
/// valid header at a 512-byte boundary.
/// Cancellation: stops at the next send.
/// Example: `sluice::list("shards/*.tar") | sluice::plan() | sluice::read() | sluice::tar()`
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, record> tar(decode_options o = {}) {
    return detail::decoder<detail::tar_parser, record>("tar", std::move(o), {.reads_headers_only = true});
}

/// Takes: chunks of tar shards. Gives: WebDataset samples: consecutive files sharing a
/// key (the path up to the first dot of the file name) make one sample, with one field
/// per extension (lower-cased, e.g. "jpg", "seg.png"). Files without an extension are
/// ignored and counted ("ignored"), as WebDataset does. A sample never spans two shards.
/// Errors: those of tar(), a key repeating an extension in one sample (under
/// on_corrupt::skip: the repeat is dropped and counted), and a sample without one of the
/// `.required` fields (e.g. `webdataset({.required = {"jpg", "cls"}})`; under skip:
/// dropped and counted in "corrupt"). Under on_corrupt::error the samples completed
/// before the corruption are delivered; the one still open (whose files may continue
/// past the corrupt point) is not.
/// Under on_corrupt::skip no sample is given out partial: a corruption that loses bytes
/// (a bad header, a member over max_record_bytes, a broken gzip member, a truncated
/// archive) may have cut the sample open at it and the sample begun right after it (its
/// first files may have been in the lost bytes), so both are dropped and counted in the
/// stage's "incomplete" counter (the corruption itself in "corrupt"): one corruption
/// costs at most two samples. A member after the end-of-archive marker loses nothing.
/// Example:
///   for (auto& s : sluice::pipeline(sluice::list("shards/{000..099}.tar") | sluice::plan() |
///                                   sluice::read() | sluice::webdataset()))
///       decode_jpeg(s.at("jpg")), label(s.at("cls"));
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, sample> webdataset(decode_options o = {}) {
    return detail::decoder<detail::webdataset_parser, sample>("webdataset", std::move(o), {.webdataset = true});
}

}  // namespace sluice
