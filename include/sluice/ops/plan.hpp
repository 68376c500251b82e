#pragma once
// sluice::plan: decides which shards (and which of their records) this process reads, in
// which order, for how many epochs.

#include <sluice/core/detail/random.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/pipeline.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/core/state.hpp>
#include <sluice/ops/counts.hpp>
#include <sluice/ops/plan_link.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace sluice {

/// How many records each shard holds: what plan needs to give every rank the same number
/// of records (and so of steps), and to resume mid-epoch without reading the epoch again.
/// Keys are the URLs or paths as listed; a key that is a bare file name also matches any
/// listed URL ending in "/" + that name.
using record_counts = std::map<std::string, std::uint64_t>;

/// Reads record counts from a text file: one "COUNT NAME" per line (blank lines and `#`
/// comments skipped), as write_record_counts() and `sluice-probe --write-counts` write it.
/// Throws sluice::source_error naming the file and line.
inline std::shared_ptr<const record_counts> read_record_counts(const std::string& path) {
    errno = 0;
    std::ifstream in(path);
    if (!in)
        throw source_error(path, "cannot read the record counts",
                           errno ? std::error_code(errno, std::generic_category())
                                 : std::make_error_code(std::errc::no_such_file_or_directory));
    auto out = std::make_shared<record_counts>();
    std::string line;
    for (std::uint64_t n = 1; std::getline(in, line); ++n) {
        const auto start = line.find_first_not_of(" \t");
        if (start == std::string::npos || line[start] == '#') continue;
        std::size_t used = 0;
        std::uint64_t count = 0;
        try {
            count = std::stoull(line.substr(start), &used);
        } catch (const std::exception&) {
            used = 0;
        }
        const auto name_at = line.find_first_not_of(" \t", start + used);
        if (used == 0 || line[start] == '-' || name_at == std::string::npos || name_at == start + used)
            throw source_error(path, "line " + std::to_string(n) + " is not 'COUNT NAME' in the record counts",
                               std::make_error_code(std::errc::invalid_argument));
        std::string name = line.substr(name_at);
        while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
        (*out)[name] = count;
    }
    return out;
}

/// Writes record counts as read_record_counts() reads them.
inline void write_record_counts(const std::string& path, const record_counts& counts) {
    errno = 0;
    std::ofstream out(path, std::ios::trunc);
    for (auto& [name, n] : counts) out << n << ' ' << name << '\n';
    out.flush();
    if (!out)
        throw source_error(path, "cannot write the record counts",
                           errno ? std::error_code(errno, std::generic_category()) : std::make_error_code(std::errc::io_error));
}

/// Counts the records each shard yields by running `src` (a pipeline ending at a decoder:
/// list | plan | read or fetch | lines, tfrecord, webdataset...) once, with one epoch and
/// one rank. `urls` (sluice::expand of the same patterns) are counted as 0 when they
/// yield nothing, so an empty shard has its count too.
template <class T>
record_counts count_records(source<T> src, const std::vector<std::string>& urls = {}, pipeline_options po = {}) {
    record_counts out;
    for (auto& u : urls) out[u] = 0;
    pipeline<T> p(std::move(src), std::move(po));
    std::string last_url;
    std::uint64_t* last = nullptr;
    while (auto item = p.next_blocking()) {
        const std::string& url = item->source ? item->source->url : std::string();
        if (!last || url != last_url) {
            last_url = url;
            last = &out[url];
        }
        ++*last;
    }
    return out;
}

/// Rank and world size as the launcher set them.
struct launcher_rank {
    unsigned rank = 0;
    unsigned world = 1;
    /// The variables they came from ("RANK/WORLD_SIZE"...), empty when none was set.
    std::string from = {};
};

