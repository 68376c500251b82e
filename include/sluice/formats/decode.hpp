#pragma once
// What the record formats share: their options (corruption policy, gzip, limits), the
// gunzip stage, and the worker that runs a parser per shard.

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/detail/counting.hpp>
#include <sluice/formats/detail/cursor.hpp>
#include <sluice/formats/detail/gzip_inflater.hpp>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

/// Options of every format: lines(), raw(), tfrecord(), recordio(), tar(), webdataset().
struct decode_options {
    /// Corrupt input (and a record over max_record_bytes): fail with an error naming
    /// shard and byte offset, or skip and count.
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    /// Inflate gzip'd shards first. Unset: the format's default, compression::detect
    /// (".gz" names or the gzip magic), except raw(): compression::none (bytes as stored).
    std::optional<compression> gzip = std::nullopt;
    /// Check the format's checksums (TFRecord's CRC32C of length and data). Tar header
    /// checksums are always checked: they are what finds a header at all. Formats without
    /// checksums (lines, raw) ignore it.
    bool verify = true;
    /// The largest record a format gives (a line, a whole object for raw, a TFRecord, a
    /// RecordIO record, a tar member), counted in uncompressed bytes: a larger one is
    /// treated as corrupt instead of held or allocated, so a damaged length field, a file
    /// without newlines or a huge object cannot take memory without bound. What a stage
    /// holds meanwhile is in its "held_bytes" and "held_bytes_peak" counters.
    std::size_t max_record_bytes = std::size_t{1} << 30;
    /// Called for each corruption skipped under on_corrupt::skip (on the stage's worker
    /// thread: the I/O loop's for raw() where it runs there, format_defaults::hands_on, so
    /// keep it short), with the error that would have been thrown: to log what was lost.
    std::function<void(const source_error&)> on_skip = nullptr;
    /// Capacity of the output channel, in records and bytes. Left at {0, 0} (`items` 0):
    /// the format's default, {1024, 64 MiB}, except raw(): {64, 256 MiB}.
    channel_limits out = {0, 0};
    /// webdataset() only: fields (extensions) every sample must have, e.g. {"jpg", "cls"}.
    /// A sample without one is a corrupt record (an error, or under skip dropped and
    /// counted in "corrupt").
    std::vector<std::string> required = {};
};

/// Options of gunzip().
struct gzip_options {
    compression mode = compression::detect;
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    std::function<void(const source_error&)> on_skip = nullptr;
    /// Bytes per inflated chunk: what one shard being inflated holds, whatever the ratio.
    std::size_t chunk_size = 4u << 20;
    /// gunzip's record is a gzip member: the most bytes one member may inflate to (a
    /// member over it is corrupt: an error, or under skip dropped from there to the next
    /// member). No limit by default: a .gz file is usually one member, memory is bounded
    /// by chunk_size whatever the ratio, and the records of the format behind are bounded
    /// by its own max_record_bytes (in uncompressed bytes). Set it to stop a
    /// decompression bomb early rather than stream all of it.
    std::uint64_t max_record_bytes = ~std::uint64_t{0};
    channel_limits out = {16, 64u << 20};
};

namespace detail {

/// Wraps a decoder (`void d(chunk&&, std::vector<Out>&)`): passes on only the records
/// each shard's plan takes (shard::takes: the rank's share, or on resume what is needed
/// again), and at a shard's end checks it yielded as many records as its record count
/// says, since plan's positions rely on it.
template <class D>
struct selecting {
    D d;
    std::unordered_map<const shard*, std::uint64_t> yielded;

