#pragma once
// Stage statistics and the bottleneck report.
//
// Every worker of every stage keeps its own counters (written by that worker only, so the
// hot path uses plain relaxed stores, no read-modify-write): items and bytes in and out,
// and the nanoseconds it spent suspended waiting for input and waiting for room
// downstream. Clocks are read only when a channel operation actually suspends; time
// "working" is the worker's lifetime minus its waits.
//
// Bottleneck: the stage whose workers spent the most time working (not waiting), per
// worker. In a chain, that stage's producer waits for room and its consumer waits for
// input, while it works all along. The trainer is counted as a pseudo-stage named
// "consumer" (busy between its receives): when the pipeline waits on it, it is the
// bottleneck, and the pipeline is fast enough.

#include <sluice/core/detail/json.hpp>
#include <sluice/core/detail/span_log.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

namespace detail {
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
}  // namespace detail

/// One worker's counters.
struct worker_counters {
    std::atomic<std::uint64_t> items_in{0}, items_out{0}, bytes_in{0}, bytes_out{0};
    std::atomic<std::uint64_t> wait_in_ns{0}, wait_out_ns{0};
    std::atomic<std::uint64_t> start_ns{0}, end_ns{0};
    /// When it began waiting at its stage's worker gate (pipeline_options::tune; 0: not
    /// waiting there): a wait that may last the whole run counts as waiting while it lasts.
    std::atomic<std::uint64_t> gated_since_ns{0};
    /// Its waits one by one, when the pipeline is traced (pipeline_options::trace).
    std::unique_ptr<detail::span_log> spans;

    /// What a channel operation counts its waits into.
    detail::wait_meter input_meter() { return {&wait_in_ns, spans.get(), detail::span_log::wait_input}; }
    detail::wait_meter output_meter() { return {&wait_out_ns, spans.get(), detail::span_log::wait_output}; }
};

/// A stage's view of its counters; also holds named extra counters (skipped records,
/// retries, throttles...) that a stage registers before it starts.
class stage_stats {
public:
    /// `traced`: each worker also keeps its waits one by one (for a Chrome trace).
    stage_stats(std::string name, unsigned workers, bool counts_records, bool traced = false,
                std::size_t max_spans = detail::span_log::default_max)
        : name_(std::move(name)), counts_records_(counts_records) {
        for (unsigned i = 0; i < workers; ++i) {
            workers_.push_back(std::make_unique<worker_counters>());
            if (traced) workers_.back()->spans = std::make_unique<detail::span_log>(max_spans);
        }
    }
    const std::string& name() const noexcept { return name_; }
    bool counts_records() const noexcept { return counts_records_; }
    worker_counters& worker(std::size_t i) { return *workers_[i]; }
    const worker_counters& worker(std::size_t i) const { return *workers_[i]; }
    std::size_t workers() const noexcept { return workers_.size(); }

    /// A named counter, created on first use (thread-safe).
    std::atomic<std::uint64_t>& counter(const std::string& name) {
        std::lock_guard lock(m_);
        for (auto& [n, c] : extra_)
            if (n == name) return *c;
        extra_.emplace_back(name, std::make_unique<std::atomic<std::uint64_t>>(0));
        return *extra_.back().second;
    }
    std::vector<std::pair<std::string, std::uint64_t>> counters() const {
        std::lock_guard lock(m_);
        std::vector<std::pair<std::string, std::uint64_t>> out;
        for (auto& [n, c] : extra_) out.emplace_back(n, c->load(std::memory_order_relaxed));
        return out;
    }
    /// A named fact in words (which credentials a fetch uses...), set or replaced at any
    /// time (thread-safe). Never a secret: figures are printed and logged.
    void note(const std::string& name, std::string value) {
        std::lock_guard lock(m_);
        for (auto& [n, v] : notes_)
            if (n == name) {
                v = std::move(value);
                return;
            }
        notes_.emplace_back(name, std::move(value));
    }
    std::vector<std::pair<std::string, std::string>> notes() const {
        std::lock_guard lock(m_);
        return notes_;
    }

private:
    std::string name_;
    bool counts_records_;
    std::vector<std::unique_ptr<worker_counters>> workers_;
    mutable std::mutex m_;
    std::vector<std::pair<std::string, std::unique_ptr<std::atomic<std::uint64_t>>>> extra_;
    std::vector<std::pair<std::string, std::string>> notes_;
};