/// Rank and world size from the launcher's environment: RANK and WORLD_SIZE (torchrun,
/// torch.distributed), then OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI's
/// mpirun), then SLURM_PROCID and SLURM_NTASKS (srun); 0 of 1 when none is set. A pair
/// with one half missing, a value that is not a number, or a rank not below the world size
/// is a sluice::error naming the variable.
inline launcher_rank rank_from_env() {
    static constexpr const char* pairs[][2] = {
        {"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (auto& [rank_var, world_var] : pairs) {
        const char* r = std::getenv(rank_var);
        const char* w = std::getenv(world_var);
        if (!r && !w) continue;
        if (!r || !w)
            throw error(std::string("sluice: ") + (r ? world_var : rank_var) + " is not set but " +
                        (r ? rank_var : world_var) + " is: set both, or neither");
        auto number = [](const char* var, const char* v) {
            std::size_t used = 0;
            unsigned long n = 0;
            try {
                n = std::stoul(v, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used == 0 || v[used] != '\0' || v[0] == '-' || n > 1'000'000'000UL)
                throw error(std::string("sluice: ") + var + "='" + v + "' is not a number");
            return static_cast<unsigned>(n);
        };
        launcher_rank out{number(rank_var, r), number(world_var, w), std::string(rank_var) + "/" + world_var};
        if (out.world == 0 || out.rank >= out.world)
            throw error(std::string("sluice: ") + rank_var + "=" + r + " is not below " + world_var + "=" + w);
        return out;
    }
    return {};
}

/// How records are shared among ranks.
enum class share {
    /// Every rank takes floor(N / world) of the epoch's N records, a contiguous run of the
    /// epoch's order; the fewer than `world` left over are not read this epoch (with a
    /// seed, a different few each epoch). Shares are disjoint. Needs record counts when
    /// world > 1.
    drop,
    /// Every rank takes ceil(N / world) records; the last ranks' shares run on into the
    /// epoch's first records again, so a few records are read twice. Needs record counts
    /// when world > 1.
    pad,
    /// Whole shards, round robin in the epoch's order; needs no record counts, but ranks
    /// take different numbers of records when shards differ: only for ranks that do not
    /// step together (preprocessing, evaluation that does not synchronise).
    by_shard,
};

struct plan_options {
    /// How many passes over the data.
    unsigned epochs = 1;
    /// With a seed, each epoch's shard order is a permutation that depends only on
    /// (seed, epoch): the same on every rank and every run. Without one, listed order.
    /// A shuffle after plan without a seed of its own takes this one (one seed, given once).
    std::optional<std::uint64_t> seed = std::nullopt;
    /// This process's rank and the world size. Unset: from the launcher's environment
    /// (rank_from_env(): torchrun, mpirun, srun), else 0 of 1. Set both to 0 and 1 for a
    /// rank that must read everything.
    std::optional<unsigned> rank = std::nullopt;
    std::optional<unsigned> world = std::nullopt;
    /// How records are shared among ranks (see share); equal shares by default.
    sluice::share share = share::drop;
    /// Records per shard (read_record_counts, count_records). Needed for equal shares
    /// with world > 1; with them a resumed pipeline reads only what it still needs, and
    /// decoders check every shard holds the records it should (so a corrupt record
    /// skipped under on_corrupt::skip is then an error: the counts no longer hold).
    std::shared_ptr<const record_counts> counts = nullptr;
    /// Without `counts`, when ranks need them (world > 1, share::drop or pad), plan counts
    /// the records itself at its start, through the reader and the decoder after it
    /// (read or fetch; tar, webdataset, tfrecord, recordio, lines, raw), reading only what
    /// locates the records (tar headers, length fields: ranged requests for remote
    /// shards), and keeps them in `<counts_dir>/record-counts`, keyed by format, URL,
    /// size and mtime or ETag, so a later run and the other ranks of the node reuse them:
    /// one process counts, the others wait for its file (ops/counts.hpp). Unset: fetch's
    /// cache directory, else $XDG_CACHE_HOME/sluice, else ~/.cache/sluice. gzip'd shards
    /// are not counted (that would inflate all of them): pass `counts` for those.
    std::string counts_dir = {};
};

namespace detail {

struct plan_split {
    unsigned rank = 0, world = 1;
    std::string from;
};

inline plan_split resolve_rank(const plan_options& o) {
    if (o.rank.has_value() != o.world.has_value())
        throw error("sluice: plan: set both rank and world, or neither (to take them from the launcher)");
    if (o.rank) return {*o.rank, *o.world, "options"};
    auto env = rank_from_env();
    return {env.rank, env.world, env.from.empty() ? "default" : env.from};
}

/// Each listed URL's record count (or nothing without counts).
inline std::vector<std::uint64_t> counts_for(const std::vector<std::string>& urls, const record_counts& c) {
    std::map<std::string, std::uint64_t> by_name;
    std::map<std::string, int> seen;
    std::vector<std::uint64_t> out;
    out.reserve(urls.size());
    for (auto& u : urls) {
        if (auto it = c.find(u); it != c.end()) {
            out.push_back(it->second);
            continue;
        }
        const std::string name = u.substr(u.find_last_of('/') + 1);
        auto it = c.find(name);
        if (it == c.end())
            throw source_error(u, "no record count for", std::make_error_code(std::errc::invalid_argument));
        if (++seen[name] > 1)
            throw source_error(u, "the record count for '" + name + "' matches more than one listed shard, such as",
                               std::make_error_code(std::errc::invalid_argument));
        out.push_back(it->second);
    }
    return out;
}

/// The shards one rank reads in one epoch, in order, each with the records it takes.
/// `records` gets how many records the rank takes this epoch, when counts are known.
inline std::vector<shard> plan_epoch(const std::vector<std::string>& urls, const std::vector<std::uint64_t>* counts,
                                     const plan_options& o, const plan_split& sp, std::uint32_t epoch,
                                     std::optional<std::uint64_t>* records = nullptr) {
    std::vector<std::size_t> order(urls.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (o.seed) {
        rng r(mix(*o.seed, epoch));
        shuffle(order, r);
    }
    std::vector<shard> out;
    std::uint64_t index = 0;
    auto known = [&](std::size_t i) { return counts ? (*counts)[i] : shard::all; };
    if (!counts || o.share == share::by_shard || sp.world == 1) {
        std::uint64_t total = 0;
        for (std::size_t p = sp.rank; p < order.size(); p += sp.world) {
            shard s{urls[order[p]], epoch, index++};
            s.records = known(order[p]);
            total += counts ? s.records : 0;
            out.push_back(std::move(s));
        }
        if (records) *records = counts ? std::optional<std::uint64_t>(total) : std::nullopt;
        return out;
    }
    // Records split evenly: the epoch's records in order, positions [0, n); this rank takes
    // positions [lo, lo + q), wrapping round to the start under share::pad.
    std::vector<std::uint64_t> start(order.size() + 1, 0);
    for (std::size_t p = 0; p < order.size(); ++p) start[p + 1] = start[p] + (*counts)[order[p]];
    const std::uint64_t n = start.back();
    const std::uint64_t q = o.share == share::pad ? (n + sp.world - 1) / sp.world : n / sp.world;
    if (records) *records = q;
    std::uint64_t pos = std::uint64_t{sp.rank} * q;
    std::uint64_t left = q;
    while (left > 0 && n > 0) {
        const std::uint64_t at = pos % n;
        // The shard holding position `at`: the last p with start[p] <= at and records.
        auto p = static_cast<std::size_t>(std::upper_bound(start.begin(), start.end(), at) - start.begin()) - 1;
        const std::uint64_t first = at - start[p];
        const std::uint64_t take = std::min(left, start[p + 1] - at);
        shard s{urls[order[p]], epoch, index++};
        s.first = first;
        s.end = first + take;
        s.records = (*counts)[order[p]];
        out.push_back(std::move(s));
        pos += take;
        left -= take;
    }
    return out;
}

/// On resume with a replay plan: of `plan` (one epoch), only the records at the
/// requested positions (counted in the rank's order of that epoch: a shard's `extra`
/// records, then its run [first, end)).
inline std::vector<shard> replay_part(const std::vector<shard>& plan, const run_state::replay& want) {
    std::vector<shard> out;
    std::uint64_t base = 0;  // position of the shard's first taken record
    auto k = want.keep.begin();
    for (auto& s : plan) {
        const std::uint64_t ne = s.extra ? s.extra->size() : 0;
        const std::uint64_t n = ne + (std::min(s.end, s.records) - s.first);
        const std::uint64_t lo = base, hi = base + n;
        base = hi;
        auto ordinal = [&](std::uint64_t pos) { return pos - lo < ne ? (*s.extra)[pos - lo] : s.first + (pos - lo - ne); };
        std::vector<std::uint64_t> extra;
        while (k != want.keep.end() && *k < hi) {
            if (*k >= lo) extra.push_back(ordinal(*k));
            ++k;
        }
        const std::uint64_t from = std::max(want.from, lo);
        if (extra.empty() && from >= hi) continue;  // nothing of this shard is needed again
        shard t = s;
        if (from >= hi) {
            t.first = s.end;
        } else if (from - lo < ne) {  // some of its extra records, then all of its run
            extra.insert(extra.end(), s.extra->begin() + static_cast<std::ptrdiff_t>(from - lo), s.extra->end());
        } else {
            t.first = s.first + (from - lo - ne);
        }
        t.extra = extra.empty() ? nullptr : std::make_shared<const std::vector<std::uint64_t>>(std::move(extra));
        out.push_back(std::move(t));
    }
    return out;
}

/// A change of world size (run_state::reshard, from merge_states): the shards this rank
/// of the new world reads in the reshard's epoch. The epoch's records in its order are
/// positions [0, n); old rank r took positions r*q.. (q each, wrapping under pad) and
/// delivered those its `undelivered` entry leaves out. What no old rank delivered, in
/// position order, is shared among the new ranks as plan_epoch shares an epoch. Worked
/// out on runs of positions, not one by one: memory grows with the old ranks and their
/// shuffles' buffers, not with the epoch.
inline std::vector<shard> reshard_epoch(const std::vector<std::string>& urls, const std::vector<std::uint64_t>& counts,
                                        const plan_options& o, const plan_split& sp, const run_state::reshard& rs,
                                        const std::vector<run_state::replay>& undelivered, std::uint64_t& records) {
    const std::uint32_t epoch = rs.epoch;
    std::vector<std::size_t> order(urls.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (o.seed) {
        rng r(mix(*o.seed, epoch));
        shuffle(order, r);
    }
    std::vector<std::uint64_t> start(order.size() + 1, 0);
    for (std::size_t p = 0; p < order.size(); ++p) start[p + 1] = start[p] + counts[order[p]];
    const std::uint64_t n = start.back();
    const std::uint64_t q = o.share == share::pad ? (n + rs.world - 1) / rs.world : n / rs.world;
    if (undelivered.size() != rs.world)
        throw error("sluice: cannot resume into another world size: " + std::to_string(undelivered.size()) +
                    " old ranks' deliveries worked out, the state names " + std::to_string(rs.world));
    if (q != rs.records)
        throw error("sluice: cannot resume into another world size: the saved states say each of the " +
                    std::to_string(rs.world) + " old ranks took " + std::to_string(rs.records) + " records of epoch " +
                    std::to_string(epoch) + ", the record counts now give " + std::to_string(q) +
                    " (another dataset, or counts made from other data?)");
    using span = std::pair<std::uint64_t, std::uint64_t>;  // positions [first, second)
    // What the old ranks delivered, as runs of positions (a rank's run wraps under pad).
    std::vector<span> delivered;
    auto add = [&](unsigned r, std::uint64_t a, std::uint64_t b) {  // rank r's local [a, b)
        for (std::uint64_t g = std::uint64_t{r} * q + a, end = std::uint64_t{r} * q + b; g < end && n > 0;) {
            const std::uint64_t at = g % n, take = std::min(end - g, n - at);
            delivered.push_back({at, at + take});
            g += take;
        }
    };
    for (unsigned r = 0; r < rs.world; ++r) {
        const auto& u = undelivered[r];
        const std::uint64_t upto = std::min(u.from, q);
        std::uint64_t a = 0;
        for (auto k : u.keep) {
            if (k >= upto) break;
            if (k > a) add(r, a, k);
            a = std::max(a, k + 1);
        }
        if (a < upto) add(r, a, upto);
    }
    std::sort(delivered.begin(), delivered.end());
    // Left: the positions the old ranks took (all under pad; the first rs.world * q under
    // drop), less what they delivered.
    const std::uint64_t covered = o.share == share::pad ? n : std::min(n, std::uint64_t{rs.world} * q);
    std::vector<span> left;
    std::uint64_t at = 0;
    for (auto& [a, b] : delivered) {
        if (a > at) left.push_back({at, std::min(a, covered)});
        at = std::max(at, b);
        if (at >= covered) break;
    }
    if (at < covered) left.push_back({at, covered});
    std::erase_if(left, [](const span& s) { return s.first >= s.second; });
    std::vector<std::uint64_t> before(left.size() + 1, 0);  // positions left before each run
    for (std::size_t i = 0; i < left.size(); ++i) before[i + 1] = before[i] + (left[i].second - left[i].first);
    const std::uint64_t m = before.back();
    const std::uint64_t q2 = o.share == share::pad ? (m + sp.world - 1) / sp.world : m / sp.world;
    records = q2;
    // This rank's q2 of them from index rank * q2 (wrapping under pad), run by run, cut at
    // shard boundaries; a shard's pieces in a row make one item (all but its last run
    // listed as `extra`: at most the shard's own records).
    std::vector<shard> out;
    std::uint64_t index = 0;
    std::vector<span> pieces;  // of the current shard, in ordinals
    std::size_t cur = 0;
    auto flush = [&] {
        if (pieces.empty()) return;
        shard s{urls[order[cur]], epoch, index++};
        s.records = counts[order[cur]];
        s.first = pieces.back().first;
        s.end = pieces.back().second;
        if (pieces.size() > 1) {
            auto extra = std::make_shared<std::vector<std::uint64_t>>();
            for (std::size_t i = 0; i + 1 < pieces.size(); ++i)
                for (auto x = pieces[i].first; x < pieces[i].second; ++x) extra->push_back(x);
            s.extra = std::move(extra);
        }
        out.push_back(std::move(s));
        pieces.clear();
    };
    for (std::uint64_t k = 0, idx = m ? (std::uint64_t{sp.rank} * q2) % m : 0; k < q2;) {
        auto i = static_cast<std::size_t>(std::upper_bound(before.begin(), before.end(), idx) - before.begin()) - 1;
        std::uint64_t g = left[i].first + (idx - before[i]);
        const std::uint64_t run = std::min(q2 - k, left[i].second - g);
        for (const std::uint64_t g_end = g + run; g < g_end;) {  // cut at shard boundaries
            const auto p = static_cast<std::size_t>(std::upper_bound(start.begin(), start.end(), g) - start.begin()) - 1;
            const std::uint64_t lo = g - start[p], hi = std::min(g_end, start[p + 1]) - start[p];
            if (!pieces.empty() && (p != cur || lo < pieces.back().second)) flush();
            cur = p;
            if (!pieces.empty() && pieces.back().second == lo) pieces.back().second = hi;
            else pieces.push_back({lo, hi});
            g = start[p] + hi;
        }
        k += run;
        idx = (idx + run) % m;
    }
    flush();
    return out;
}

}  // namespace detail

/// Takes: paths or URLs (from list). Gives: shards ({url, epoch, index} and, with
/// record counts, which of their records this rank takes) for this rank, epoch after
/// epoch.
/// Ranks: every rank takes an equal share of each epoch (see share), so every rank steps
/// the same number of times; shares are disjoint and cover the data (share::drop leaves
/// out fewer than `world` records an epoch).
/// Resume: see core/state.hpp; with counts, a resumed plan lists only what is needed again.
/// Backpressure: suspends while downstream is full; holds the list of URLs (not data).
/// Errors: rank >= world, a launcher variable that is not a number, a shard without a
/// count: a sluice::error at the start; world > 1 without counts (unless
/// share::by_shard) where plan cannot count them (a reader or decoder of the user's own,
/// gzip'd shards): an error naming why; a shard it cannot count (unreadable, corrupt,
/// a server without ranges): a sluice::source_error naming it and the byte offset;
/// upstream errors pass through.
/// Cancellation: stops at the next send.
/// At start it tells the stages after it its seed and epochs (ops/plan_link.hpp): a
/// shuffle without a seed takes plan's; a shuffle or batch whose items do not say their
/// epoch (no `source` shard) fails the start when there are several epochs.
/// Example: `sluice::list(...) | sluice::plan({.epochs = 90, .seed = 17, .counts = counts})`
template <class = void>  // compiled only where used (see make_stage)
stage<std::string, shard> plan(plan_options o = {}) {
    struct plan_state {
        detail::plan_split split;
        bool count = false;  // plan counts the records itself (no .counts, ranks need them)
        detail::counting_board offered;  // the reader's access and the decoder's counter
    };
    auto setup = [o](stage_setup& s) {
        auto st = std::make_shared<plan_state>();
        st->split = detail::resolve_rank(o);
        const auto& sp = st->split;
        if (sp.world == 0 || sp.rank >= sp.world)
            throw error("sluice: plan: rank " + std::to_string(sp.rank) + " is not below world size " +
                        std::to_string(sp.world));
        // A change of world size (merge_states) in the epoch it resumes into: where the
        // records left live is worked out from the counts, whatever the new world.
        auto& rs = s.internal.run->resharded();
        const bool reshard = rs && s.internal.run->resume() && rs->epoch == s.internal.run->resume()->epoch;
        if (reshard && o.share == share::by_shard)
            throw error("sluice: plan: cannot resume into another world size with share::by_shard (whole shards, not "
                        "equal shares of records): use share::drop or share::pad");
        st->count = (sp.world > 1 || (reshard && rs->any_delivered())) && !o.counts && o.share != share::by_shard;
        if (st->count) {
            // Setups run last stage first: the reader and decoder after plan made their offers.
            auto b = s.internal.run->slot<detail::counting_board>("counting");
            std::lock_guard lock(b->m);
            if (!b->adjacent())
                throw error("sluice: plan: rank " + std::to_string(sp.rank) + " of " + std::to_string(sp.world) + " (" +
                            sp.from + ") needs record counts to give every rank the same number of records, and "
                            "cannot count them itself: " +
                            (!b->access  ? std::string("no reader it knows (read, fetch) follows it")
                             : !b->count ? "no decoder it knows (tar, webdataset, tfrecord, recordio, lines, raw) "
                                           "follows " + b->reader
                                         : "a stage between " + b->reader + " and " + b->format +
                                               " may change the bytes " + b->format + " decodes (only gunzip() may "
                                               "stand there)") +
                            ". Pass .counts (sluice::read_record_counts, sluice::count_records; sluice-probe "
                            "--counts), or .share = sluice::share::by_shard for ranks that need not step together");
            st->offered.access = b->access;
            st->offered.reader = b->reader;
            st->offered.cache_dir = b->cache_dir;
            st->offered.count = b->count;
            st->offered.format = b->format;
            st->offered.passing = b->passing;
            st->offered.access_at = b->access_at;
            st->offered.count_at = b->count_at;
        }
        const std::string note = std::string("seed=") + (o.seed ? std::to_string(*o.seed) : "none") +
                                 " rank=" + std::to_string(sp.rank) + " world=" + std::to_string(sp.world) +
                                 " share=" + std::to_string(int(o.share));
        if (reshard && !s.internal.run->saved_note("plan")) {
            // A merged state: the old ranks' settings less rank and world must be these.
            if (detail::run_state::without_rank(note) != rs->plan)
                throw error("sluice: cannot resume: the saved states were made with plan " + rs->plan +
                            ", this pipeline has plan " + detail::run_state::without_rank(note));
            s.internal.run->note("plan", note, /*late=*/true);
        } else {
            s.internal.run->note("plan", note);
        }
        // The stages after plan that wait on it (ops/plan_link.hpp): a shuffle without a
        // seed of its own takes this one (and only then knows what to ask for on resume);
        // items that cannot keep epochs apart are refused here when there are several.
        detail::tell_plan(s, {o.seed, o.epochs});
        if (s.internal.run->resume() && (o.counts || st->count) && s.internal.run->requested()) s.internal.run->serve();
        return st;
    };
    return make_stage<std::string, shard>(
        "plan", {.on = pool::io, .out = {256, 0}}, setup,
        [o](stage_context<std::string, shard>& ctx, plan_state& st) -> task<void> {
            std::vector<std::string> urls;
            while (auto u = co_await ctx.in.next()) urls.push_back(std::move(*u));
            std::vector<std::uint64_t> counts;
            if (o.counts) counts = detail::counts_for(urls, *o.counts);
            if (st.count) {
                // Blocking reads and a lock other processes may hold: on the CPU pool, not
                // on the I/O loop other stages share.
                co_await switch_to{ctx.rt.executor_for(pool::cpu)};
                std::exception_ptr failed;
                detail::counted_shards c;
                try {
                    c = detail::count_shards(urls, st.offered, detail::counts_dir_for(o.counts_dir, st.offered.cache_dir),
                                             ctx.stop);
                } catch (...) {
                    failed = std::current_exception();
                }
                co_await switch_to{ctx.rt.executor_for(pool::io)};
                if (ctx.stopping()) throw detail::stopped{};
                if (failed) std::rethrow_exception(failed);
                counts = std::move(c.counts);
                ctx.stats.counter("shards_counted") += c.counted;
                ctx.stats.counter("counts_reused") += c.reused;
                ctx.stats.counter("count_bytes") += c.bytes;
                ctx.stats.note("counts", c.where);
            }
            const bool have_counts = o.counts || st.count;
            // The data must be the same on resume: the listing. (Counts are checked by the
            // decoders, shard by shard; a state saved without them resumes with them.)
            std::uint64_t h = detail::fnv_offset;
            for (auto& u : urls) h = detail::fnv1a(h, u);
            char hex[17];
            std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
            ctx.internal.run->note("data", std::to_string(urls.size()) + " shards " + hex, /*late=*/true);
            std::uint32_t e = 0;
            std::optional<detail::run_state::replay> replay;
            if (auto at = ctx.internal.run->resume()) {
                e = at->epoch;
                if (ctx.internal.run->served()) replay = ctx.internal.run->requested();
            }
            const auto& rs = ctx.internal.run->resharded();
            for (; e < o.epochs; ++e) {
                std::optional<std::uint64_t> records;
                std::vector<shard> shards;
                if (rs && rs->epoch == e && rs->any_delivered()) {
                    const auto undelivered = ctx.internal.run->undelivered();
                    if (!undelivered)
                        throw error("sluice: cannot resume into another world size: no shuffle or batch after plan "
                                    "says what the old ranks delivered");
                    if (!have_counts)
                        throw error("sluice: cannot resume into another world size without record counts");
                    std::uint64_t n = 0;
                    shards = detail::reshard_epoch(urls, counts, o, st.split, *rs, *undelivered, n);
                    records = n;
                } else {
                    shards = detail::plan_epoch(urls, have_counts ? &counts : nullptr, o, st.split, e, &records);
                }
                if (records) ctx.internal.run->set_epoch_records(e, *records);
                if (replay && replay->epoch == e) shards = detail::replay_part(shards, *replay);
                for (auto& s : shards) co_await ctx.out.send(std::move(s));
            }
        });
}
template <class A>
stage<A, shard> plan(stage<A, std::string> upstream, plan_options o = {}) {
    return std::move(upstream) | plan(o);
}

}  // namespace sluice
