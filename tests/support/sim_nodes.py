#!/usr/bin/env python3
"""Simulated nodes (issue 20, part 5): network namespaces joined by veth pairs, a "store"
namespace running nginx, and N "node" namespaces each running R ranks of sluice-probe
over a link limited by tbf (no netem on these kernels: see PLATFORM.md). Checks, for a
whole run: every rank of the world takes the same number of records (equal steps), the
records of all ranks together are each shard's records once (no loss, no repeat), and
each node's download rate is near its link's rate; then, in a second run, that cutting one
node's link mid-run makes that node's ranks fail clearly (an error naming the URL) while
the other nodes finish, and that nothing hangs.

Every namespace and link it makes is removed at the end, also when a check fails or the
script is interrupted. Exit 0: passed; 1: failed; 77: skipped (namespaces cannot be made
here: not root, no `ip`, no nginx), reported as skipped by CTest (SKIP_RETURN_CODE).

    sim_nodes.py --probe PATH --gen PATH [--nodes 2] [--ranks 2] [--rate-mbit 100] [--json]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77


def sh(*cmd, check=True, ns=None):
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(full), r.stderr.strip()))
    return r


class Nodes:
    """The namespaces and links of one simulated cluster; remove() undoes all of it."""

    def __init__(self, nodes, rate_mbit):
        tag = "sl%d" % (os.getpid() % 100000)
        self.store = tag + "st"
        self.nodes = ["%sn%d" % (tag, i) for i in range(nodes)]
        self.links = []  # (store side, node side, node namespace, node address, store address)
        self.made_ns = []
        self.rate_mbit = rate_mbit
        self.tag = tag
        self.address = "10.213.255.1"  # the store's, from every node

    def make(self):
        for ns in [self.store] + self.nodes:
            sh("ip", "netns", "add", ns)
            self.made_ns.append(ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        for i, ns in enumerate(self.nodes):
            s_end, n_end = "%ss%d" % (self.tag, i), "%sv%d" % (self.tag, i)
            # Created in the store namespace, so deleting the namespaces deletes the pair.
            sh("ip", "link", "add", s_end, "type", "veth", "peer", "name", n_end, ns=self.store)
            sh("ip", "link", "set", n_end, "netns", ns, ns=self.store)
            store_ip, node_ip = "10.213.%d.1" % i, "10.213.%d.2" % i
            sh("ip", "addr", "add", store_ip + "/24", "dev", s_end, ns=self.store)
            sh("ip", "addr", "add", node_ip + "/24", "dev", n_end, ns=ns)
            sh("ip", "link", "set", s_end, "up", ns=self.store)
            sh("ip", "link", "set", n_end, "up", ns=ns)
            # The node's link: what the store sends it (downloads) and what it sends back.
            for end, where in ((s_end, self.store), (n_end, ns)):
                sh("tc", "qdisc", "add", "dev", end, "root", "tbf", "rate", "%dmbit" % self.rate_mbit,
                   "burst", "64kb", "latency", "50ms", ns=where)
            self.links.append((s_end, n_end, ns, node_ip, store_ip))
        # One address for the store that every node reaches over its own link, as a
        # cluster names its store once: the ranks' URLs (and so the listing their states
        # hash) are then the same on every node.
        sh("ip", "addr", "add", self.address + "/32", "dev", "lo", ns=self.store)
        for _, _, ns, _, store_ip in self.links:
            sh("ip", "route", "add", self.address + "/32", "via", store_ip, ns=ns)

    def rx_bytes(self, i):
        _, n_end, ns, _, _ = self.links[i]
        return int(sh("cat", "/sys/class/net/%s/statistics/rx_bytes" % n_end, ns=ns).stdout)

    def cut(self, i):
        s_end, n_end, ns, _, _ = self.links[i]
        sh("ip", "link", "set", s_end, "down", ns=self.store)
        sh("ip", "link", "set", n_end, "down", ns=ns)

    def restore(self, i):
        s_end, n_end, ns, _, store_ip = self.links[i]
        sh("ip", "link", "set", s_end, "up", ns=self.store)
        sh("ip", "link", "set", n_end, "up", ns=ns)
        sh("ip", "route", "replace", self.address + "/32", "via", store_ip, ns=ns)  # dropped with the link

    def remove(self):
        for ns in reversed(self.made_ns):
            sh("ip", "netns", "del", ns, check=False)
        self.made_ns = []


def start_nginx(nodes, root, work):
    conf = os.path.join(work, "nginx.conf")
    user = "user root;" if os.getuid() == 0 else ""
    with open(conf, "w") as f:
        f.write("daemon off; worker_processes 1; %s pid %s/nginx.pid; error_log %s/error.log;\n"
                "events { worker_connections 1024; }\n"
                "http { access_log %s/access.log; sendfile on; keepalive_requests 100000;\n"
                " client_body_temp_path %s; proxy_temp_path %s; fastcgi_temp_path %s; uwsgi_temp_path %s;"
                " scgi_temp_path %s;\n server { listen 8080; root %s; } }\n"
                % ((user,) + (work,) * 8 + (root,)))
    p = subprocess.Popen(["ip", "netns", "exec", nodes.store, "nginx", "-p", work, "-c", conf, "-e",
                          os.path.join(work, "error.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store_ip = nodes.links[0][4]
    for _ in range(100):
        if sh("curl", "-s", "-o", "/dev/null", "-r", "0-0", "http://%s:8080/" % store_ip, check=False,
              ns=nodes.nodes[0]).returncode == 0:
            return p
        time.sleep(0.1)
    p.kill()
    p.wait()
    raise RuntimeError("nginx did not start in the store namespace: %s" % open(os.path.join(work, "error.log")).read())


def run_ranks(args, nodes, shards, work, cut_node=None, on_nodes=None, extra=lambda rank: [], tag=""):
    """Runs every rank of the nodes `on_nodes` (all by default; the world is theirs), each
    with `extra(rank)` arguments; returns [(node, rank, returncode, json or None, stderr,
    seconds, keys file)] and each node's received bytes and seconds."""
    on_nodes = list(range(len(nodes.nodes))) if on_nodes is None else on_nodes
    world = len(on_nodes) * args.ranks
    procs = []
    before = [nodes.rx_bytes(i) for i in range(len(nodes.nodes))]
    t0 = time.monotonic()
    for place, i in enumerate(on_nodes):
        ns = nodes.nodes[i]
        urls = ["http://%s:8080/%s" % (nodes.address, s) for s in shards]
        for r in range(args.ranks):
            rank = place * args.ranks + r
            keys = os.path.join(work, "keys%s-%d.txt" % (tag, rank))
            # No counts file: the ranks of a node count the records once (ranged reads of the
            # tar headers) and share them through the node's counts directory.
            counts_dir = os.path.join(work, "node-%d-counts" % i)
            # The node's ranks share a cache (each object fetched once per node) and one
            # request limit; a cache per run, so that every run goes over the links.
            cache = os.path.join(work, "node-%d-cache%s" % (i, tag))
            cmd = ["ip", "netns", "exec", ns, args.probe, "--json", "--quiet", "--format", "tar", "--rank", str(rank),
                   "--world", str(world), "--counts-dir", counts_dir, "--emit-keys", keys, "--in-flight", "4",
                   "--stall-seconds", "3", "--retries", "2"] + ([] if args.no_cache else
                   ["--cache", cache, "--shared-limit", cache]) + extra(rank) + urls
            err = open(os.path.join(work, "rank%s-%d.err" % (tag, rank)), "w+")
            procs.append((i, rank, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True), err, keys))
    if cut_node is not None:
        # Mid-run: once the node has received its first MiB (its ranks are fetching).
        while nodes.rx_bytes(cut_node) - before[cut_node] < (1 << 20) and time.monotonic() < t0 + args.timeout:
            time.sleep(0.02)
        nodes.cut(cut_node)
    deadline = t0 + args.timeout
    ended = {}
    while len(ended) < len(procs):
        for i, rank, p, err, keys in procs:
            if rank not in ended and p.poll() is not None:
                ended[rank] = time.monotonic()
        if time.monotonic() > deadline:
            for i, rank, p, err, keys in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            late = [r for _, r, _, _, _ in procs if r not in ended]
            raise RuntimeError("ranks %s did not end within %d s: a hang" % (late, args.timeout))
        time.sleep(0.01)
    out = []
    node_end = [t0] * len(nodes.nodes)
    for i, rank, p, err, keys in procs:
        stdout = p.stdout.read()
        p.wait()
        node_end[i] = max(node_end[i], ended[rank])
        err.seek(0)
        try:
            doc = json.loads(stdout)
        except ValueError:
            doc = None
        out.append((i, rank, p.returncode, doc, err.read(), ended[rank] - t0, keys))
    after = [nodes.rx_bytes(i) if i != cut_node else before[i] for i in range(len(nodes.nodes))]
    return out, [(after[i] - before[i], node_end[i] - t0) for i in range(len(nodes.nodes))]


