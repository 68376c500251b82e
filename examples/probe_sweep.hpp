#pragma once
// sluice-probe --sweep: throughput against requests in flight (and part size for large
// objects, files in flight for local disks), measured on the user's own data, with the
// settings it recommends, the figures behind them, an SVG chart and the same as JSON.
//
// Each point runs the transfer alone (list | plan | fetch or read, chunks counted, no
// parsing) over the sources again and again for a fixed time, and counts the bytes and
// objects that arrived after a short warm-up. Local files read again come from the page
// cache after the first pass: a sweep of local paths measures cached reads unless the
// data is larger than memory. The knee is the fewest in flight whose rate
// is within 5 % of the best point's: past it, more requests give less than 5 %.

#include <sluice/sluice.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace probe_sweep {

struct point {
    unsigned k = 0;              // requests (or files) in flight
    std::uint64_t part = 0;      // part size (large objects), 0: not swept
    double seconds = 0;          // measured (after the warm-up)
    std::uint64_t bytes = 0, objects = 0;
    double bytes_per_s = 0, objects_per_s = 0;
};

// What a point runs: the sources' chunks with k in flight and parts of `part` bytes.
using maker = std::function<sluice::source<sluice::chunk>(unsigned k, std::uint64_t part)>;

inline point measure(const maker& make, unsigned k, std::uint64_t part, double seconds) {
    using clock = std::chrono::steady_clock;
    const double warm = std::min(0.25, seconds / 4);
    sluice::pipeline p(make(k, part));
    point pt{.k = k, .part = part};
    const auto t0 = clock::now();
    auto since = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
    for (auto& c : p) {
        const double t = since();
        if (t >= warm) {  // what arrived after the warm-up, over the time since it ended
            pt.bytes += c.data.size();
            pt.objects += c.last;
        }
        if (t >= seconds) break;
    }
    const double end = since();
    p.stop();
    pt.seconds = std::max(1e-9, end - warm);
    pt.bytes_per_s = double(pt.bytes) / pt.seconds;
    pt.objects_per_s = double(pt.objects) / pt.seconds;
    return pt;
}

// The fewest in flight within 5 % of the best rate.
inline std::size_t knee(const std::vector<point>& pts) {
    double best = 0;
    for (auto& p : pts) best = std::max(best, p.bytes_per_s);
    for (std::size_t i = 0; i < pts.size(); ++i)
        if (pts[i].bytes_per_s >= 0.95 * best) return i;
    return 0;
}

inline std::string human_rate(double bps) {
    char buf[64];
    if (bps >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB/s", bps / 1e9);
    else if (bps >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB/s", bps / 1e6);
    else std::snprintf(buf, sizeof buf, "%.1f kB/s", bps / 1e3);
    return buf;
}
inline std::string human_bytes(double b) {
    char buf[64];
    if (b >= double(1u << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1u << 30));
    else if (b >= double(1u << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1u << 20));
    else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
    return buf;
}

// A line chart of throughput against in flight (log2 axis), the knee marked.
inline std::string svg_chart(const std::vector<point>& pts, std::size_t knee_at, const std::string& what,
                             const std::string& title) {
    const double W = 720, H = 420, L = 80, R = 30, T = 50, B = 60;
    double ymax = 0;
    for (auto& p : pts) ymax = std::max(ymax, p.bytes_per_s / 1e6);
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    const double x0 = std::log2(double(pts.front().k)), x1 = std::log2(double(pts.back().k));
    auto X = [&](unsigned k) { return L + (x1 > x0 ? (std::log2(double(k)) - x0) / (x1 - x0) : 0.5) * (W - L - R); };
    auto Y = [&](double mbps) { return H - B - mbps / ymax * (H - T - B); };
    auto esc = [](const std::string& s) {
        std::string e;
        for (char c : s) e += c == '<' ? std::string("&lt;") : c == '>' ? std::string("&gt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
        return e;
    };
    char buf[512];
    std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  W, H, W, H);
    out += buf;
    out += "<text x=\"" + std::to_string(int(L)) + "\" y=\"28\" font-size=\"15\">" + esc(title) + "</text>\n";
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    out += buf;
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T, L, H - B);
    out += buf;
    for (int i = 0; i <= 4; ++i) {  // y ticks
        const double v = ymax * i / 4;
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                      "text-anchor=\"end\">%.3g</text>\n",
                      L, Y(v), W - R, Y(v), L - 6, Y(v) + 4, v);
        out += buf;
    }
    for (auto& p : pts) {  // x ticks
        std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%u</text>\n", X(p.k), H - B + 18, p.k);
        out += buf;
    }
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s in flight</text>\n", (L + W - R) / 2,
                  H - 14, esc(what).c_str());
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">MB/s</text>\n",
                  (T + H - B) / 2, (T + H - B) / 2);
    out += buf;
    const auto& kp = pts[knee_at];
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c33\" stroke-dasharray=\"5,4\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" fill=\"#c33\">recommended: %u (%s)</text>\n",
                  X(kp.k), T, X(kp.k), H - B, X(kp.k) + 6, T + 14, kp.k, human_rate(kp.bytes_per_s).c_str());
    out += buf;
    out += "<polyline fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2\" points=\"";
    for (auto& p : pts) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(p.k), Y(p.bytes_per_s / 1e6));
        out += buf;
    }
    out += "\"/>\n";
    for (auto& p : pts) {
        std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f5fbf\"><title>%u in flight: %s, %.1f objects/s</title></circle>\n",
                      X(p.k), Y(p.bytes_per_s / 1e6), p.k, human_rate(p.bytes_per_s).c_str(), p.objects_per_s);
        out += buf;
    }
    out += "</svg>\n";
    return out;
}