/// A stage's figures at one moment.
struct stage_figures {
    std::string name;
    unsigned workers = 0;
    /// Workers the tuner lets take work (pipeline_options::tune); `workers` untuned.
    unsigned active = 0;
    std::uint64_t items_in = 0, items_out = 0, bytes_in = 0, bytes_out = 0;
    double busy_s = 0, wait_input_s = 0, wait_output_s = 0;
    bool counts_records = false;
    std::vector<std::pair<std::string, std::uint64_t>> counters;
    std::vector<std::pair<std::string, std::string>> notes;  // see stage_stats::note
    /// Share of the workers' time spent working: 0..1.
    double utilization() const {
        const double total = busy_s + wait_input_s + wait_output_s;
        return total > 0 ? busy_s / total : 0;
    }
};

inline stage_figures snapshot(const stage_stats& s, std::uint64_t now_ns) {
    stage_figures f;
    f.name = s.name();
    f.counts_records = s.counts_records();
    f.workers = f.active = static_cast<unsigned>(s.workers());
    std::uint64_t alive = 0, wi = 0, wo = 0;
    for (std::size_t i = 0; i < s.workers(); ++i) {
        const auto& w = s.worker(i);
        f.items_in += w.items_in.load(std::memory_order_relaxed);
        f.items_out += w.items_out.load(std::memory_order_relaxed);
        f.bytes_in += w.bytes_in.load(std::memory_order_relaxed);
        f.bytes_out += w.bytes_out.load(std::memory_order_relaxed);
        const auto a = w.wait_in_ns.load(std::memory_order_acquire);
        const auto b = w.wait_out_ns.load(std::memory_order_relaxed);
        // A wait at the worker gate still going on, counted in wait_in_ns when it ends
        // (read after it: a wait that just ended is counted short, never twice).
        const auto gated = w.gated_since_ns.load(std::memory_order_relaxed);
        if (gated && gated < now_ns) wi += now_ns - gated;
        wi += a;
        wo += b;
        const auto start = w.start_ns.load(std::memory_order_relaxed);
        auto end = w.end_ns.load(std::memory_order_relaxed);
        if (start == 0) continue;
        if (end == 0) end = now_ns;
        alive += end > start ? end - start : 0;
    }
    const std::uint64_t waits = wi + wo;
    f.busy_s = alive > waits ? double(alive - waits) * 1e-9 : 0;
    f.wait_input_s = double(wi) * 1e-9;
    f.wait_output_s = double(wo) * 1e-9;
    f.counters = s.counters();
    f.notes = s.notes();
    return f;
}

/// One move of the tuner (pipeline_options::tune): `stage`'s `knob` went `from` -> `to`
/// at `seconds`, and why (from == to: it settled there).
struct tuning_change {
    double seconds = 0;
    std::string stage, knob;
    unsigned from = 0, to = 0;
    std::string why;
};
/// A setting the tuner chose, to pin in a later run's options.
struct tuned_setting {
    std::string stage, knob;
    unsigned value = 0;
    bool settled = false;
};

/// Figures for a whole pipeline: every stage in order, then the consumer.
struct pipeline_figures {
    double seconds = 0;
    /// CPU seconds used by the runtime's I/O loop thread (runtime::io_cpu_seconds()): its
    /// busy time. The loop waits for readiness and hands on raw()'s records where they go
    /// straight to a batch (format_defaults::hands_on), so this is a small share of `seconds`.
    double io_loop_cpu_s = 0;
    std::vector<stage_figures> stages;  // the last one is "consumer"
    /// With pipeline_options::tune: every change the tuner made, and its settings now.
    std::vector<tuning_change> tuning;
    std::vector<tuned_setting> tuned;
    /// With pipeline_options::memory: how the budget was divided (what, bytes).
    std::vector<std::pair<std::string, std::uint64_t>> budget;

