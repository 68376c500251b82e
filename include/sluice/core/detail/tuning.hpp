#pragma once
// The tuner (pipeline_options::tune): settings that stages let it move while they run
// (detail::knob, registered by a stage's setup), and the hill climbing that moves them.
//
// Every window (half a second) the tuner reads the pipeline's figures. It tunes the knob
// of the window's bottleneck (the stage whose workers gained the most busy time since the
// last window; none when that is the consumer, which means the pipeline keeps up):
// it doubles the setting while a doubling raises the delivered rate by 5 % or more, and
// when one does not, it goes back to the setting before and leaves that knob settled.
// When the very first doubling does not pay (the start is past the knee), it halves
// instead, while halving keeps the rate within 5 % of the best seen, then settles (a
// knob that starts at its floor, as fetch's part size does, settles there).
// A window that delivered nothing decides nothing; one change is judged at a time.
// A knob moves one way only (up, or down when the first doubling did not pay), then
// settles: the climb ends, it does not oscillate. A knob whose stage is throttled (its pressure counter grew: 503s or 429s)
// is not raised: AIMD owns the requests in flight below the ceiling then. The memory
// budget (pipeline_options::memory) caps a knob at what its share of the budget holds:
// at the start by the worst case (bytes_each a unit), while it climbs by what a unit is
// measured to hold (fetch: three chunks, or three objects when objects are smaller).
// A channel's item capacity is a knob of its own kind (knob::channel): it is tried in a
// window where both its ends waited on each other (the producer for room, the consumer
// for input, each a tenth of the window or more), which is what too little room between
// bursty stages looks like; a steady bottleneck makes one end wait, not both. Room helps
// in steps (once a burst fits), so a channel does not double: it jumps from the capacity
// given (its floor) to its ceiling, and when that paid 5 % it halves back while halving
// costs under 5 % of the best rate, then settles; when the jump did not pay it goes back.
// The tuner changes how fast, never what: settings that change how many work at once
// keep the stages' order (ordered stages restore input order whatever their workers do).

#include <sluice/core/stats.hpp>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sluice::detail {

/// A setting a stage lets the tuner move while it runs.
struct knob {
    std::string stage;  // the stage's name, as in the figures
    std::string name;   // the option it is, as a user would pin it ("concurrency")
    unsigned min = 1, max = 1;
    unsigned start = 1;              // where the tuner starts it
    std::uint64_t bytes_each = 0;    // the most memory one more unit may hold
    std::function<std::uint64_t()> bytes_now;  // what one unit holds as measured so far (null: bytes_each)
    std::function<unsigned()> get;
    std::function<void(unsigned)> set;
    const std::atomic<std::uint64_t>* pressure = nullptr;  // grows while the source throttles
    /// The stage's place in pipeline_figures::stages (set by the pipeline; two stages may
    /// share a name); npos: found by name.
    std::size_t at = static_cast<std::size_t>(-1);
    /// A channel's item capacity (the output of the stage at `at`), not a stage's setting:
    /// tried when both its ends waited on each other in the window (the stage at `at` for
    /// room, the one after it for input, each for a tenth of the window or more: work that
    /// comes in bursts), not when its stage is the bottleneck.
    bool channel = false;
};

/// The most units of `k` its share of `memory` holds (its share: a quarter of the budget
/// split among the `n` knobs that hold memory), at `each` bytes a unit; never below its
/// floor nor above its ceiling.
inline unsigned memory_cap(const knob& k, std::uint64_t memory, std::size_t n, std::uint64_t each) {
    if (!memory || !each || !n) return k.max;
    return static_cast<unsigned>(std::clamp<std::uint64_t>(memory / 4 / n / each, k.min, std::max(k.min, k.max)));
}
inline std::size_t memory_knobs(const std::vector<knob>& knobs) {
    std::size_t n = 0;
    for (auto& k : knobs) n += k.bytes_each != 0;
    return n;
}