    template <class Out>
    void operator()(chunk&& c, std::vector<Out>& out) {
        const std::size_t before = out.size();
        const std::shared_ptr<const shard> src = c.source;
        const bool last = c.last;
        std::exception_ptr failed;
        try {
            d(std::move(c), out);
        } catch (...) {
            failed = std::current_exception();
        }
        if (!src) {
            if (failed) std::rethrow_exception(failed);
            return;
        }
        auto& n = yielded[src.get()];
        n += out.size() - before;
        if (!src->takes_all())
            out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(before), out.end(),
                                     [&](const Out& o) { return !src->takes(o.index); }),
                      out.end());
        if (failed) {
            yielded.erase(src.get());
            std::rethrow_exception(failed);
        }
        if (!last) return;
        const std::uint64_t got = n;
        yielded.erase(src.get());
        if (src->records != shard::all && got != src->records)
            throw source_error(src->url, "the shard yields " + std::to_string(got) + " records but the record counts say " +
                                             std::to_string(src->records) + " (counts made from other data?):");
    }
};
/// Where a hands_on format's worker may run on the I/O loop (format_defaults::hands_on):
/// `wanted` (its records go straight to a batch), if the stage at `from` (the one before
/// it) delivers there, as known once every stage's setup has run.
struct loop_hint {
    bool wanted = false;
    std::size_t from = 0;
};
// Whether the decoder will copy `c` into an object it assembles (decoders that cannot
// say: yes).
template <class D>
bool assembles(const D& d, const chunk& c) {
    if constexpr (requires { d.d.assembles(c); })
        return d.d.assembles(c);
    else
        return true;
}
template <class Out, class D>
task<void> decode_worker(stage_context<chunk, Out>& ctx, D d, loop_hint loop = {}) {
    bool on_loop = loop.wanted && delivers_on_loop(ctx.internal.run, loop.from);
    if (on_loop) co_await switch_to{ctx.rt.executor_for(pool::io)};
    std::vector<Out> outs;
    while (auto c = co_await ctx.in.next()) {
        if (on_loop && assembles(d, *c)) {  // copies belong on the pool: the rest of the run goes there
            co_await switch_to{ctx.rt.executor_for(pool::cpu)};
            on_loop = false;
        }
        std::exception_ptr failed;
        const bytes seen = c->data.file() ? c->data : bytes{};  // a mapped file's window: checked once parsed
        try {
            d(std::move(*c), outs);
        } catch (...) {
            failed = std::current_exception();
        }
        if (seen.lost()) {  // the file shrank under the parser: its records hold zeros
            outs.clear();
            try {
                throw_lost(*seen.file());
            } catch (...) {
                failed = std::current_exception();
            }
        }
        // What was decoded before a corruption goes downstream before the error.
        for (auto& o : outs) co_await ctx.out.send(std::move(o));
        outs.clear();
        if (failed) std::rethrow_exception(failed);
    }
}

// Inflating: one output chunk at a time is sent before the next is made, so a chunk that
// inflates a thousandfold never sits in memory whole.
template <class = void>  // a coroutine: compiled only where used (see make_stage)
task<void> gunzip_worker(stage_context<chunk, chunk>& ctx, gunzip_decoder d) {
    std::vector<chunk> outs;
    while (auto c = co_await ctx.in.next()) {
        std::exception_ptr failed;
        bool more = true;
        const bytes seen = c->data.file() ? c->data : bytes{};  // a mapped file's window
        try {
            d.start(std::move(*c), outs);
        } catch (...) {
            failed = std::current_exception();
        }
        for (;;) {
            if (!failed && more) {
                try {
                    more = d.step(outs);
                } catch (...) {
                    failed = std::current_exception();
                }
            }
            if (seen.lost()) {  // the file shrank under inflate: what it made of zeros is not sent
                outs.clear();
                more = false;
                try {
                    throw_lost(*seen.file());
                } catch (...) {
                    failed = std::current_exception();
                }
            }
            for (auto& o : outs) co_await ctx.out.send(std::move(o));
            outs.clear();
            if (failed) std::rethrow_exception(failed);
            if (!more) break;
        }
    }
}

/// The counter of a format stage named `name` (ops/plan.hpp counts records with it when
/// it has no record counts); null for a name it does not know.
inline record_counter record_counter_for(const std::string& name, const decode_options& o, compression gz) {
    const bool verify = o.verify;
    auto walk = [gz](auto f) -> record_counter {
        return [gz, f](shard_reader& r) {
            refuse_gzip(r, gz);
            return f(r);
        };
    };
    if (name == "tar") return walk([](shard_reader& r) { return count_tar(r, false); });
    if (name == "webdataset") return walk([](shard_reader& r) { return count_tar(r, true); });
    if (name == "tfrecord") return walk([verify](shard_reader& r) { return count_tfrecord(r, verify); });
    if (name == "recordio") return walk([](shard_reader& r) { return count_recordio(r); });
    if (name == "lines") return walk([](shard_reader& r) { return count_lines(r); });
    if (name == "raw") return [](shard_reader&) -> std::uint64_t { return 1; };  // a shard is one record
    return nullptr;
}

