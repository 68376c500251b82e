#pragma once
// Where a pipeline stands in its sequence, and how a new pipeline resumes from there.
//
// The sequence of a deterministic pipeline (every stage ordered, a seed) is a pure
// function of the data and (seed, epoch, rank, world). So its state after any batch is
// small: the epoch, how many records of it the trainer has taken (the position), and the
// settings that define the sequence, which a resumed pipeline must share. The batch stage
// stamps every batch with its (epoch, position); pipeline::state() writes the last one the
// trainer took as a few lines of text; pipeline_options::resume reads it back.
//
// Resuming rebuilds what the stages held (a shuffle buffer) by rereading, not by saving
// it: the shuffle works out from the saved position which records it had already sent
// and which it still held, plan turns that into the shards and records to read again
// (record counts say where each position lives), and decoders drop the rest. Without
// record counts the epoch is read again from its start and the batch stage drops the
// records already delivered: exact, but slower (see README, "Resuming").

#include <sluice/core/error.hpp>

#include <algorithm>
#include <set>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace sluice {

/// A point in the sequence: after `position` records of `epoch`.
struct stream_point {
    std::uint32_t epoch = 0;
    std::uint64_t position = 0;
};

namespace detail {

/// Shared by the stages of one pipeline run (stage_setup::internal.run,
/// stage_context::run): library plumbing, which a user's stage never needs.
class run_state {
public:
    /// What the shuffle (or, without one, the batch stage) asks of the stages above it on
    /// resume: the records of `epoch`, counted at its input, that it needs again: those at
    /// positions listed in `keep` (sorted, below `from`) and every one from `from` on.
    struct replay {
        std::uint32_t epoch = 0;
        std::vector<std::uint64_t> keep;
        std::uint64_t from = 0;
    };

    /// A world-size change (merge_states): where each rank of the world that saved the
    /// states stood in `epoch`. The new ranks share the records of that epoch no old rank
    /// delivered (ops/plan.hpp); later epochs are planned for the new world as usual.
    struct reshard {
        std::uint32_t epoch = 0;
        unsigned world = 0;                    // the old world size
        std::uint64_t records = 0;             // what each old rank takes in `epoch`
        std::vector<std::uint64_t> positions;  // how many of them it delivered, by rank
        std::string plan;                      // the old ranks' plan settings less rank and world
        bool any_delivered() const {
            return std::any_of(positions.begin(), positions.end(), [](std::uint64_t p) { return p > 0; });
        }
    };

    run_state() = default;
    /// From a blob written by pipeline::state() or merge_states(); throws sluice::error on
    /// a malformed one.
    explicit run_state(const std::string& blob) { parse(blob); }

    /// The point to resume from, when this run resumes.
    const std::optional<stream_point>& resume() const noexcept { return resume_; }

    /// The world-size change this run resumes into, while it is in that epoch.
    const std::optional<reshard>& resharded() const noexcept { return reshard_; }
    /// Whether the saved state noted `key` (a merged state has no plan note: its ranks differ).
    bool saved_note(const std::string& key) const {
        std::lock_guard lock(m_);
        return saved_notes_.count(key) != 0;
    }
    /// Set at setup by the stage nearest plan that knows the order (a shuffle, else batch):
    /// for each old rank of the reshard, the records of the epoch it had not delivered
    /// (replay: those at `keep` and from `from` on, in that rank's order), worked out from
    /// its position as a resume of that rank would.
    void set_undelivered(std::vector<replay> by_old_rank) {
        std::lock_guard lock(m_);
        undelivered_ = std::move(by_old_rank);
    }
    std::optional<std::vector<replay>> undelivered() const {
        std::lock_guard lock(m_);
        return undelivered_;
    }