/// The hill climb over the knobs, driven by the pipeline's figures (one call per window).
class hill_climb {
public:
    /// `memory`: the budget in bytes (0: none); the knobs whose units hold memory share a
    /// quarter of it (see memory_cap).
    /// `shares`: other takers of that quarter (detail::budget_share, to_device's ring).
    hill_climb(std::vector<knob> knobs, std::uint64_t memory, std::size_t shares = 0)
        : knobs_(std::move(knobs)), memory_(memory), memory_knobs_(memory_knobs(knobs_) + shares) {
        for (auto& k : knobs_) {
            // Start within the worst case's share (each unit at bytes_each); the climb may
            // go past it as far as what units are measured to hold allows.
            k.start = std::clamp(k.start, k.min, memory_cap(k, memory_, memory_knobs_, k.bytes_each));
            states_.push_back({});
        }
    }
    /// Sets every knob to its start (before the pipeline runs).
    void begin(double now) {
        for (auto& k : knobs_) {
            const unsigned from = k.get();
            k.set(k.start);
            if (from != k.start) log(now, k, from, k.start, "start low and climb while it pays");
        }
    }
    /// One window's figures; `now` in seconds since the start.
    void step(const pipeline_figures& f, double now) {
        const auto [records, bytes] = f.records_and_bytes();
        in_bytes_ = bytes != 0;
        const double amount = in_bytes_ ? double(bytes) : double(records);
        const std::size_t held = window_bottleneck(f);
        if (last_now_ < 0) {
            last_now_ = now;
            last_amount_ = amount;
            return;
        }
        const double dt = now - last_now_;
        if (dt <= 0) return;
        const double rate = (amount - last_amount_) / dt;
        last_now_ = now;
        last_amount_ = amount;
        // A window that delivered nothing (a slow start, a stall, the end of the data) says
        // nothing about a setting: no decision is taken on it.
        if (rate <= 0) return;
        // First the knob on trial, if any: was its doubling worth it? Only a doubling
        // that paid lets the climb go on in the same window.
        for (std::size_t i = 0; i < knobs_.size(); ++i) {
            auto& k = knobs_[i];
            auto& st = states_[i];
            if (!st.trying) continue;
            st.trying = false;
            const bool throttled = pressure_moved(k, st);
            const unsigned cur = k.get();
            st.best = std::max(st.best, st.rate_before);
            if (throttled) {
                settle(now, k, st, cur, "the source throttles (503/429): AIMD owns the limit below this");
            } else if (!st.down && st.rate_before > 0 && rate >= 1.05 * st.rate_before) {
                log(now, k, st.from, cur, "rate " + rate_text(st.rate_before) + " -> " + rate_text(rate));
                st.climbed = true;
                if (k.channel) {  // the jump to the top paid: now come down while it costs under 5 %
                    st.down = true;
                    st.best = std::max(st.best, rate);
                }
                break;  // paid: on to the climb below, from this window's rate
            } else if (st.down && rate >= 0.95 * st.best) {
                // Halving cost less than 5 % of the best seen (or gained): fewer is as good.
                log(now, k, st.from, cur, "rate " + rate_text(st.rate_before) + " -> " + rate_text(rate) + " with fewer");
                st.best = std::max(st.best, rate);
                break;  // on down from here
            } else if (!st.down && !st.climbed && st.from > k.min) {
                // The first doubling did not pay: past the knee already. Try halving instead.
                k.set(st.from);
                st.down = true;
                log(now, k, cur, st.from,
                    "doubling to " + std::to_string(cur) + " gave " + percent(rate, st.rate_before) + "; try fewer");
            } else {
                k.set(st.from);
                settle(now, k, st, st.from,
                       std::string(st.down ? "halving to " : k.channel ? "room for " : "doubling to ") + std::to_string(cur) + " gave " +
                           percent(rate, st.down ? st.best : st.rate_before) + ", kept " + std::to_string(st.from));
            }
            return;  // judged; the next change waits for the next window
        }
        for (std::size_t i = 0; i < knobs_.size(); ++i) {
            auto& k = knobs_[i];
            auto& st = states_[i];
            if (st.settled) continue;
            const unsigned cur = k.get();
            if (pressure_moved(k, st)) {  // AIMD's: the climb ends here (a later 503 storm is AIMD's too)
                settle(now, k, st, cur, "the source throttles (503/429): AIMD owns the limit below this");
                continue;
            }
            st.rate_before = rate;
            // Climb only the stage that limited the rate in this window; a channel, only
            // where its ends took turns waiting on each other.
            // A channel coming down from its jump needs no bursts to be tried.
            if (k.channel ? !(st.down || bursty(k, dt)) : !is(k, held, f)) continue;
            const unsigned top = ceiling(k);
            if (st.down) {  // going down: halve while it costs under 5 %
                if (cur <= k.min) {
                    settle(now, k, st, cur, "at its floor");
                    continue;
                }
                st.from = cur;
                st.trying = true;
                k.set(std::max(k.min, cur / 2));
                return;
            }
            if (cur >= top) {
                settle(now, k, st, cur, top < k.max ? "at the memory budget's share" : "at its ceiling");
                continue;
            }
            st.from = cur;
            st.trying = true;
            // A channel jumps to its ceiling (room helps bursts in steps, not smoothly: the
            // gain comes once a burst fits), then comes down while that costs under 5 %.
            k.set(k.channel ? top : std::min(top, std::max(cur + 1, cur * 2)));
            return;  // one change per window: its effect is measured alone
        }
    }
    /// Every change so far.
    const std::vector<tuning_change>& log() const { return log_; }
    /// The settings now, to pin: {"fetch.concurrency", 32}.
    std::vector<tuned_setting> settings() const {
        std::vector<tuned_setting> out;
        for (std::size_t i = 0; i < knobs_.size(); ++i) {
            const unsigned v = knobs_[i].get();
            // A channel still at the capacity it was given needs no pin: left out.
            if (knobs_[i].channel && v == knobs_[i].start) continue;
            out.push_back({knobs_[i].stage, knobs_[i].name, v, states_[i].settled});
        }
        return out;
    }

private:
    struct state {
        bool trying = false, settled = false;
        bool climbed = false;  // a doubling paid: never go down after
        bool down = false;     // the first doubling did not pay: halving instead
        double best = 0;       // the best window's rate seen
        unsigned from = 0;
        double rate_before = 0;
        std::uint64_t pressure = 0;
    };
    std::string rate_text(double r) const {
        char buf[48];
        if (in_bytes_) std::snprintf(buf, sizeof buf, "%.1f MB/s", r / 1e6);
        else std::snprintf(buf, sizeof buf, "%.1f records/s", r);
        return buf;
    }
    static std::string percent(double now, double before) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%+.0f %%", before > 0 ? 100 * (now / before - 1) : 0.0);
        return buf;
    }
    // The highest setting now: its ceiling, or less where the memory budget's share ends
    // (at what a unit holds as measured, else at the worst case).
    unsigned ceiling(const knob& k) const {
        if (!k.bytes_each) return k.max;
        const std::uint64_t each = k.bytes_now ? std::min(k.bytes_each, std::max<std::uint64_t>(1, k.bytes_now())) : k.bytes_each;
        return memory_cap(k, memory_, memory_knobs_, each);
    }
    bool pressure_moved(const knob& k, state& st) const {
        const std::uint64_t p = k.pressure ? k.pressure->load(std::memory_order_relaxed) : 0;
        const bool moved = p != st.pressure;
        st.pressure = p;
        return moved;
    }
    // Whether `k` belongs to the stage at `i` of the figures.
    static bool is(const knob& k, std::size_t i, const pipeline_figures& f) {
        if (i >= f.stages.size()) return false;
        return k.at != static_cast<std::size_t>(-1) ? k.at == i : f.stages[i].name == k.stage;
    }
    // The bottleneck of the last window (busy time gained since the last call, per
    // working worker), not of the whole run: stages that finished or changed pace count as
    // they are. Its index in f.stages; npos when none gained.
    std::size_t window_bottleneck(const pipeline_figures& f) {
        std::size_t best = static_cast<std::size_t>(-1);
        double most = -1;
        std::vector<double> busy, in, out;
        wait_in_.assign(f.stages.size(), 0);
        wait_out_.assign(f.stages.size(), 0);
        gated_idle_.assign(f.stages.size(), false);
        for (std::size_t i = 0; i < f.stages.size(); ++i) {
            const auto& s = f.stages[i];
            busy.push_back(s.busy_s);
            in.push_back(s.wait_input_s);
            out.push_back(s.wait_output_s);
            // Per working worker: a tuned stage's idle ones wait at its gate.
            const unsigned n = s.active ? s.active : s.workers;
            wait_in_[i] = (s.wait_input_s - (i < last_in_.size() ? last_in_[i] : 0.0)) / (n ? n : 1);
            wait_out_[i] = (s.wait_output_s - (i < last_out_.size() ? last_out_[i] : 0.0)) / (n ? n : 1);
            gated_idle_[i] = s.active && s.active < s.workers;
            const double gained = (s.busy_s - (i < last_busy_.size() ? last_busy_[i] : 0.0)) / (n ? n : 1);
            if (gained > most) {
                most = gained;
                best = i;
            }
        }
        last_busy_ = std::move(busy);
        last_in_ = std::move(in);
        last_out_ = std::move(out);
        return best;
    }
    // Whether the channel of `k` had both ends waiting on each other in the last window.
    // A stage with workers idle at its gate counts their time there as waiting for input,
    // which says nothing about the channel: not judged then.
    bool bursty(const knob& k, double dt) const {
        const std::size_t i = k.at;
        if (i == static_cast<std::size_t>(-1) || i + 1 >= wait_in_.size() || gated_idle_[i + 1]) return false;
        return wait_out_[i] >= 0.1 * dt && wait_in_[i + 1] >= 0.1 * dt;
    }
    void settle(double now, knob& k, state& st, unsigned at, const std::string& why) {
        st.settled = true;
        log_.push_back({now, k.stage, k.name, at, at, "settled: " + why});
    }
    void log(double now, const knob& k, unsigned from, unsigned to, const std::string& why) {
        log_.push_back({now, k.stage, k.name, from, to, why});
    }
    std::vector<knob> knobs_;
    std::uint64_t memory_ = 0;
    std::size_t memory_knobs_ = 0;
    std::vector<state> states_;
    std::vector<tuning_change> log_;
    double last_now_ = -1, last_amount_ = 0;
    bool in_bytes_ = true;
    std::vector<double> last_busy_, last_in_, last_out_;
    std::vector<double> wait_in_, wait_out_;  // the last window's waits, per working worker
    std::vector<bool> gated_idle_;             // stages with workers idle at their gate
};

}  // namespace sluice::detail