template <class Opt>
std::shared_ptr<parse_policy> policy_for(const Opt& o, stage_stats& st, runtime& rt) {
    auto p = std::make_shared<parse_policy>();
    p->corrupt = o.on_corrupt;
    p->on_skip = o.on_skip;
    p->mem = rt.buffers().get();
    p->skipped = &st.counter("corrupt");
    return p;
}

/// What a format stage does when its options leave a choice unset.
struct format_defaults {
    compression gzip = compression::detect;
    channel_limits out = {1024, 64u << 20};
    bool webdataset = false;  // registers the "ignored" and "incomplete" counters
    /// Its parser can leave its records' data checksums to the batch that collates them
    /// (TFRecord; parse_policy::defer_data_crc): counted in "checks_deferred".
    bool defers_data_crc = false;
    /// Its parser reads no more of a shard than its headers (tar, raw; TFRecord when its
    /// data checksums are left to batch or not verified): where its records reach a batch
    /// that collates them, the reader before it may leave the rest to that batch
    /// (detail::headers_only_after).
    bool reads_headers_only = false;
    /// Its work per chunk is mostly handing it on (raw: an object that comes whole, or as
    /// mapped windows laid end to end, goes on as it is): where its records go straight to
    /// a batch that collates them (through shuffles only; records_checked_after) and the
    /// stage before it hands its chunks over on the I/O loop (delivers_on_loop: read on the
    /// loop, fetch without a cache, from; not a gunzip stage), its worker runs there too,
    /// so a record crosses threads once on its way to the batch, not twice. At the first
    /// chunk it would copy into an object being assembled (the decoder's `assembles`), it
    /// moves to the CPU pool for the rest of the run: copies are not the loop's work.
    /// Each crossing may wake a sleeping pool thread (a futex call and a context switch):
    /// 2,000 objects over HTTP into batches of 256 made 1,829-2,194 context switches with
    /// raw on the pool and 362-509 with it on the loop, at 4-5 % less CPU (medians of
    /// alternated runs). Not before image decoding or a user's map: 4,000 JPEGs from nginx
    /// went 4 % slower with raw on the loop (bench/RESULTS.md, issue 17, twenty-seventh
    /// session).
    bool hands_on = false;
};

/// A format stage: `make(policy)` gives the decoder (`void d(chunk&&, std::vector<Out>&)`,
/// keeping one state per shard), run by one worker (a shard's chunks must meet one decoder
/// in order) on the CPU pool (or the I/O loop: format_defaults::hands_on), after a gunzip
/// stage unless the gzip option is compression::none.
template <class Out, class Make>
stage<chunk, Out> format_stage(std::string name, decode_options o, format_defaults d, Make make);

/// A format stage of one Parser per shard (see shard_parsers).
template <class Parser, class Out>
stage<chunk, Out> decoder(std::string name, decode_options o, format_defaults d = {}) {
    return format_stage<Out>(std::move(name), std::move(o), d, [](std::shared_ptr<const parse_policy> pol) {
        return shard_parsers<Parser, Out>(std::move(pol));
    });
}

}  // namespace detail

/// Takes: chunks. Gives: the same shards' bytes inflated, as chunks of `chunk_size`
/// (flagged `inflated`: their offsets count uncompressed bytes); shards that are not gzip
/// (by name or magic, under compression::detect) pass through untouched. Members of a
/// multi-member file are inflated one after another; zeros after a member are ignored.
/// Backpressure: one partly filled chunk per shard in flight plus the output channel:
/// a chunk that inflates a thousandfold (a decompression bomb) costs time, not memory.
/// A member inflating to more than `.max_record_bytes` (no limit by default) is corrupt.
/// Errors: a broken or truncated stream is a sluice::source_error naming the shard and
/// the compressed byte offset; under on_corrupt::skip it is counted ("corrupt") and
/// inflating resumes at the next member's header, if any: what the broken member's tail
/// held is lost, and the first chunk after the loss is flagged `gap`, on which parsers
/// drop the record in progress and start afresh (a tar or RecordIO stream is then read
/// in step with the new member, so shards written as one member per record or file lose
/// only what the broken member held).
/// Cancellation: stops at the next send.
/// Example: `sluice::read() | sluice::gunzip() | sluice::lines()`
/// Counting (plan without counts): shards it passes untouched are counted through it;
/// gzip'd ones are refused, naming the shard (counting them would inflate all of them).
template <class = void>  // compiled only where used (see make_stage)
stage<chunk, chunk> gunzip(gzip_options o = {}) {
    auto s = make_stage<chunk, chunk>(
        "gunzip", {.on = pool::cpu, .out = o.out}, [o](stage_context<chunk, chunk>& ctx) {
            auto pol = detail::policy_for(o, ctx.stats, ctx.rt);
            pol->max_member_bytes = o.max_record_bytes;
            return detail::gunzip_worker(ctx, detail::gunzip_decoder(std::move(pol), o.mode, o.chunk_size));
        });
    return detail::also_at_setup(std::move(s), [mode = o.mode](stage_setup& st) {
        detail::offer_passing(st.internal.run, st.internal.at, [mode](detail::shard_reader& r) { detail::refuse_gzip(r, mode); });
        // What it passes untouched, reading only the first bytes: as gzip_inflater::start decides.
        if (mode == compression::detect)
            detail::note_passes_untouched(st.internal.run, st.internal.at, [](const std::string& url, std::span<const std::byte> head) {
                return !detail::ends_with_gz(url) && !detail::starts_gzip(head);
            });
        else if (mode == compression::none)
            detail::note_passes_untouched(st.internal.run, st.internal.at, [](const std::string&, std::span<const std::byte>) { return true; });
    });
}