struct settings {
    bool http = true;              // requests in flight (fetch) or files in flight (read)
    unsigned max_k = 128;
    double seconds = 2;            // per point
    std::uint64_t part_size = 8u << 20;
    double target_rate = 0;        // bytes/s to plan for; 0: the best measured
    double prefix_rate = 5500;     // GET/s one S3 prefix serves (an assumption, stated)
    std::string chart;             // SVG file, "" none
    bool json = false;
};

// Runs the sweep and reports; returns the exit status.
inline int run(const maker& make, const settings& s) {
    std::vector<point> pts;
    std::fprintf(stderr, "sweeping %s in flight, %.1f s a point ...\n", s.http ? "requests" : "files", s.seconds);
    for (unsigned k = 1; k <= s.max_k; k *= 2) {
        pts.push_back(measure(make, k, s.part_size, s.seconds));
        auto& p = pts.back();
        std::fprintf(stderr, "  %4u in flight: %12s  %10.1f objects/s\n", k, human_rate(p.bytes_per_s).c_str(), p.objects_per_s);
        // Two doublings that gave less than 5 %: the curve is flat, stop there.
        const auto n = pts.size();
        if (n >= 3 && pts[n - 1].bytes_per_s < 1.05 * pts[n - 3].bytes_per_s) break;
    }
    const std::size_t ki = knee(pts);
    const point& kp = pts[ki];
    std::size_t bi = 0;
    for (std::size_t i = 0; i < pts.size(); ++i)
        if (pts[i].bytes_per_s > pts[bi].bytes_per_s) bi = i;
    const double more = pts[bi].bytes_per_s / std::max(1e-9, kp.bytes_per_s) - 1;
    const double object_bytes = kp.objects ? double(kp.bytes) / double(kp.objects) : 0;
    // Little's law: a request's time at one in flight, and what the best rate needs.
    const double latency_s = pts[0].objects_per_s > 0 ? 1.0 / pts[0].objects_per_s : 0;
    const double littles_k = kp.objects_per_s * latency_s;

    // Large objects: part size at the knee's in flight.
    std::vector<point> parts;
    if (s.http && object_bytes >= 4.0 * (1u << 20)) {
        for (std::uint64_t part = 1u << 20; part <= (64u << 20) && double(part) <= object_bytes; part *= 2) {
            parts.push_back(measure(make, kp.k, part, s.seconds));
            std::fprintf(stderr, "  %u in flight, parts of %s: %s\n", kp.k, human_bytes(double(part)).c_str(),
                         human_rate(parts.back().bytes_per_s).c_str());
        }
    }
    std::uint64_t best_part = s.part_size;
    if (!parts.empty()) best_part = parts[knee(parts)].part;
    const double best_rate = std::max(kp.bytes_per_s, parts.empty() ? 0.0 : parts[knee(parts)].bytes_per_s);

    // Planning for a target rate.
    const double target = s.target_rate > 0 ? s.target_rate : best_rate;
    const double req_per_s = object_bytes > 0 ? target / object_bytes : 0;
    const double k_needed = req_per_s * latency_s;
    const double prefixes = std::max(1.0, std::ceil(req_per_s / s.prefix_rate));
    const double min_shard = target / s.prefix_rate;  // bytes a request must carry for one prefix

    std::fprintf(stderr, "\nrecommended: --in-flight %u%s: %s (%.1f objects/s); more gives %s\n", kp.k,
                 parts.empty() ? "" : (" --part-size " + std::to_string(best_part)).c_str(), human_rate(best_rate).c_str(),
                 kp.objects_per_s, more < 0.05 ? "< 5 %" : ("+" + std::to_string(int(more * 100)) + " % at " + std::to_string(pts[bi].k)).c_str());
    if (latency_s > 0)
        std::fprintf(stderr, "  one request takes %.1f ms alone; %.1f objects/s x %.1f ms = %.1f in flight (Little's law)\n",
                     latency_s * 1e3, kp.objects_per_s, latency_s * 1e3, littles_k);
    if (object_bytes > 0)
        std::fprintf(stderr,
                     "  for %s with objects of %s: %.0f requests/s, about %.0f in flight at that latency, %.0f S3 prefix%s at "
                     "%.0f GET/s each (assumed: AWS's documented rate per prefix); one prefix needs shards of at least %s\n",
                     human_rate(target).c_str(), human_bytes(object_bytes).c_str(), req_per_s, std::ceil(k_needed), prefixes,
                     prefixes > 1 ? "es" : "", s.prefix_rate, human_bytes(min_shard).c_str());
    if (!s.chart.empty()) {
        std::ofstream f(s.chart, std::ios::trunc);
        f << svg_chart(pts, ki, s.http ? "requests" : "files",
                       "sluice-probe --sweep: throughput against " + std::string(s.http ? "requests" : "files") + " in flight");
        f.flush();
        if (!f) {
            std::fprintf(stderr, "sluice-probe: cannot write the chart '%s'\n", s.chart.c_str());
            return 1;
        }
        std::fprintf(stderr, "  chart: %s\n", s.chart.c_str());
    }
    if (s.json) {
        sluice::detail::json_writer w;
        w.begin_object();
        w.key("ok").value(true);
        w.key("sweep").value(s.http ? "requests in flight" : "files in flight");
        auto series = [&](const char* name, const std::vector<point>& v, bool with_part) {
            w.key(name).begin_array();
            for (auto& p : v) {
                w.begin_object();
                w.key("in_flight").value(p.k);
                if (with_part) w.key("part_size").value(p.part);
                w.key("seconds").value(p.seconds);
                w.key("bytes").value(p.bytes);
                w.key("objects").value(p.objects);
                w.key("bytes_per_s").value(p.bytes_per_s);
                w.key("objects_per_s").value(p.objects_per_s);
                w.end_object();
            }
            w.end_array();
        };
        series("points", pts, false);
        series("part_points", parts, true);
        w.key("recommended").begin_object();
        w.key("in_flight").value(kp.k);
        if (!parts.empty()) w.key("part_size").value(best_part);
        w.key("bytes_per_s").value(best_rate);
        w.key("objects_per_s").value(kp.objects_per_s);
        w.key("more_gives").value(more);
        w.end_object();
        w.key("latency_s").value(latency_s);
        w.key("littles_law_in_flight").value(littles_k);
        w.key("object_bytes").value(object_bytes);
        w.key("plan").begin_object();
        w.key("target_bytes_per_s").value(target);
        w.key("requests_per_s").value(req_per_s);
        w.key("in_flight").value(std::ceil(k_needed));
        w.key("assumed_prefix_get_per_s").value(s.prefix_rate);
        w.key("prefixes").value(prefixes);
        w.key("min_shard_bytes_for_one_prefix").value(min_shard);
        w.end_object();
        w.end_object();
        std::printf("%s\n", w.str().c_str());
    }
    return 0;
}

}  // namespace probe_sweep
