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
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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

    run_state() = default;
    /// From a blob written by pipeline::state(); throws sluice::error on a malformed one.
    explicit run_state(const std::string& blob) { parse(blob); }

    /// The point to resume from, when this run resumes.
    const std::optional<stream_point>& resume() const noexcept { return resume_; }

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
        for (auto& [k, v] : notes_) o << "note " << k << " " << v << "\n";
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
            else if (key == "note") {
                const auto sp2 = rest.find(' ');
                saved_notes_[rest.substr(0, sp2)] = sp2 == std::string::npos ? "" : rest.substr(sp2 + 1);
            } else
                throw error("sluice: cannot resume: unknown line in the state: '" + line + "'");
        }
        if (!have_epoch || !have_position) throw error("sluice: cannot resume: the state has no epoch or position");
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
    std::deque<stream_point> stamps_;
    std::string unknown_;
    bool full_replay_ = false;
    bool served_ = false;
};

}  // namespace detail
}  // namespace sluice
