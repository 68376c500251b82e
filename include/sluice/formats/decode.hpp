#pragma once
// What the record formats share: their options (corruption policy, gzip, limits), the
// gunzip stage, and the worker that runs a parser per shard.

#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/detail/cursor.hpp>
#include <sluice/formats/detail/gzip_inflater.hpp>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <memory>
#include <string>
#include <vector>

namespace sluice {

/// Options of tfrecord(), recordio(), tar() and webdataset().
struct decode_options {
    /// Corrupt input: fail with an error naming shard and byte offset, or skip and count.
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    /// Inflate gzip'd shards first (".gz" names or the gzip magic by default).
    compression gzip = compression::detect;
    /// Check the format's checksums (TFRecord's CRC32C of length and data). Tar header
    /// checksums are always checked: they are what finds a header at all.
    bool verify = true;
    /// A record larger than this is treated as corrupt instead of allocated: a damaged
    /// length field must not ask for terabytes.
    std::size_t max_record_bytes = std::size_t{1} << 30;
    /// Called for each corruption skipped under on_corrupt::skip (on the stage's worker
    /// thread), with the error that would have been thrown: to log what was lost.
    std::function<void(const source_error&)> on_skip = nullptr;
    /// Capacity of the output channel, in records and bytes.
    channel_limits out = {1024, 64u << 20};
};

/// Options of gunzip().
struct gzip_options {
    compression mode = compression::detect;
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    std::function<void(const source_error&)> on_skip = nullptr;
    /// Bytes per inflated chunk.
    std::size_t chunk_size = 4u << 20;
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
template <class Out, class D>
task<void> decode_worker(stage_context<chunk, Out>& ctx, D d) {
    std::vector<Out> outs;
    while (auto c = co_await ctx.in.next()) {
        std::exception_ptr failed;
        try {
            d(std::move(*c), outs);
        } catch (...) {
            failed = std::current_exception();
        }
        // What was decoded before a corruption goes downstream before the error.
        for (auto& o : outs) co_await ctx.out.send(std::move(o));
        outs.clear();
        if (failed) std::rethrow_exception(failed);
    }
}

// Inflating: one output chunk at a time is sent before the next is made, so a chunk that
// inflates a thousandfold never sits in memory whole.
inline task<void> gunzip_worker(stage_context<chunk, chunk>& ctx, gunzip_decoder d) {
    std::vector<chunk> outs;
    while (auto c = co_await ctx.in.next()) {
        std::exception_ptr failed;
        bool more = true;
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
            for (auto& o : outs) co_await ctx.out.send(std::move(o));
            outs.clear();
            if (failed) std::rethrow_exception(failed);
            if (!more) break;
        }
    }
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

/// A format stage: one parser per shard on one CPU worker (a shard's chunks must meet
/// one parser in order), after a gunzip stage unless compression::none.
template <class Parser, class Out>
stage<chunk, Out> decoder(std::string name, decode_options o, bool counts_ignored = false);

}  // namespace detail

/// Takes: chunks. Gives: the same shards' bytes inflated, as chunks of `chunk_size`
/// (flagged `inflated`: their offsets count uncompressed bytes); shards that are not gzip
/// (by name or magic, under compression::detect) pass through untouched. Members of a
/// multi-member file are inflated one after another; zeros after a member are ignored.
/// Backpressure: one partly filled chunk per shard in flight plus the output channel.
/// Errors: a broken or truncated stream is a sluice::source_error naming the shard and
/// the compressed byte offset; under on_corrupt::skip it is counted ("corrupt") and
/// inflating resumes at the next member's header, if any: what the broken member's tail
/// held is lost, and the first chunk after the loss is flagged `gap`, on which parsers
/// drop the record in progress and start afresh (a tar or RecordIO stream is then read
/// in step with the new member, so shards written as one member per record or file lose
/// only what the broken member held).
/// Cancellation: stops at the next send.
/// Example: `sluice::read() | sluice::gunzip() | sluice::lines()`
inline stage<chunk, chunk> gunzip(gzip_options o = {}) {
    return make_stage<chunk, chunk>(
        "gunzip", {.on = pool::cpu, .buffer = o.out}, [o](stage_context<chunk, chunk>& ctx) {
            return detail::gunzip_worker(
                ctx, detail::gunzip_decoder(detail::policy_for(o, ctx.stats, ctx.rt), o.mode, o.chunk_size));
        });
}

template <class Parser, class Out>
stage<chunk, Out> detail::decoder(std::string name, decode_options o, bool counts_ignored) {
    auto parse = make_stage<chunk, Out>(
        std::move(name), {.on = pool::cpu, .buffer = o.out},
        [o, counts_ignored](stage_context<chunk, Out>& ctx) {
            auto pol = policy_for(o, ctx.stats, ctx.rt);
            pol->verify = o.verify;
            pol->max_record_bytes = o.max_record_bytes;
            if (counts_ignored) pol->ignored = &ctx.stats.counter("ignored");
            return decode_worker(ctx, selecting<shard_parsers<Parser, Out>>{shard_parsers<Parser, Out>(std::move(pol)), {}});
        },
        /*counts_records=*/true);
    if (o.gzip == compression::none) return parse;
    gzip_options g;
    g.mode = o.gzip;
    g.on_corrupt = o.on_corrupt;
    g.on_skip = o.on_skip;
    return gunzip(std::move(g)) | std::move(parse);
}

}  // namespace sluice