    /// A setting that defines the sequence (`key` is the stage, `value` its settings as
    /// text). On resume it must equal what the saved state recorded: a different seed or
    /// world size would give a different sequence, so that is an error naming both.
    /// `late`: noted by a worker once it runs (plan notes the listing); a state saved
    /// before that has none, which is no mismatch.
    void note(const std::string& key, const std::string& value, bool late = false) {
        std::lock_guard lock(m_);
        if (resume_) {
            auto it = saved_notes_.find(key);
            if (it == saved_notes_.end() && late) {
                notes_[key] = value;
                return;
            }
            if (it == saved_notes_.end())
                throw error("sluice: cannot resume: the saved state was made without " + key + ", this pipeline has " +
                            key + " " + value);
            if (it->second != value)
                throw error("sluice: cannot resume: the saved state was made with " + key + " " + it->second +
                            ", this pipeline has " + key + " " + value);
        }
        notes_[key] = value;
    }
    /// After every stage's setup: a stage the saved pipeline had and this one lacks
    /// (notes made later, by workers, are named in `later`).
    void check_noted(const std::vector<std::string>& later = {"data"}) const {
        std::lock_guard lock(m_);
        if (!resume_) return;
        for (auto& [k, v] : saved_notes_)
            if (!notes_.count(k) && std::find(later.begin(), later.end(), k) == later.end())
                throw error("sluice: cannot resume: the saved state was made with " + k + " " + v +
                            ", this pipeline has no " + k);
    }

    /// Records this rank takes in `epoch`, when known (plan, with record counts).
    void set_epoch_records(std::uint32_t epoch, std::uint64_t n) {
        std::lock_guard lock(m_);
        epoch_records_[epoch] = n;
        // Plan may run many epochs ahead of the trainer on a small dataset: keep plenty.
        if (epoch_records_.size() > 4096) epoch_records_.erase(epoch_records_.begin());
    }
    std::optional<std::uint64_t> epoch_records(std::uint32_t epoch) const {
        std::lock_guard lock(m_);
        return records_locked(epoch);
    }

    /// Set at setup by the stage nearest the consumer that knows the order (see replay).
    void request(replay r) {
        std::lock_guard lock(m_);
        request_ = std::move(r);
    }
    /// No stage above may skip records (the shuffle cannot work out what it held): the
    /// epoch is read again from its start.
    void request_full_replay() {
        std::lock_guard lock(m_);
        request_.reset();
        full_replay_ = true;
    }
    std::optional<replay> requested() const {
        std::lock_guard lock(m_);
        if (full_replay_) return std::nullopt;
        return request_;
    }
    /// Plan (at setup) takes the request on: it will read only the records asked for.
    void serve() {
        std::lock_guard lock(m_);
        served_ = true;
    }
    bool served() const {
        std::lock_guard lock(m_);
        return served_;
    }

    /// The batch stage records where each batch it sends ends, in sending order; the
    /// pipeline takes one per item the trainer takes (the stages after batch give one
    /// item per batch: to_device, map), so batches of any type have a position.
    void push_stamp(stream_point p) {
        std::lock_guard lock(m_);
        stamps_.push_back(p);
    }
    std::optional<stream_point> pop_stamp() {
        std::lock_guard lock(m_);
        if (stamps_.empty()) return std::nullopt;
        auto p = stamps_.front();
        stamps_.pop_front();
        return p;
    }
    /// A stage whose items do not say which epoch they belong to (a user type without a
    /// `source` shard) cannot keep epochs apart, so positions mean nothing: state() then
    /// refuses, naming it.
    void epochs_unknown(const std::string& why) {
        std::lock_guard lock(m_);
        if (unknown_.empty()) unknown_ = why;
    }
    std::string why_unknown() const {
        std::lock_guard lock(m_);
        return unknown_;
    }

    /// The blob for a pipeline that has delivered up to `at`.
    std::string serialize(stream_point at) const {
        std::lock_guard lock(m_);
        std::ostringstream o;
        o << "sluice-state 1\n";
        o << "epoch " << at.epoch << "\n";
        o << "position " << at.position << "\n";
        if (auto n = records_locked(at.epoch)) o << "epoch_records " << *n << "\n";
        // Still in that epoch, with records the old ranks delivered (else it is a plain state).
        if (reshard_ && reshard_->epoch == at.epoch && reshard_->any_delivered()) write_reshard(o, *reshard_);
        for (auto& [k, v] : notes_) o << "note " << k << " " << v << "\n";
        return o.str();
    }

    /// Plan's settings as a merged state keeps them: without rank= and world=.
    static std::string without_rank(const std::string& plan_note) {
        std::istringstream in(plan_note);
        std::string out, word;
        while (in >> word)
            if (!word.starts_with("rank=") && !word.starts_with("world=")) out += (out.empty() ? "" : " ") + word;
        return out;
    }

