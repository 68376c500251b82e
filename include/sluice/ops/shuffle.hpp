#pragma once
// sluice::shuffle: a seeded shuffle buffer.

#include <sluice/core/channel.hpp>
#include <sluice/core/detail/random.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/core/state.hpp>
#include <sluice/ops/plan_link.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace sluice {

struct shuffle_options {
    /// Items held; each incoming item replaces a random held one, which is sent on.
    std::size_t buffer = 10'000;
    /// Also send on once the held items exceed this many bytes (0: no byte limit).
    std::size_t max_bytes = 0;
    /// The shuffle's own seed. Unset: plan's seed (the one that orders the shards), so a
    /// seed given once to plan seeds the whole pipeline; 0 when plan has none or there is
    /// no plan before the shuffle. Set it to shuffle on a seed of its own.
    std::optional<std::uint64_t> seed = std::nullopt;
    /// Items that do not say their epoch (no `source` shard): refused at start when plan
    /// runs several epochs (epoch_policy::apart), or mixed across epochs (ignore).
    epoch_policy epochs = epoch_policy::apart;
    /// Capacity of the output channel.
    channel_limits out = {64, 0};
};

namespace detail {
template <class T>
void compact_if_possible(T& v, buffer_source* from) {
    if constexpr (requires { v.compact(from); }) v.compact(from);
    else if constexpr (requires { v.compact(); }) v.compact();
}

inline rng shuffle_rng(const shuffle_options& o, std::uint32_t epoch) {
    return rng(mix(mix(o.seed.value_or(0), 0x5368756666ULL), epoch));
}

/// What the shuffle held when the trainer had taken `position` items of `epoch`, worked
/// out by running its choices again on positions alone (they depend on nothing else
/// without max_bytes). `slots` are the held items' positions in the buffer's order;
/// items from `next_in` on had not arrived; `drained`: the epoch's input had ended and
/// `slots` are the rest of the final drain, in sending order.
struct shuffle_resume {
    std::uint32_t epoch = 0;
    rng r{0};
    std::vector<std::uint64_t> slots;
    std::uint64_t next_in = 0;
    bool drained = false;
};

/// What a shuffle's setup leaves its worker: the seed it shuffles with (its own, or plan's,
/// told at start) and, on resume, what it held.
struct shuffle_state {
    shuffle_options o;  // with the seed in effect
    std::optional<shuffle_resume> resume;
};

/// `total`: the epoch's item count (without it, whether the position lies in the final
/// drain cannot be told: nullopt). Nullopt too for a position past the epoch's end.
inline std::optional<shuffle_resume> replay_shuffle(const shuffle_options& o, stream_point at,
                                                    std::optional<std::uint64_t> total) {
    if (!total) return std::nullopt;
    shuffle_resume st;
    st.epoch = at.epoch;
    st.r = shuffle_rng(o, at.epoch);
    std::uint64_t sent = 0;
    auto& held = st.slots;
    while (sent < at.position) {
        if (st.next_in == *total) {  // the drain: a shuffle of what is held, sent in order
            shuffle(held, st.r);
            const std::uint64_t more = at.position - sent;
            if (more > held.size()) return std::nullopt;  // the saved position is past the epoch's end
            held.erase(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(more));
            st.drained = true;
            return st;
        }
        held.push_back(st.next_in++);
        if (held.size() > o.buffer) {
            std::swap(held[st.r.below(held.size())], held.back());
            held.pop_back();
            ++sent;
        }
    }
    return st;
}

template <class T>
task<void> shuffle_worker(stage_context<T, T>& ctx, shuffle_state& state) {
    const shuffle_options o = state.o;  // the seed in effect (plan's, when the shuffle has none)
    if constexpr (!has_epoch<T>)  // one buffer across epochs: no per-epoch replay
        if (ctx.internal.run)
            ctx.internal.run->epochs_unknown("the items reaching shuffle do not say which epoch they belong to; give them a "
                                    "`std::shared_ptr<const sluice::shard> source` member (copied from the record or "
                                    "sample they came from)");
    std::vector<T> held;
    held.reserve(std::min<std::size_t>(o.buffer + 1, 1 << 16));
    std::size_t held_bytes = 0;
    std::optional<std::uint32_t> epoch;
    rng r(0);
    // The end of an epoch's drain, overlapped with the next epoch's fill: one drained item
    // goes out per item that comes in, so the stages below keep working while the buffer
    // fills again (before, they waited out a whole buffer's worth of reading at every
    // epoch's start), and what is held stays at `buffer` items. The order out is the same:
    // the drain always ends before the next epoch sends its first item.
    std::vector<T> draining;
    std::size_t drained = 0;
    auto send_drained = [&]() -> task<void> {
        for (; drained < draining.size(); ++drained) co_await ctx.out.send(std::move(draining[drained]));
        draining.clear();
        drained = 0;
    };
    // Awaited only with something to send (`!draining.empty()`): a task that ends at once
    // still returns through its awaiter's frame, and without the tail call (sanitizer
    // builds) one per item overflowed the stack after some 16,000 items.
    auto drain = [&]() -> task<void> {
        if (!draining.empty()) co_await send_drained();
        shuffle(held, r);
        for (auto& v : held) co_await ctx.out.send(std::move(v));
        held.clear();
        held_bytes = 0;
    };
    // Resuming with a replay plan: the first items to arrive are the held ones, in order
    // of position; put each back in its slot, then go on as before the cut.
    if (shuffle_resume* st = state.resume ? &*state.resume : nullptr; st && ctx.internal.run && ctx.internal.run->served()) {
        epoch = st->epoch;
        r = st->r;
        std::vector<std::size_t> slot_of(st->slots.size());  // k-th by position -> slot
        for (std::size_t i = 0; i < slot_of.size(); ++i) slot_of[i] = i;
        std::sort(slot_of.begin(), slot_of.end(), [&](std::size_t a, std::size_t b) { return st->slots[a] < st->slots[b]; });
        std::vector<std::optional<T>> refill(st->slots.size());
        for (std::size_t k = 0; k < refill.size(); ++k) {
            auto item = co_await ctx.in.next();
            if (!item || epoch_of(*item).value_or(st->epoch) != st->epoch)
                throw error("sluice: shuffle: resuming, the records read again are not the ones the saved state "
                            "held (the data or its record counts changed since the state was saved)");
            compact_if_possible(*item, ctx.rt.buffers().get());
            refill[slot_of[k]] = std::move(item);
        }
        for (auto& v : refill) {
            held_bytes += byte_size_of(*v);
            held.push_back(std::move(*v));
        }
        if (st->drained) {  // already shuffled: send the rest of the drain as it stands
            for (auto& v : held) co_await ctx.out.send(std::move(v));
            held.clear();
            held_bytes = 0;
        }
        state.resume.reset();
    }
    for (;;) {
        std::optional<T> item;
        std::exception_ptr failed;
        try {
            item = co_await ctx.in.next();
        } catch (...) {
            failed = std::current_exception();
        }
        if (failed) {  // the epoch drained before the error was read still goes out first
            if (!is_stop(failed) && !draining.empty()) co_await send_drained();
            std::rethrow_exception(failed);
        }
        if (!item) break;
        // Each epoch is shuffled on its own, from a seed of (seed, epoch): its order does
        // not depend on the epochs before it, and a batch never waits on the next epoch.
        const std::uint32_t e = epoch_of(*item).value_or(0);
        if (epoch && e < *epoch) {
            // A late record of an epoch already drained (only with an unordered stage
            // above): on downstream, where batch still counts it in its own epoch.
            if (!draining.empty()) co_await send_drained();
            co_await ctx.out.send(std::move(*item));
            continue;
        }
        if (epoch != e) {
            if (epoch && o.max_bytes) {
                co_await drain();  // a byte limit counts what is held: no overlap to exceed it
            } else if (epoch) {  // the epoch ends: its drain goes out as the next one comes in
                if (!draining.empty()) co_await send_drained();
                shuffle(held, r);
                draining.swap(held);
                held.clear();
                held_bytes = 0;
            }
            epoch = e;
            r = shuffle_rng(o, e);
        }
        // A small record must not pin the large chunk it was sliced from while it waits
        // here, possibly for a long time: copy it out, or, from a mapped file, keep a view
        // of its own pages (see bytes::compact).
        compact_if_possible(*item, ctx.rt.buffers().get());
        held_bytes += byte_size_of(*item);
        held.push_back(std::move(*item));
        if (drained < draining.size()) {
            co_await ctx.out.send(std::move(draining[drained++]));
            if (drained == draining.size()) co_await send_drained();  // once per epoch: clears it
        }
        while (held.size() > o.buffer || (o.max_bytes && held_bytes > o.max_bytes)) {
            if (!draining.empty()) co_await send_drained();
            std::swap(held[r.below(held.size())], held.back());
            T v = std::move(held.back());
            held.pop_back();
            held_bytes -= byte_size_of(v);
            co_await ctx.out.send(std::move(v));
        }
    }
    co_await drain();
}

/// Works out, on resume, what the shuffle held and asks the stages above for it (see
/// core/state.hpp); with max_bytes, or without the epoch's record count, it cannot, and
/// the epoch is read again from its start. Only for items that know their epoch (records,
/// samples): a shuffle of anything else makes state() refuse (see shuffle_worker).
template <class T>
void shuffle_plan_resume(const shuffle_options& o, shuffle_state& st, run_state& run) {
    auto at = run.resume();
    if (!at || !has_epoch<T>) return;
    if (auto& rs = run.resharded(); rs && rs->any_delivered()) {
        // A change of world size (merge_states): what each old rank's shuffle had sent by
        // its position, worked out as that rank's own resume would.
        if (o.max_bytes)
            throw error("sluice: cannot resume into another world size: a shuffle with max_bytes sends by bytes held, "
                        "so what the old ranks had delivered cannot be worked out");
        std::vector<run_state::replay> old;
        for (std::size_t k = 0; k < rs->positions.size(); ++k) {
            auto r = replay_shuffle(o, {rs->epoch, rs->positions[k]}, rs->records);
            if (!r)
                throw error("sluice: cannot resume into another world size: old rank " + std::to_string(k) +
                            "'s position " + std::to_string(rs->positions[k]) + " is past its " +
                            std::to_string(rs->records) + " records of epoch " + std::to_string(rs->epoch));
            std::sort(r->slots.begin(), r->slots.end());
            old.push_back({rs->epoch, std::move(r->slots), r->next_in});
        }
        run.set_undelivered(std::move(old));
    }
    std::optional<shuffle_resume> r;
    if (o.max_bytes == 0) r = replay_shuffle(o, *at, run.epoch_records(at->epoch));
    if (!r) {
        run.request_full_replay();
        return;
    }
    run_state::replay want{at->epoch, r->slots, r->next_in};
    std::sort(want.keep.begin(), want.keep.end());
    run.request(std::move(want));
    st.resume = std::move(*r);
}

/// Without a seed of its own, the shuffle's seed (and so its replay on resume) waits for
/// plan's setup, which runs after this one (see ops/plan_link.hpp).
template <class T>
std::shared_ptr<shuffle_state> shuffle_setup(const shuffle_options& o, stage_setup& s) {
    s.internal.run->note("shuffle", "buffer=" + std::to_string(o.buffer) + " max_bytes=" + std::to_string(o.max_bytes) +
                              " seed=" + (o.seed ? std::to_string(*o.seed) : std::string("plan")));
    if (s.internal.fixed_bytes) *s.internal.fixed_bytes += o.max_bytes;
    // Only items that may be views of a file's bytes: a shuffle of decoded images or of
    // batches holds memory of their own, and the reader should not map small files for it.
    if constexpr (std::is_same_v<T, record> || std::is_same_v<T, sample> || std::is_same_v<T, chunk>)
        note_records_held(s.internal.run, s.internal.at);
    // It moves records without reading their bytes: a checksum left to the batch after it
    // still gets checked there (see detail::records_checked_after).
    if constexpr (std::is_same_v<T, record>) note_record_checks(s.internal.run, s.internal.at, false);
    auto st = std::make_shared<shuffle_state>();
    st->o = o;
    st->o.seed = o.seed.value_or(0);
    check_epochs_at_start<T>(s, "shuffle", o.epochs);
    if (o.seed) {
        shuffle_plan_resume<T>(st->o, *st, *s.internal.run);
        return st;
    }
    listen_for_plan(s, [st](const plan_facts& f, run_state& run) {
        st->o.seed = f.seed.value_or(0);
        shuffle_plan_resume<T>(st->o, *st, run);
    });
    return st;
}

/// The shuffle stage for items of type T (what shuffle() makes once it is attached).
template <class T>
stage<T, T> shuffle_stage(shuffle_options o) {
    return make_stage<T, T>(
        "shuffle", {.on = pool::cpu, .out = o.out}, [o](stage_setup& s) { return shuffle_setup<T>(o, s); },
        [](stage_context<T, T>& ctx, shuffle_state& st) { return shuffle_worker<T>(ctx, st); });
}
}  // namespace detail

