#!/usr/bin/env python3
"""Reads sluice's exported figures back with independent readers, for the tests.

  read_metrics.py prom FILE_OR_URL   Prometheus text, parsed by prometheus_client's own
                                     parser (Debian's python3-prometheus-client); prints
                                     {"samples":[[name,{labels},value],...],
                                      "types":{family:type}} as compact JSON
  read_metrics.py trace FILE         a Chrome trace, loaded by Python's json module and
                                     checked against the trace event format; prints
                                     {"tracks":{"map #0":{"busy":s,"waiting for
                                     input":s,"waiting for room":s}},"overlaps":n,
                                     "dropped_spans":n} as compact JSON

Exits 2 with the reason on stderr when the input breaks its format.
"""
import json
import sys
import urllib.request


def fail(why):
    print(why, file=sys.stderr)
    sys.exit(2)


def prom(where):
    from prometheus_client.parser import text_string_to_metric_families
    if where.startswith("http://"):
        with urllib.request.urlopen(where, timeout=10) as r:
            ctype = r.headers.get("Content-Type", "")
            if not ctype.startswith("text/plain"):
                fail("Content-Type is %r, not text/plain" % ctype)
            text = r.read().decode("utf-8")
    else:
        with open(where, encoding="utf-8") as f:
            text = f.read()
    samples, types = [], {}
    try:
        for fam in text_string_to_metric_families(text):
            types[fam.name] = fam.type
            for s in fam.samples:
                samples.append([s.name, dict(s.labels), s.value])
    except Exception as e:  # the parser's own complaint about the format
        fail("not Prometheus text: %s" % e)
    print(json.dumps({"samples": samples, "types": types}, separators=(",", ":")))


def trace(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        fail("no traceEvents array")
    names, spans = {}, {}
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                names[e["tid"]] = e["args"]["name"]
            continue
        if ph != "X":
            fail("unexpected event phase %r" % ph)
        for k in ("name", "ts", "dur", "pid", "tid"):
            if k not in e:
                fail("an X event without %r: %r" % (k, e))
        if e["dur"] < 0 or e["ts"] < 0:
            fail("negative time in %r" % e)
        spans.setdefault(e["tid"], []).append((e["ts"], e["dur"], e["name"]))
    tracks, overlaps = {}, 0
    for tid, ss in spans.items():
        if tid not in names:
            fail("track %r has no thread_name" % tid)
        ss.sort()
        total = {"busy": 0.0, "waiting for input": 0.0, "waiting for room": 0.0}
        end = -1.0
        for ts, dur, name in ss:
            if name not in total:
                fail("unknown span name %r" % name)
            if ts < end - 0.002:  # microseconds, printed with 3 decimals
                overlaps += 1
            end = max(end, ts + dur)
            total[name] += dur * 1e-6
        tracks[names[tid]] = total
    for tid, name in names.items():
        tracks.setdefault(name, {"busy": 0.0, "waiting for input": 0.0, "waiting for room": 0.0})
    print(json.dumps({"tracks": tracks, "overlaps": overlaps,
                      "dropped_spans": doc.get("otherData", {}).get("dropped_spans", -1)}, separators=(",", ":")))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prom", "trace"):
        fail(__doc__)
    (prom if sys.argv[1] == "prom" else trace)(sys.argv[2])