    /// See sluice::merge_states.
    static std::string merge(const std::vector<std::string>& blobs) {
        if (blobs.empty()) throw error("sluice: merge_states: no states given");
        const unsigned world = static_cast<unsigned>(blobs.size());
        std::deque<run_state> s;  // deque: built in place (a run_state holds a mutex)
        for (std::size_t i = 0; i < blobs.size(); ++i) {
            try {
                s.emplace_back(blobs[i]);
            } catch (const error& e) {
                std::string why = e.what();
                if (why.starts_with("sluice: cannot resume: ")) why = why.substr(23);
                throw error("sluice: merge_states: state " + std::to_string(i) + ": " + why);
            }
        }
        auto field = [](const std::string& note, const std::string& key) -> std::optional<unsigned long> {
            std::istringstream in(note);
            for (std::string w; in >> w;)
                if (w.starts_with(key + "=")) {
                    try {
                        return std::stoul(w.substr(key.size() + 1));
                    } catch (const std::exception&) {
                        return std::nullopt;
                    }
                }
            return std::nullopt;
        };
        // First the world each state was saved in: all the same, and as many states as that.
        std::optional<unsigned long> saved_world;
        for (std::size_t i = 0; i < s.size(); ++i) {
            auto plan = s[i].saved_notes_.find("plan");
            auto w = plan == s[i].saved_notes_.end() ? std::nullopt : field(plan->second, "world");
            if (!w) continue;  // named below
            if (saved_world && *w != *saved_world)
                throw error("sluice: merge_states: state " + std::to_string(i) + " was saved in a world of " +
                            std::to_string(*w) + " ranks, the states before it in one of " + std::to_string(*saved_world));
            saved_world = w;
        }
        reshard r;
        r.world = world;
        r.positions.assign(world, 0);
        std::vector<int> from(world, -1);  // old rank -> which state
        for (std::size_t i = 0; i < s.size(); ++i) {
            const auto& st = s[i];
            const std::string which = "state " + std::to_string(i);
            if (st.reshard_)
                throw error("sluice: merge_states: " + which + " was saved in epoch " + std::to_string(st.reshard_->epoch) +
                            ", which a change of world size resumed into; resume it at its own world size until that "
                            "epoch ends, then merge the states saved after it");
            auto plan = st.saved_notes_.find("plan");
            if (plan == st.saved_notes_.end())
                throw error("sluice: merge_states: " + which + " has no plan (only a pipeline with sluice::plan can "
                            "change its world size)");
            const auto rank = field(plan->second, "rank"), w = field(plan->second, "world");
            if (!rank || !w) throw error("sluice: merge_states: " + which + "'s plan says no rank or world: '" + plan->second + "'");
            if (*w != world)
                throw error("sluice: merge_states: " + which + " was saved by rank " + std::to_string(*rank) + " of " +
                            std::to_string(*w) + ", but " + std::to_string(world) +
                            " states were given: give the states of every rank, one each");
            if (*rank >= world)
                throw error("sluice: merge_states: " + which + "'s rank " + std::to_string(*rank) + " is not below its world " +
                            std::to_string(world));
            if (from[*rank] >= 0)
                throw error("sluice: merge_states: rank " + std::to_string(*rank) + " is given twice (states " +
                            std::to_string(from[*rank]) + " and " + std::to_string(i) + ")");
            from[*rank] = static_cast<int>(i);
            if (field(plan->second, "share") == 2u)
                throw error("sluice: merge_states: the ranks took whole shards (share::by_shard), not equal shares of "
                            "records: a change of world size needs share::drop or share::pad");
            const auto& first = s[0];
            if (st.resume_->epoch != first.resume_->epoch)
                throw error("sluice: merge_states: the states stand in different epochs (" + which + ": epoch " +
                            std::to_string(st.resume_->epoch) + ", state 0: epoch " + std::to_string(first.resume_->epoch) +
                            "): save every rank's state after the same step");
            if (st.saved_records_ != first.saved_records_)
                throw error("sluice: merge_states: " + which + " and state 0 disagree on the records a rank takes in epoch " +
                            std::to_string(st.resume_->epoch) + " (made from other data?)");
            std::set<std::string> keys;
            for (auto* x : {&st, &first})
                for (auto& [k, v] : x->saved_notes_) keys.insert(k);
            for (auto& k : keys) {
                auto a = st.saved_notes_.find(k), b = first.saved_notes_.find(k);
                const std::string va = a == st.saved_notes_.end() ? "(none)" : k == "plan" ? without_rank(a->second) : a->second;
                const std::string vb = b == first.saved_notes_.end() ? "(none)" : k == "plan" ? without_rank(b->second) : b->second;
                if (va != vb)
                    throw error("sluice: merge_states: " + which + " was made with " + k + " " + va + ", state 0 with " +
                                k + " " + vb + ": the states must come from one run");
            }
            if (st.saved_records_ && st.resume_->position > *st.saved_records_)
                throw error("sluice: merge_states: " + which + "'s position " + std::to_string(st.resume_->position) +
                            " is past the " + std::to_string(*st.saved_records_) + " records its rank takes in epoch " +
                            std::to_string(st.resume_->epoch));
            r.positions[*rank] = st.resume_->position;
        }
        r.epoch = s[0].resume_->epoch;
        r.plan = without_rank(s[0].saved_notes_.at("plan"));
        if (r.any_delivered() && !s[0].saved_records_)
            throw error("sluice: merge_states: the states do not say how many records a rank takes in epoch " +
                        std::to_string(r.epoch) + " (saved without record counts: a run of one rank has them only "
                        "when given plan_options::counts): a change of world size needs them");
        r.records = s[0].saved_records_.value_or(0);
        std::ostringstream o;
        o << "sluice-state 1\n";
        o << "epoch " << r.epoch << "\n";
        o << "position 0\n";  // of the new rank's share of what is left
        write_reshard(o, r);
        for (auto& [k, v] : s[0].saved_notes_)
            if (k != "plan") o << "note " << k << " " << v << "\n";
        return o.str();
    }