/// Takes: items of any type T. Gives: the same items in a seeded random order: each
/// incoming item joins a buffer of `buffer` items and a random one of them leaves; at the
/// end of each epoch (items that know their shard: records, samples) the rest leave in
/// random order. The order is a pure function of the input order, the seed and the epoch.
/// The seed: `.seed` when set, else plan's (`plan({.seed})` seeds shard order and shuffle
/// both), else 0.
/// Items: any T; to keep epochs apart (and be resumable) T needs a
/// `std::shared_ptr<const sluice::shard> source` member (records and samples have it; a
/// user's type copies it from the record or sample it is made from). Without one, a
/// pipeline whose plan runs several epochs fails at start naming the stage and the type,
/// unless `.epochs = sluice::epoch_policy::ignore` lets epochs mix; with one epoch, or no
/// plan, such items are one stream (state() then refuses).
/// Resumable (core/state.hpp): on resume it works out what it held from the saved
/// position and has only that read again.
/// Backpressure: holds at most `buffer` items (and at most `max_bytes` bytes when set) plus
/// its output channel; records are compacted (copied out of their chunk when they would
/// pin a much larger buffer), so held memory is the records' own size.
/// Errors: upstream errors pass through (held items are dropped with the error).
/// Cancellation: stops at the next send and frees what it holds.
/// Example: `| sluice::shuffle({.buffer = 10'000, .seed = 17})`
inline auto shuffle(shuffle_options o = {}) {
    auto make = [o]<class T>() { return detail::shuffle_stage<T>(o); };
    return detail::deferred<decltype(make)>{make};
}
template <class A, class B>
stage<A, B> shuffle(stage<A, B> upstream, shuffle_options o = {}) {
    return std::move(upstream) | shuffle(o);
}

}  // namespace sluice