def interrupted(signum, frame):
    raise KeyboardInterrupt  # so that the namespaces are removed on the way out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rate-mbit", type=int, default=100)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--records", type=int, default=128)
    ap.add_argument("--record-size", type=int, default=16384)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-cache", action="store_true", help="each rank fetches alone (for the bench's comparison)")
    args = ap.parse_args()

    if os.getuid() != 0 or not shutil.which("ip") or not shutil.which("tc") or not shutil.which("nginx"):
        print("[test skipped] simulated nodes need root, ip, tc and nginx")
        return SKIP
    nodes = Nodes(args.nodes, args.rate_mbit)
    work = tempfile.mkdtemp(prefix="sluice-nodes-")
    nginx = None
    failures = []
    old = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            nodes.make()
        except RuntimeError as e:
            print("[test skipped] network namespaces cannot be made here: %s" % e)
            return SKIP
        data = os.path.join(work, "data")
        gen = subprocess.run([args.gen, data, "--format", "tar", "--files", str(args.shards), "--records",
                              str(args.records), "--record-size", str(args.record_size), "--uneven", "--seed", "5"],
                             stdout=subprocess.PIPE, text=True, check=True)
        expected = json.loads(gen.stdout)
        shards = sorted(os.listdir(data))
        nginx = start_nginx(nodes, data, work)
        world = args.nodes * args.ranks
        total = expected["records"]
        share = total // world

        # 1. The whole run.
        ranks, per_node = run_ranks(args, nodes, shards, work)
        seen = {}
        node_shards = [set() for _ in range(args.nodes)]
        report = {"nodes": args.nodes, "ranks_per_node": args.ranks, "link_mbit": args.rate_mbit, "records": total,
                  "share": share, "per_node": [], "ranks": []}
        for i, rank, rc, doc, err, secs, keys in ranks:
            got = doc.get("records") if doc else None
            report["ranks"].append({"node": i, "rank": rank, "rc": rc, "records": got, "seconds": round(secs, 2)})
            if rc != 0 or not doc:
                failures.append("rank %d failed (%d): %s" % (rank, rc, err.strip()[-400:]))
                continue
            if got != share:
                failures.append("rank %d took %s records, not its share %d: unequal steps" % (rank, got, share))
            with open(keys) as f:
                for k in f.read().split():
                    key = k.split("/")[-1]
                    seen[key] = seen.get(key, 0) + 1
                    node_shards[i].add(key.split("#")[0])
        # Counts without a file: one rank per node counted each shard, the others reused its file.
        for i in range(args.nodes):
            plans = [stage for n, _, _, d, _, _, _ in ranks if n == i and d for stage in d.get("stages", [])
                     if stage.get("name") == "plan"]
            counted = sum(p.get("shards_counted", 0) for p in plans)
            reused = sum(p.get("counts_reused", 0) for p in plans)
            report.setdefault("counting", []).append({"node": i, "shards_counted": counted, "counts_reused": reused,
                                                      "count_bytes": sum(p.get("count_bytes", 0) for p in plans)})
            if len(plans) != args.ranks:
                failures.append("node %d: %d of its %d ranks reported their plan's figures" % (i, len(plans), args.ranks))
            elif counted != len(shards) or reused != (args.ranks - 1) * len(shards):
                failures.append("node %d: its ranks counted %d shards and reused %d; want each of the %d counted once"
                                % (i, counted, reused, len(shards)))
        # One fetch per object per node: of the shards a node's ranks read, each was
        # downloaded by one of them; the others read its copy.
        for i in range(0 if args.no_cache else args.nodes):
            fetches = [stage for n, _, _, d, _, _, _ in ranks if n == i and d for stage in d.get("stages", [])
                       if stage.get("name") == "fetch"]
            misses = sum(f.get("cache_misses", 0) for f in fetches)
            shared = sum(f.get("cache_coalesced", 0) + f.get("cache_hits", 0) for f in fetches)
            report.setdefault("fetching", []).append({"node": i, "shards_read": len(node_shards[i]), "downloads": misses,
                                                      "read_from_the_node_copy": shared})
            if misses != len(node_shards[i]):
                failures.append("node %d: its ranks downloaded %d objects for the %d shards they read: not once each"
                                % (i, misses, len(node_shards[i])))
        repeated = [k for k, n in seen.items() if n > 1]
        if repeated:
            failures.append("%d records delivered more than once, e.g. %s" % (len(repeated), repeated[:3]))
        if len(seen) != share * world:
            failures.append("%d distinct records delivered, not %d" % (len(seen), share * world))
        link = args.rate_mbit * 1e6 / 8
        for i, (b, s) in enumerate(per_node):
            rate = b / s if s > 0 else 0
            # What the node's ranks delivered, beside what crossed its link: each shard
            # its ranks read crosses it once, and counting reads a part of each.
            data = sum(d.get("payload_bytes", 0) for n, _, _, d, _, _, _ in ranks if n == i and d)
            report["per_node"].append({"node": i, "link_bytes": b, "delivered_bytes": data, "seconds": round(s, 2),
                                       "MB_per_s": round(rate / 1e6, 2), "share_of_link": round(rate / link, 3),
                                       "link_bytes_per_delivered": round(b / data, 2) if data else None})
            # Near the link's rate: a share this small would mean the node did not use it.
            if rate < 0.5 * link:
                failures.append("node %d received %.1f MB/s, under half its link's %.1f MB/s" % (i, rate / 1e6, link / 1e6))

        # 2. One node's link cut mid-run: its ranks fail naming what failed; the others finish.
        for f in os.listdir(work):
            if f.startswith("keys-"):
                os.remove(os.path.join(work, f))
        cut = args.nodes - 1
        ranks, _ = run_ranks(args, nodes, shards, work, cut_node=cut, tag="-cut")
        report["cut"] = {"node": cut, "ranks": []}
        for i, rank, rc, doc, err, secs, keys in ranks:
            message = (doc or {}).get("error", "") or err.strip()[-300:]
            report["cut"]["ranks"].append({"node": i, "rank": rank, "rc": rc, "seconds": round(secs, 2),
                                           "error": message[:200]})
            if i == cut:
                if rc == 0:
                    failures.append("rank %d on the cut node reported success" % rank)
                elif "http://%s:8080/" % nodes.address not in message:
                    failures.append("rank %d on the cut node failed without naming the URL: %s" % (rank, message))
            elif rc != 0 or not doc or doc.get("records") != share:
                failures.append("rank %d on a whole node did not finish its share after the cut: %s" % (rank, message))

        # 3. A job restarted on fewer nodes (issue 20, part 4): every rank of the world saves
        # its state after the same batch, then the ranks of node 0 alone resume from the
        # states merged: together they deliver what no old rank had, once, in equal steps.
        nodes.restore(cut)
        cut = 3  # batches of 16 each old rank takes
        steady = ["--deterministic", "--seed", "7", "--shuffle", "64", "--batch", "16"]
        saved = lambda rank: os.path.join(work, "state-%d" % rank)
        before, _ = run_ranks(args, nodes, shards, work, tag="-before",
                              extra=lambda rank: steady + ["--stop-after-batches", str(cut), "--save-state", saved(rank)])
        delivered = {}
        for i, rank, rc, doc, err, secs, keys in before:
            if rc != 0:
                failures.append("rank %d failed before the restart (%d): %s" % (rank, rc, err.strip()[-400:]))
                continue
            with open(keys) as f:
                for k in f.read().split():
                    delivered[k.split("/")[-1]] = delivered.get(k.split("/")[-1], 0) + 1
        merged = [a for r in range(world) for a in ("--resume", saved(r))]
        after, _ = run_ranks(args, nodes, shards, work, on_nodes=[0], tag="-after", extra=lambda rank: steady + merged)
        rest, takes = {}, set()
        for i, rank, rc, doc, err, secs, keys in after:
            if rc != 0 or not doc:
                failures.append("rank %d failed to resume on the smaller world (%d): %s" % (rank, rc, err.strip()[-400:]))
                continue
            takes.add(doc.get("records"))
            with open(keys) as f:
                for k in f.read().split():
                    rest[k.split("/")[-1]] = rest.get(k.split("/")[-1], 0) + 1
        left = share * world - len(delivered)  # what no old rank had delivered
        report["restart"] = {"old_world": world, "new_world": args.ranks, "delivered_before": len(delivered),
                             "delivered_after": sum(rest.values()), "new_rank_records": sorted(t for t in takes if t is not None)}
        if any(n > 1 for n in delivered.values()) or len(delivered) != world * cut * 16:
            failures.append("before the restart: %d distinct records delivered, want %d once each"
                            % (len(delivered), world * cut * 16))
        if len(takes) != 1:
            failures.append("the resumed ranks took different numbers of records: %s: unequal steps" % sorted(takes))
        again = [k for k in rest if k in delivered or rest[k] > 1]
        if again:
            failures.append("%d records delivered again after the restart, e.g. %s" % (len(again), again[:3]))
        if not 0 <= left - sum(rest.values()) < args.ranks:
            failures.append("after the restart %d records delivered, want the %d left (less fewer than %d)"
                            % (sum(rest.values()), left, args.ranks))
        if args.json:
            print(json.dumps(report))
        else:
            print(json.dumps(report, indent=1))
    except KeyboardInterrupt:
        failures.append("interrupted")
    finally:
        if nginx:
            nginx.terminate()
            try:
                nginx.wait(timeout=10)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait()
        nodes.remove()
        shutil.rmtree(work, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    left = [ns for ns in sh("ip", "netns", "list", check=False).stdout.split() if ns.startswith(nodes.tag)]
    if left:
        failures.append("namespaces left behind: %s" % left)
    for f in failures:
        print("FAILED: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