    /// A per-run slot of type T, made on first use and living as long as this run's
    /// state: what stages tell each other at start without a global keyed by address
    /// (plan tells shuffle its seed). The caller synchronises what it keeps in it.
    template <class T>
    std::shared_ptr<T> slot(const std::string& key) {
        std::lock_guard lock(m_);
        auto& p = slots_[key];
        if (!p) p = std::make_shared<T>();
        return std::static_pointer_cast<T>(p);
    }

private:
    std::optional<std::uint64_t> records_locked(std::uint32_t epoch) const {
        if (auto it = epoch_records_.find(epoch); it != epoch_records_.end()) return it->second;
        if (resume_ && saved_records_ && resume_->epoch == epoch) return saved_records_;
        return std::nullopt;
    }

    static void write_reshard(std::ostream& o, const reshard& r) {
        o << "reshard " << r.epoch << " " << r.world << " " << r.records;
        for (auto p : r.positions) o << " " << p;
        o << "\nreshard_plan " << r.plan << "\n";
    }

    void parse(const std::string& blob) {
        std::istringstream in(blob);
        std::string line;
        if (!std::getline(in, line) || line != "sluice-state 1")
            throw error("sluice: cannot resume: not a sluice state (it should start with 'sluice-state 1')");
        stream_point p;
        bool have_epoch = false, have_position = false;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            const auto sp = line.find(' ');
            const std::string key = line.substr(0, sp);
            const std::string rest = sp == std::string::npos ? "" : line.substr(sp + 1);
            auto number = [&]() -> std::uint64_t {
                std::size_t used = 0;
                std::uint64_t v = 0;
                try {
                    v = std::stoull(rest, &used);
                } catch (const std::exception&) {
                    used = 0;
                }
                if (used == 0 || used != rest.size() || rest.starts_with('-'))
                    throw error("sluice: cannot resume: bad number in the state's line '" + line + "'");
                return v;
            };
            if (key == "epoch") p.epoch = static_cast<std::uint32_t>(number()), have_epoch = true;
            else if (key == "position") p.position = number(), have_position = true;
            else if (key == "epoch_records") saved_records_ = number();
            else if (key == "reshard") {
                std::istringstream words(rest);
                std::vector<std::uint64_t> v;
                std::string w;
                while (words >> w) {
                    std::size_t used = 0;
                    try {
                        v.push_back(std::stoull(w, &used));
                    } catch (const std::exception&) {
                        used = 0;
                    }
                    if (used == 0 || used != w.size() || w.starts_with('-'))
                        throw error("sluice: cannot resume: bad number in the state's line '" + line + "'");
                }
                if (v.size() < 4 || v[1] != v.size() - 3 || v[0] > 0xffffffffu)
                    throw error("sluice: cannot resume: the state's line '" + line +
                                "' is not 'reshard EPOCH WORLD RECORDS' and a position for each rank");
                reshard r;
                r.epoch = static_cast<std::uint32_t>(v[0]);
                r.world = static_cast<unsigned>(v[1]);
                r.records = v[2];
                r.positions.assign(v.begin() + 3, v.end());
                if (reshard_) r.plan = reshard_->plan;
                reshard_ = std::move(r);
            } else if (key == "reshard_plan") {
                if (!reshard_) reshard_.emplace();
                reshard_->plan = rest;
            }
            else if (key == "note") {
                const auto sp2 = rest.find(' ');
                saved_notes_[rest.substr(0, sp2)] = sp2 == std::string::npos ? "" : rest.substr(sp2 + 1);
            } else
                throw error("sluice: cannot resume: unknown line in the state: '" + line + "'");
        }
        if (!have_epoch || !have_position) throw error("sluice: cannot resume: the state has no epoch or position");
        if (reshard_ && (reshard_->world == 0 || reshard_->plan.empty() || reshard_->epoch != p.epoch))
            throw error("sluice: cannot resume: the state's reshard lines are incomplete or name another epoch");
        resume_ = p;
    }