    /// Busy seconds per working worker (a tuned stage's idle workers wait at its gate).
    static double load(const stage_figures& s) {
        const unsigned n = s.active ? s.active : s.workers;
        return s.busy_s / (n ? n : 1);
    }
    /// The stage that limits throughput: the one whose workers spent the most time
    /// working (busy seconds per worker). A stage that finished early (list, plan) or
    /// spent its time waiting on its neighbours cannot be it.
    std::string bottleneck() const {
        const stage_figures* best = nullptr;
        for (auto& s : stages)
            if (!best || load(s) > load(*best)) best = &s;
        return best ? best->name : std::string{};
    }
    /// Share of the run the consumer spent waiting for its next item (0..1): what a
    /// faster pipeline could give back to the trainer.
    double consumer_wait_share() const {
        if (stages.empty() || stages.back().name != "consumer" || seconds <= 0) return 0;
        return std::min(1.0, stages.back().wait_input_s / seconds);
    }
    /// The stage that held the consumer back: the bottleneck among the pipeline's own
    /// stages (the consumer left out). Empty when there are none.
    std::string held_back_by() const {
        const stage_figures* best = nullptr;
        for (auto& s : stages)
            if (s.name != "consumer" && (!best || load(s) > load(*best))) best = &s;
        return best ? best->name : std::string{};
    }

