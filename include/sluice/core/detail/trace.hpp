#pragma once
// A Chrome trace (the JSON object format that chrome://tracing and ui.perfetto.dev open) of
// a pipeline run: one track per worker of every stage and one for the consumer, each
// drawn as "busy", "waiting for input" and "waiting for room" spans. Waits are the spans
// a worker spent suspended in a channel (detail::span_log); busy is the rest of its life.

#include <sluice/core/detail/json.hpp>
#include <sluice/core/detail/span_log.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::detail {

struct traced_worker {
    std::string stage;       // the stage's name ("fetch"), or "consumer"
    unsigned index = 0;      // the worker's number within its stage
    std::uint64_t start_ns = 0, end_ns = 0;  // its life; end 0: still running at the end
    std::vector<span_log::span> spans;
    std::uint64_t dropped = 0;
};

/// The trace of `workers` with times relative to `origin_ns` (the pipeline's start);
/// `end_ns` closes the life of workers still running.
inline std::string chrome_trace(const std::vector<traced_worker>& workers, std::uint64_t origin_ns,
                                std::uint64_t end_ns) {
    json_writer w;
    auto us = [&](std::uint64_t ns) { return double(ns > origin_ns ? ns - origin_ns : 0) * 1e-3; };
    auto event = [&](const char* name, const std::string& cat, unsigned tid, std::uint64_t a, std::uint64_t b) {
        w.begin_object();
        w.key("name").value(name);
        w.key("cat").value(cat);
        w.key("ph").value("X");
        w.key("pid").value(1);
        w.key("tid").value(tid);
        w.key("ts").fixed(us(a), 3);
        w.key("dur").fixed(double(b - a) * 1e-3, 3);
        w.end_object();
    };
    auto meta = [&](const char* what, unsigned tid, const std::string& key, const std::string& val, int sort) {
        w.begin_object();
        w.key("name").value(what);
        w.key("ph").value("M");
        w.key("pid").value(1);
        w.key("tid").value(tid);
        w.key("args").begin_object();
        if (sort >= 0) w.key(key).value(sort);
        else w.key(key).value(val);
        w.end_object();
        w.end_object();
    };
    std::uint64_t dropped = 0;
    w.begin_object();
    w.key("displayTimeUnit").value("ms");
    w.key("traceEvents").begin_array();
    w.begin_object();
    w.key("name").value("process_name");
    w.key("ph").value("M");
    w.key("pid").value(1);
    w.key("args").begin_object().key("name").value("sluice pipeline").end_object();
    w.end_object();
    unsigned tid = 0;
    for (auto& tw : workers) {
        ++tid;
        dropped += tw.dropped;
        meta("thread_name", tid, "name", tw.stage + " #" + std::to_string(tw.index), -1);
        meta("thread_sort_index", tid, "sort_index", {}, static_cast<int>(tid));
        if (tw.start_ns == 0) continue;  // never started
        const std::uint64_t end = tw.end_ns ? tw.end_ns : end_ns;
        std::uint64_t at = tw.start_ns;  // busy from here to the next wait
        auto spans = tw.spans;
        std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
        for (auto& s : spans) {
            // Clamped to the worker's life, and past the last span drawn (waits of a track
            // written by two threads may overlap): one span at a time on a track.
            const std::uint64_t a = std::max(std::clamp(s.start_ns, tw.start_ns, end), at), b = std::clamp(s.end_ns, a, end);
            if (a > at) event("busy", tw.stage, tid, at, a);
            if (b > a)
                event(s.kind == span_log::wait_input ? "waiting for input" : "waiting for room", tw.stage, tid, a, b);
            at = std::max(at, b);
        }
        if (end > at) event("busy", tw.stage, tid, at, end);
    }
    w.end_array();
    w.key("otherData").begin_object();
    w.key("dropped_spans").value(dropped);
    w.key("max_spans_per_worker").value(std::uint64_t{span_log::default_max});
    w.end_object();
    w.end_object();
    return w.str();
}

}  // namespace sluice::detail