    mutable std::mutex m_;
    std::map<std::string, std::shared_ptr<void>> slots_;
    std::optional<stream_point> resume_;
    std::optional<std::uint64_t> saved_records_;
    std::map<std::string, std::string> saved_notes_;
    std::map<std::string, std::string> notes_;
    std::map<std::uint32_t, std::uint64_t> epoch_records_;
    std::optional<replay> request_;
    std::optional<reshard> reshard_;
    std::optional<std::vector<replay>> undelivered_;
    std::deque<stream_point> stamps_;
    std::string unknown_;
    bool full_replay_ = false;
    bool served_ = false;
};

/// A stage that holds many records at once (a shuffle's buffer of records) says so at
/// setup, for the readers before it: a reader whose records are held maps even small
/// files, so that what is held is the page cache rather than fresh memory (io/local.hpp).
/// Setups run last stage first, so a reader's setup sees every holder after it.
struct records_holders {
    std::mutex m;
    std::size_t first_at = static_cast<std::size_t>(-1);  // the nearest holder's place in the chain
};
inline void note_records_held(run_state* run, std::size_t at) {
    if (!run) return;
    auto h = run->slot<records_holders>("records_held");
    std::lock_guard lock(h->m);
    h->first_at = std::min(h->first_at, at);
}
/// Whether a stage after `at` holds records.
inline bool records_held_after(run_state* run, std::size_t at) {
    if (!run) return false;
    auto h = run->slot<records_holders>("records_held");
    std::lock_guard lock(h->m);
    return h->first_at != static_cast<std::size_t>(-1) && h->first_at > at;
}

/// Where a record's data checksum may wait for its collation: a batch() of records says
/// at setup that it checks them as it copies (`checks`), a stage that passes records on
/// whole and never checks them (a shuffle, batch's grouping) that it passes them; a format
/// stage leaves its data checksum to collation only when every stage after it, up to one
/// that checks, passes records on (any other stage, a user's map, reads the bytes and so
/// gets them checked). Setups run last stage first, so a format's setup sees them all.
struct record_checkers {
    std::mutex m;
    std::map<std::size_t, bool> at;  // place in the chain -> checks (true) or passes (false)
};
inline void note_record_checks(run_state* run, std::size_t at, bool checks) {
    if (!run) return;
    auto h = run->slot<record_checkers>("record_checkers");
    std::lock_guard lock(h->m);
    h->at[at] = checks;
}
/// Which stages hand their items over on the I/O loop: the pipeline notes each stage's
/// `.on` before the setups, and a stage whose items come from elsewhere at times says so
/// at setup (fetch with a cache reads its hits on the CPU pool). For a stage that runs
/// where its input arrives (format_defaults::hands_on).
struct loop_deliverers {
    std::mutex m;
    std::map<std::size_t, bool> at;
};
inline void note_delivers_on_loop(run_state* run, std::size_t at, bool on_loop) {
    if (!run) return;
    auto h = run->slot<loop_deliverers>("loop_deliverers");
    std::lock_guard lock(h->m);
    h->at[at] = on_loop;
}
/// Whether the stage at `at` hands its items over on the I/O loop (false when unknown).
inline bool delivers_on_loop(run_state* run, std::size_t at) {
    if (!run) return false;
    auto h = run->slot<loop_deliverers>("loop_deliverers");
    std::lock_guard lock(h->m);
    auto it = h->at.find(at);
    return it != h->at.end() && it->second;
}