    /// The figures in Prometheus' text exposition format (version 0.0.4): pipeline-wide
    /// gauges, then one series per stage labelled {stage="fetch",index="2"} (index: the
    /// stage's place in the pipeline, as two stages may share a name). A stage's named
    /// counters are `sluice_stage_counter{...,name="retries"}` and its notes
    /// `sluice_stage_note{...,name="credentials",value="..."} 1`.
    std::string prometheus() const {
        std::string out;
        auto label = [](std::string_view v) {  // a label value, escaped
            std::string e;
            for (char c : v) {
                if (c == '\\') e += "\\\\";
                else if (c == '"') e += "\\\"";
                else if (c == '\n') e += "\\n";
                else e += c;
            }
            return e;
        };
        auto num = [](double v) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%.17g", v);  // exact for counts below 2^53
            return std::string(buf);
        };
        auto family = [&](const char* name, const char* type, const char* help) {
            out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
        };
        auto [r, b] = records_and_bytes();
        family("sluice_seconds", "gauge", "Seconds since the pipeline started.");
        out += "sluice_seconds " + num(seconds) + "\n";
        family("sluice_records_total", "counter", "Records delivered (counted at the last stage that makes records).");
        out += "sluice_records_total " + std::to_string(r) + "\n";
        family("sluice_bytes_total", "counter", "Bytes of those records.");
        out += "sluice_bytes_total " + std::to_string(b) + "\n";
        family("sluice_consumer_wait_ratio", "gauge", "Share of the run the consumer spent waiting for its next item.");
        out += "sluice_consumer_wait_ratio " + num(consumer_wait_share()) + "\n";
        family("sluice_io_loop_cpu_seconds_total", "counter", "CPU seconds of the I/O loop's thread.");
        out += "sluice_io_loop_cpu_seconds_total " + num(io_loop_cpu_s) + "\n";
        family("sluice_bottleneck", "gauge", "1 for the stage that limits throughput (the consumer when the pipeline keeps up).");
        out += "sluice_bottleneck{stage=\"" + label(bottleneck()) + "\"} 1\n";
        family("sluice_held_back_by", "gauge", "1 for the pipeline's own stage that held the consumer back most.");
        if (auto h = held_back_by(); !h.empty()) out += "sluice_held_back_by{stage=\"" + label(h) + "\"} 1\n";
        struct series {
            const char* name;
            const char* type;
            const char* help;
            double (*get)(const stage_figures&);
        };
        static const series per_stage[] = {
            {"sluice_stage_workers", "gauge", "Workers of the stage.", [](const stage_figures& s) { return double(s.workers); }},
            {"sluice_stage_items_in_total", "counter", "Items the stage took.", [](const stage_figures& s) { return double(s.items_in); }},
            {"sluice_stage_items_out_total", "counter", "Items the stage gave.", [](const stage_figures& s) { return double(s.items_out); }},
            {"sluice_stage_bytes_in_total", "counter", "Bytes the stage took.", [](const stage_figures& s) { return double(s.bytes_in); }},
            {"sluice_stage_bytes_out_total", "counter", "Bytes the stage gave.", [](const stage_figures& s) { return double(s.bytes_out); }},
            {"sluice_stage_busy_seconds_total", "counter", "Worker-seconds spent working.", [](const stage_figures& s) { return s.busy_s; }},
            {"sluice_stage_wait_input_seconds_total", "counter", "Worker-seconds spent waiting for input.", [](const stage_figures& s) { return s.wait_input_s; }},
            {"sluice_stage_wait_output_seconds_total", "counter", "Worker-seconds spent waiting for room downstream.", [](const stage_figures& s) { return s.wait_output_s; }},
            {"sluice_stage_utilization", "gauge", "Share of the workers' time spent working.", [](const stage_figures& s) { return s.utilization(); }},
        };
        auto labels = [&](std::size_t i) {
            return "stage=\"" + label(stages[i].name) + "\",index=\"" + std::to_string(i) + "\"";
        };
        for (auto& ser : per_stage) {
            family(ser.name, ser.type, ser.help);
            for (std::size_t i = 0; i < stages.size(); ++i)
                out += std::string(ser.name) + "{" + labels(i) + "} " + num(ser.get(stages[i])) + "\n";
        }
        family("sluice_stage_counter", "untyped", "A stage's named counter (retries, throttled, corrupt, in_flight...).");
        for (std::size_t i = 0; i < stages.size(); ++i)
            for (auto& [n, v] : stages[i].counters)
                out += "sluice_stage_counter{" + labels(i) + ",name=\"" + label(n) + "\"} " + std::to_string(v) + "\n";
        if (!tuned.empty()) {
            family("sluice_tuned_setting", "gauge", "A setting the tuner moves, now.");
            for (auto& t : tuned)
                out += "sluice_tuned_setting{stage=\"" + label(t.stage) + "\",knob=\"" + label(t.knob) + "\"} " +
                       std::to_string(t.value) + "\n";
        }
        family("sluice_stage_note", "gauge", "A stage's named fact in words, as a label (always 1).");
        for (std::size_t i = 0; i < stages.size(); ++i)
            for (auto& [n, v] : stages[i].notes)
                out += "sluice_stage_note{" + labels(i) + ",name=\"" + label(n) + "\",value=\"" + label(v) + "\"} 1\n";
        return out;
    }

    /// Records counted at the last stage that produces records (a decoder), or the
    /// items delivered to the consumer when there is none.
    std::pair<std::uint64_t, std::uint64_t> records_and_bytes() const {
        for (auto it = stages.rbegin(); it != stages.rend(); ++it)
            if (it->counts_records) return {it->items_out, it->bytes_out};
        if (stages.empty()) return {0, 0};
        return {stages.back().items_in, stages.back().bytes_in};
    }

    /// One line for a terminal: "12,345 records/s  1,234.5 MB/s  bottleneck: decode".
    std::string progress_line() const {
        auto [r, b] = records_and_bytes();
        const double s = seconds > 0 ? seconds : 1e-9;
        char buf[256];
        std::snprintf(buf, sizeof buf, "[sluice] %8.1fs %12llu records %10.0f records/s %9.1f MB/s  bottleneck: %s",
                      seconds, static_cast<unsigned long long>(r), double(r) / s, double(b) / s / 1e6,
                      bottleneck().c_str());
        std::string line = buf;
        // Trouble shows as it happens: retries, throttling, skipped corruption (a fetch
        // that retries for a while says so before its error, not only after).
        for (auto& st : stages)
            for (auto& [n, v] : st.counters)
                if (v && (n == "retries" || n == "throttled" || n == "corrupt"))
                    line += "  " + st.name + " " + n + ": " + std::to_string(v);
        return line;
    }

    /// The final table: one row per stage.
    std::string table() const {
        std::string out;
        char buf[320];
        std::snprintf(buf, sizeof buf, "%-14s %3s %12s %12s %12s %9s %9s %9s %6s\n", "stage", "n",
                      "items in", "items out", "MB out", "busy s", "wait in", "wait out", "util");
        out += buf;
        for (auto& s : stages) {
            std::snprintf(buf, sizeof buf, "%-14s %3u %12llu %12llu %12.1f %9.3f %9.3f %9.3f %5.0f%%\n",
                          s.name.c_str(), s.workers, static_cast<unsigned long long>(s.items_in),
                          static_cast<unsigned long long>(s.items_out), double(s.bytes_out) / 1e6,
                          s.busy_s, s.wait_input_s, s.wait_output_s, 100 * s.utilization());
            out += buf;
            for (auto& [n, v] : s.counters)
                out += "    " + n + ": " + std::to_string(v) + "\n";
            for (auto& [n, v] : s.notes) out += "    " + n + ": " + v + "\n";
        }
        out += "bottleneck: " + bottleneck() + "\n";
        for (auto& [what, bytes] : budget) out += "budget: " + what + ": " + std::to_string(bytes) + " bytes\n";
        for (auto& c : tuning) {
            std::snprintf(buf, sizeof buf, "tuner %7.2fs %s.%s %u -> %u: ", c.seconds, c.stage.c_str(), c.knob.c_str(),
                          c.from, c.to);
            out += buf + c.why + "\n";
        }
        if (!tuned.empty()) {
            out += "tuned settings (pin them to skip the climb):";
            for (auto& t : tuned)
                out += " " + t.stage + "." + t.knob + " = " + std::to_string(t.value) + (t.settled ? "" : " (still climbing)");
            out += "\n";
        }
        if (!stages.empty() && stages.back().name == "consumer" && seconds > 0) {
            std::snprintf(buf, sizeof buf, "the consumer waited %.0f%% of %.2f s", 100 * consumer_wait_share(), seconds);
            out += buf;
            if (auto h = held_back_by(); !h.empty() && consumer_wait_share() >= 0.01) out += "; held back most by: " + h;
            out += "\n";
        }
        return out;
    }

    /// The same as JSON: {"seconds":..,"io_loop_cpu_s":..,"bottleneck":..,"stages":[{...}]}.
    std::string json() const {
        detail::json_writer w;
        w.begin_object();
        w.key("seconds").value(seconds);
        w.key("io_loop_cpu_s").value(io_loop_cpu_s);
        w.key("bottleneck").value(bottleneck());
        w.key("consumer_wait_share").value(consumer_wait_share());
        w.key("held_back_by").value(held_back_by());
        w.key("stages");
        write_stages(w);
        write_tuning(w);
        w.end_object();
        return w.str();
    }
    /// "tuning" (every change) and "tuned" (the settings now), when the pipeline is tuned.
    void write_tuning(detail::json_writer& w) const {
        if (!budget.empty()) {
            w.key("budget").begin_array();
            for (auto& [what, bytes] : budget) {
                w.begin_object();
                w.key("what").value(what);
                w.key("bytes").value(bytes);
                w.end_object();
            }
            w.end_array();
        }
        if (!tuned.empty() || !tuning.empty()) {
            w.key("tuning").begin_array();
            for (auto& c : tuning) {
                w.begin_object();
                w.key("seconds").value(c.seconds);
                w.key("stage").value(c.stage);
                w.key("knob").value(c.knob);
                w.key("from").value(c.from);
                w.key("to").value(c.to);
                w.key("why").value(c.why);
                w.end_object();
            }
            w.end_array();
            w.key("tuned").begin_array();
            for (auto& t : tuned) {
                w.begin_object();
                w.key("stage").value(t.stage);
                w.key("knob").value(t.knob);
                w.key("value").value(t.value);
                w.key("settled").value(t.settled);
                w.end_object();
            }
            w.end_array();
        }
    }
    void write_stages(detail::json_writer& w) const {
        w.begin_array();
        for (auto& s : stages) {
            w.begin_object();
            w.key("name").value(s.name);
            w.key("workers").value(std::uint64_t{s.workers});
            w.key("items_in").value(s.items_in);
            w.key("items_out").value(s.items_out);
            w.key("bytes").value(s.bytes_out);
            w.key("bytes_in").value(s.bytes_in);
            w.key("busy_s").value(s.busy_s);
            w.key("wait_input_s").value(s.wait_input_s);
            w.key("wait_output_s").value(s.wait_output_s);
            w.key("utilization").value(s.utilization());
            for (auto& [n, v] : s.counters) w.key(n).value(v);
            for (auto& [n, v] : s.notes) w.key(n).value(v);
            w.end_object();
        }
        w.end_array();
    }
};

}  // namespace sluice