template <class Out, class Make>
stage<chunk, Out> detail::format_stage(std::string name, decode_options o, format_defaults d, Make make) {
    const compression gz = o.gzip.value_or(d.gzip);
    const channel_limits out = o.out.items ? o.out : d.out;
    gzip_options g;
    g.mode = gz;
    g.on_corrupt = o.on_corrupt;
    g.on_skip = o.on_skip;
    const std::string fmt = name;
    auto count = record_counter_for(fmt, o, gz);
    // Records whose next reader is a batch that collates them (through shuffles only)
    // may leave their data checksum to it (TFRecord: parse_policy::defer_data_crc).
    struct format_run {
        bool defer_data_crc = false;
        loop_hint loop;  // format_defaults::hands_on
    };
    auto setup = [defers = d.defers_data_crc && o.verify && o.on_corrupt == on_corrupt::error,
                  headers = d.reads_headers_only, crc = d.defers_data_crc && o.verify,
                  on_io = d.hands_on && gz == compression::none](stage_setup& s) {
        auto st = std::make_shared<format_run>();
        const bool checked = records_checked_after(s.internal.run, s.internal.at);
        st->defer_data_crc = defers && checked;
        st->loop = {on_io && checked, s.internal.at ? s.internal.at - 1 : 0};
        if (headers && checked && (!crc || st->defer_data_crc)) note_headers_only(s.internal.run, s.internal.at);
        return st;
    };
    auto parse = make_stage<chunk, Out>(
        std::move(name), {.on = pool::cpu, .out = out}, std::move(setup),
        [o = std::move(o), d, make = std::move(make)](stage_context<chunk, Out>& ctx, format_run& run) {
            auto pol = policy_for(o, ctx.stats, ctx.rt);
            pol->verify = o.verify;
            if (run.defer_data_crc) {
                pol->defer_data_crc = true;
                pol->deferred = &ctx.stats.counter("checks_deferred");
                // Boundaries of shards read by call kept for the next epoch (TFRecord).
                pol->index = std::make_shared<record_index>();
                pol->indexed = &ctx.stats.counter("indexed");
            }
            pol->max_record_bytes = o.max_record_bytes;
            pol->held = {&ctx.stats.counter("held_bytes"), &ctx.stats.counter("held_bytes_peak")};
            if (d.webdataset) {
                pol->ignored = &ctx.stats.counter("ignored");
                pol->incomplete = &ctx.stats.counter("incomplete");
                pol->required = o.required;
            }
            using D = decltype(make(std::shared_ptr<const parse_policy>(pol)));
            return decode_worker(ctx, selecting<D>{make(std::move(pol)), {}}, run.loop);
        },
        /*counts_records=*/true);
    // Plan may count records with this decoder's numbering (formats/detail/counting.hpp).
    if (count)
        parse = also_at_setup(std::move(parse), [count = std::move(count), fmt](stage_setup& s) {
            offer_counter(s.internal.run, s.internal.at, fmt, count);
        });
    if (gz == compression::none) return parse;
    return gunzip(std::move(g)) | std::move(parse);
}

}  // namespace sluice