/// Whether the records a stage at `at` gives reach, untouched, one that checks them.
inline bool records_checked_after(run_state* run, std::size_t at) {
    if (!run) return false;
    auto h = run->slot<record_checkers>("record_checkers");
    std::lock_guard lock(h->m);
    for (auto it = h->at.find(at + 1); it != h->at.end() && it->first == ++at; ++it)
        if (it->second) return true;
    return false;
}

/// Which shards' bytes the stages after a reader leave unread but for headers, for a
/// reader that can then leave a mapped shard's pages out of the process and let batch's
/// collation copy each record from the page cache with pread (io/local.hpp,
/// detail::file_mapping::by_call). A format stage notes `headers_only` when it reads no
/// more than its headers and its records reach, untouched, a batch that collates them
/// (records_checked_after); a stage that passes some shards on untouched and reads the
/// others whole (gunzip under compression::detect) notes which, by name and first bytes.
/// Setups run last stage first, so a reader's setup sees the stages after it.
using passes_untouched = std::function<bool(const std::string& url, std::span<const std::byte> head)>;
struct byte_readers {
    std::mutex m;
    std::set<std::size_t> headers_only;
    std::map<std::size_t, passes_untouched> passes;
};
inline void note_headers_only(run_state* run, std::size_t at) {
    if (!run) return;
    auto h = run->slot<byte_readers>("byte_readers");
    std::lock_guard lock(h->m);
    h->headers_only.insert(at);
}
inline void note_passes_untouched(run_state* run, std::size_t at, passes_untouched which) {
    if (!run) return;
    auto h = run->slot<byte_readers>("byte_readers");
    std::lock_guard lock(h->m);
    h->passes[at] = std::move(which);
}
/// For a reader at `at`: which of its shards (by url and first bytes) reach a stage that
/// reads only their headers, through stages that pass them untouched; null when none do.
inline passes_untouched headers_only_after(run_state* run, std::size_t at) {
    if (!run) return nullptr;
    auto h = run->slot<byte_readers>("byte_readers");
    std::lock_guard lock(h->m);
    std::vector<passes_untouched> through;
    for (std::size_t i = at + 1;; ++i) {
        if (h->headers_only.count(i))
            return [through](const std::string& url, std::span<const std::byte> head) {
                for (auto& f : through)
                    if (!f(url, head)) return false;
                return true;
            };
        auto p = h->passes.find(i);
        if (p == h->passes.end()) return nullptr;
        through.push_back(p->second);
    }
}

}  // namespace detail

/// Merges the states saved by every rank of a world (pipeline::state(), one per rank,
/// after the same step) into one state from which a world of any other size resumes:
/// give it to every new rank as pipeline_options::resume. The new ranks share equally
/// the records of the saved epoch that no old rank had delivered (under share::drop,
/// fewer than the new world size of them wait for the next epoch; under share::pad a few
/// are read twice), so nothing delivered is repeated and nothing is lost; the epochs
/// after it are planned for the new world as in any run. Needs plan with equal shares
/// (drop or pad) and record counts (given or counted), and a shuffle without max_bytes.
/// The states must come from one run: the same settings and data, the same epoch. A
/// state saved in the epoch a merged state resumed into resumes at its own world size;
/// merge the states saved after that epoch to change again. Throws sluice::error naming
/// the state at fault.
inline std::string merge_states(const std::vector<std::string>& states) { return detail::run_state::merge(states); }

}  // namespace sluice
