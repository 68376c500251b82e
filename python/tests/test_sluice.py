"""The Python module's tests, run by CTest with Debian's Python (/usr/bin/python3) and
PYTHONPATH at the build's python/ folder. SLUICE_GEN names sluice-gen (the test data).
Needs numpy; a test that needs what the machine lacks (python3-torch, s3rver) reports
itself skipped (unittest's skipTest: "OK (skipped=N)"), never passed."""
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import numpy

import sluice

try:
    import torch
except ImportError:  # reported per test
    torch = None

DATA = None


def setUpModule():
    global DATA
    DATA = tempfile.TemporaryDirectory()
    subprocess.run([os.environ["SLUICE_GEN"], DATA.name, "--images", "--jpeg-only", "--format", "tar",
                    "--files", "2", "--records", "100", "--classes", "4", "--seed", "5"],
                   check=True, stdout=subprocess.DEVNULL)


def tearDownModule():
    DATA.cleanup()


def images(**batch):
    batch.setdefault("size", 16)
    return (sluice.list(os.path.join(DATA.name, "shard-*.tar")) | sluice.plan(epochs=2, seed=17)
            | sluice.read() | sluice.webdataset() | sluice.decode_images(size=32, concurrency=2)
            | sluice.shuffle(buffer=64) | sluice.batch_images(**batch))


def label_runs(p):
    return [tuple(numpy.from_dlpack(b.labels).tolist()) for b in p]


class Batches(unittest.TestCase):
    def test_numpy_takes_batches_without_a_copy(self):
        p = sluice.Pipeline(images(dtype="float32", mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]))
        b = next(p)
        x, y = numpy.from_dlpack(b), numpy.from_dlpack(b.labels)
        self.assertEqual(x.shape, (16, 3, 32, 32))
        self.assertEqual(x.dtype, numpy.float32)
        self.assertEqual(y.dtype, numpy.int64)
        self.assertEqual(x.ctypes.data, b.data.data_ptr)  # the batch's memory itself
        self.assertTrue(((y >= 0) & (y < 4)).all())
        self.assertTrue(-2.1 <= x.min() and x.max() <= 2.1)  # (pixel / 255 - 0.5) / 0.25

    def test_torch_takes_batches_without_a_copy_and_they_stay_valid_while_held(self):
        if torch is None:
            self.skipTest("[test skipped] torch.from_dlpack needs Debian's python3-torch")
        # A ring of 3: one batch held below, and a for loop's variable keeps the previous
        # batch while the next is fetched.
        p = sluice.Pipeline(images() | sluice.to_device(ring=3))
        first = next(p)
        held = torch.from_dlpack(first)
        self.assertEqual(held.data_ptr(), first.data.data_ptr)
        self.assertEqual(tuple(held.shape), (16, 3, 32, 32))
        self.assertEqual(held.dtype, torch.uint8)
        copy = held.clone()
        del first  # the tensor alone keeps the batch's ring slot and memory
        seen = set()
        for b in p:  # 25 more batches through the 2 other slots
            seen.add(torch.from_dlpack(b).data_ptr())
        self.assertTrue(torch.equal(held, copy))  # never overwritten while held
        self.assertNotIn(held.data_ptr(), seen)
        # Dropped batches went back to the ring and were reused: the two other slots only.
        self.assertEqual(len(seen), 2)
        # The pool's counters: the ring holds its 3 slots' memory while it runs, and a
        # tensor still held keeps the ring (so its memory) after the pipeline stops; when
        # torch drops the last tensor, all of it is back in the pool.
        per_batch = 16 * 3 * 32 * 32
        self.assertEqual(p.memory()["in_use_bytes"], 3 * per_batch)
        del b
        p.stop()
        self.assertEqual(p.memory()["in_use_bytes"], 3 * per_batch)
        self.assertTrue(torch.equal(held, copy))
        del held
        mem = p.memory()
        self.assertEqual(mem["in_use_bytes"], 0)
        self.assertEqual(mem["free_bytes"], 3 * per_batch)  # the 3 slots, back for reuse

    def test_resume_gives_exactly_the_batches_that_were_left(self):
        whole = label_runs(sluice.Pipeline(images()))
        self.assertEqual(len(whole), 2 * 13)  # two epochs of 200: 12 batches of 16 and one of 8 each
        p = sluice.Pipeline(images())
        head = [tuple(numpy.from_dlpack(next(p).labels).tolist()) for _ in range(9)]
        state = p.state()
        self.assertIsInstance(state, bytes)
        p.stop()
        rest = label_runs(sluice.Pipeline(images(), resume=state))
        self.assertEqual(head + rest, whole)

    def test_figures_are_a_dict_per_stage(self):
        p = sluice.Pipeline(images())
        n = sum(len(b) for b in p)
        self.assertEqual(n, 400)
        f = p.figures()
        names = [s["name"] for s in f["stages"]]
        self.assertIn("decode_images", names)
        self.assertIn(f["bottleneck"], names)
        self.assertIn("decode_images", p.table())

    def test_live_figures_and_a_trace_are_exported_with_the_cpp_names(self):
        import json
        import urllib.request
        with tempfile.TemporaryDirectory() as d:
            prom, trace = os.path.join(d, "m.prom"), os.path.join(d, "t.json")
            p = sluice.Pipeline(images(), metrics={"file": prom, "port": 0, "interval": 0.05}, trace=trace)
            port = p.metrics_port()
            self.assertGreater(port, 0)
            first = next(p)
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
                live = r.read().decode()
            self.assertIn('sluice_stage_items_out_total{stage="decode_images"', live)
            n = len(first) + sum(len(b) for b in p)
            self.assertEqual(n, 400)
            p.stop()
            with open(prom) as f:
                final = f.read()
            self.assertIn('sluice_records_total ', final)
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
            tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
            self.assertIn("decode_images #1", tracks)
            self.assertIn("consumer #0", tracks)
            with self.assertRaises(TypeError):
                sluice.Pipeline(images(), metrics={"path": prom})


    def test_tune_and_memory_take_the_cpp_names_and_change_nothing_that_arrives(self):
        whole = label_runs(sluice.Pipeline(images()))
        p = sluice.Pipeline(images(), tune=True, memory=256 << 20)
        self.assertEqual(label_runs(p), whole)
        f = p.figures()
        self.assertIn("decode_images", {t["stage"] for t in f["tuned"]})
        self.assertEqual(f["budget"][0]["bytes"], 256 << 20)


class Ranks(unittest.TestCase):
    def test_ranks_without_a_counts_file_count_once_and_take_equal_shares(self):
        with tempfile.TemporaryDirectory() as counts:
            labels, counted = [], []
            for rank in (0, 1):
                chain = (sluice.list(os.path.join(DATA.name, "shard-*.tar"))
                         | sluice.plan(seed=3, rank=rank, world=2, counts_dir=counts)
                         | sluice.read() | sluice.webdataset() | sluice.decode_images(size=16)
                         | sluice.batch_images(size=10))
                p = sluice.Pipeline(chain)
                labels.append(sum(len(b) for b in p))
                plan = [s for s in p.figures()["stages"] if s["name"] == "plan"][0]
                counted.append((plan["shards_counted"], plan["counts_reused"]))
            self.assertEqual(labels, [100, 100])  # 2 shards of 100 samples, halved
            self.assertEqual(counted, [(2, 0), (0, 2)])  # the second rank read the first's file
            self.assertTrue(os.path.exists(os.path.join(counts, "record-counts")))

    def test_states_of_two_ranks_merged_resume_on_one_with_what_was_left(self):
        with tempfile.TemporaryDirectory() as counts:
            def chain(rank, world):
                return (sluice.list(os.path.join(DATA.name, "shard-*.tar"))
                        | sluice.plan(seed=3, rank=rank, world=world, counts_dir=counts)
                        | sluice.read() | sluice.webdataset() | sluice.decode_images(size=16)
                        | sluice.shuffle(buffer=20) | sluice.batch_images(size=10))
            def keys(batches):
                return [b.key(i) for b in batches for i in range(len(b))]
            states, taken = [], []
            for rank in (0, 1):
                p = sluice.Pipeline(chain(rank, 2))
                taken += keys([next(p) for _ in range(3)])
                states.append(p.state())
                p.stop()
            merged = sluice.merge_states(states)
            self.assertIn(b"reshard", merged)
            rest = keys(sluice.Pipeline(chain(0, 1), resume=merged))
            every = keys(sluice.Pipeline(chain(0, 1)))
            self.assertEqual(len(taken), 60)
            self.assertEqual(len(set(taken + rest)), len(taken) + len(rest))  # nothing twice
            self.assertEqual(sorted(taken + rest), sorted(every))  # 2 shards of 100 samples: all of them
            with self.assertRaisesRegex(sluice.Error, "rank 0 is given twice"):
                sluice.merge_states([states[0], states[0]])


class Map(unittest.TestCase):
    def lines_file(self, n):
        path = os.path.join(DATA.name, "lines-%d.txt" % n)
        with open(path, "w") as f:
            f.writelines("line %d\n" % i for i in range(n))
        return path

    def test_a_python_function_maps_records_on_the_cpu_pool_in_order(self):
        path = self.lines_file(1000)
        calls = []

        def shout(b):
            calls.append(threading.get_ident())
            return b.upper() + b"!"
        chain = (sluice.list(path) | sluice.plan() | sluice.read() | sluice.lines()
                 | sluice.map(shout, concurrency=2) | sluice.batch(size=100))
        got = [b.record(i) for b in sluice.Pipeline(chain, cpu_threads=2) for i in range(len(b))]
        self.assertEqual(got, [b"LINE %d!" % i for i in range(1000)])
        self.assertEqual(len(calls), 1000)
        self.assertNotIn(threading.get_ident(), calls)  # not the loop's thread

    def test_batch_takes_its_collating_workers_and_gives_the_same_batches_whatever_their_number(self):
        path = self.lines_file(1000)

        def batches(**kw):
            chain = sluice.list(path) | sluice.plan() | sluice.read() | sluice.lines() | sluice.batch(size=64, **kw)
            return [[b.record(i) for i in range(len(b))] for b in sluice.Pipeline(chain, cpu_threads=2)]
        one = batches(concurrency=1)
        self.assertEqual(len(one), 16)
        self.assertEqual(one[0][0], b"line 0")
        self.assertEqual(batches(), one)  # automatic: grouping, then one worker helped on large batches; the same batches in order
        self.assertEqual(batches(concurrency=3), one)

    def test_an_exception_in_the_function_reaches_the_loop_with_its_traceback(self):
        path = self.lines_file(50)

        def picky(b):
            if b == b"line 37":
                raise ValueError("no thanks to %r" % b)
            return b
        chain = (sluice.list(path) | sluice.plan() | sluice.read() | sluice.lines() | sluice.map(picky)
                 | sluice.batch(size=10))
        seen = 0
        with self.assertRaises(sluice.Error) as e:
            for b in sluice.Pipeline(chain):
                seen += len(b)
        self.assertEqual(seen, 30)  # the batches before the bad record arrive first
        text = str(e.exception)
        self.assertIn("ValueError: no thanks to b'line 37'", text)
        self.assertIn("in picky", text)  # the traceback
        self.assertIn("lines-50.txt#37", text)  # the record

    def test_a_function_returning_no_bytes_is_named(self):
        path = self.lines_file(3)
        chain = sluice.list(path) | sluice.plan() | sluice.read() | sluice.lines() | sluice.map(len) | sluice.batch(size=3)
        with self.assertRaisesRegex(sluice.Error, "returned int for record .*, not bytes"):
            list(sluice.Pipeline(chain))


class Readme(unittest.TestCase):
    def test_the_readme_loop_runs_as_written(self):
        if torch is None:
            self.skipTest("[test skipped] the README's loop needs Debian's python3-torch")
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
            readme = f.read()
        section = readme[readme.index("## From Python"):]
        code = section[section.index("```python\n") + 10:]
        code = code[:code.index("```")]
        self.assertIn("torch.from_dlpack(b)", code)
        # The README's data folder is the test's; the rest runs as written.
        scope = {}
        exec(compile(code.replace("/tmp/imgs", DATA.name), "README.md", "exec"), scope)
        self.assertIn("decode_images", scope["p"].table())
        self.assertTrue(torch.isfinite(scope["loss"]))


class TrainingScript(unittest.TestCase):
    def test_examples_train_torch_learns_from_sluice_batches(self):
        if torch is None:
            self.skipTest("[test skipped] examples/train_torch.py needs Debian's python3-torch")
        import json
        import sys
        script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_torch.py")
        shards = sorted(os.path.join(DATA.name, f) for f in os.listdir(DATA.name) if f.endswith(".tar"))
        r = subprocess.run([sys.executable, script, "--loader", "sluice", "--steps", "60", "--batch", "32",
                            "--classes", "4"] + shards, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout)
        self.assertEqual(got["images"], 60 * 32)
        self.assertLess(got["loss_last"], 0.8 * got["loss_first"])
        self.assertGreater(got["images_per_s"], 0)


class Errors(unittest.TestCase):
    def test_a_stage_that_does_not_take_what_the_chain_gives_is_named(self):
        chain = sluice.list(DATA.name) | sluice.plan() | sluice.read() | sluice.batch_images(size=4)
        with self.assertRaisesRegex(TypeError, r"batch_images\(\) takes images .* gives chunks"):
            sluice.Pipeline(chain)

    def test_an_unknown_option_is_named(self):
        with self.assertRaisesRegex(TypeError, r"sluice.plan\(\) has no option 'epoch'"):
            sluice.Pipeline(sluice.list(DATA.name) | sluice.plan(epoch=2))

    def test_a_missing_source_is_a_source_error_with_the_library_text(self):
        missing = os.path.join(DATA.name, "nothing-*.tar")
        with self.assertRaises(sluice.SourceError) as e:
            for _ in sluice.Pipeline(sluice.list(missing) | sluice.plan() | sluice.read() | sluice.raw()
                                     | sluice.batch(size=4)):
                pass
        self.assertIn("no file matches '%s'" % missing, str(e.exception))
        self.assertIsInstance(e.exception, sluice.Error)

    def test_a_corrupt_image_names_the_shard_and_the_key(self):
        bad = os.path.join(DATA.name, "bad")
        os.mkdir(bad)
        with open(os.path.join(bad, "img.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 not a JPEG at all")
        chain = (sluice.list(bad + "/*.jpg") | sluice.plan() | sluice.read() | sluice.raw()
                 | sluice.decode_images(size=8) | sluice.batch_images(size=1))
        with self.assertRaisesRegex(sluice.SourceError, r"image .*img\.jpg.*corrupt JPEG"):
            list(sluice.Pipeline(chain))


class S3(unittest.TestCase):
    def test_s3_objects_are_listed_and_fetched_from_an_emulator(self):
        s3rver, setup = os.environ.get("SLUICE_S3RVER", ""), os.environ.get("SLUICE_S3_SETUP", "")
        if not os.access(s3rver, os.X_OK):
            self.skipTest("[test skipped] s3rver is not installed (scripts/deps.sh --test installs it)")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with tempfile.TemporaryDirectory() as work:
            root = os.path.join(work, "root", "bkt", "train")
            os.makedirs(root)
            for name in sorted(os.listdir(DATA.name)):
                if name.startswith("shard-") and name.endswith(".tar"):
                    os.symlink(os.path.join(DATA.name, name), os.path.join(root, name))
            env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
            srv = subprocess.Popen([s3rver, "-s", "-d", os.path.join(work, "data"), "-a", "127.0.0.1", "-p", str(port)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(300):
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
                endpoint = "http://127.0.0.1:%d" % port
                subprocess.run(["python3", setup, "s3rver", endpoint, os.path.join(work, "root")], check=True,
                               stdout=subprocess.DEVNULL)
                saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                        "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE")}
                os.environ.update(AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
                                  AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1")
                os.environ.pop("AWS_PROFILE", None)
                try:
                    remote = label_runs(sluice.Pipeline(
                        sluice.list("s3://bkt/train/") | sluice.plan(epochs=2, seed=17) | sluice.fetch(order="ordered")
                        | sluice.webdataset() | sluice.decode_images(size=32, concurrency=2)
                        | sluice.shuffle(buffer=64) | sluice.batch_images(size=16)))
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
            finally:
                srv.terminate()
                srv.wait()
        # The same shards, the same sequence as read locally.
        self.assertEqual(remote, label_runs(sluice.Pipeline(images())))


class SharedLimit(unittest.TestCase):
    def test_fetch_shares_its_request_limit_through_a_directory(self):
        with tempfile.TemporaryDirectory() as www, tempfile.TemporaryDirectory() as node:
            for i in range(20):
                with open(os.path.join(www, "obj-%02d.bin" % i), "wb") as f:
                    f.write(bytes([i]) * (1000 + i))
            with serving(quiet_files(www)) as base:
                chain = (sluice.list(base + "/obj-{00..19}.bin") | sluice.plan()
                         | sluice.fetch(concurrency=4, min_concurrency=2, shared_limit=node)
                         | sluice.raw() | sluice.batch(size=1))
                sizes = sorted(len(b.record(0)) for b in sluice.Pipeline(chain))
            self.assertEqual(sizes, [1000 + i for i in range(20)])
            self.assertTrue(os.path.exists(os.path.join(node, ".sluice-requests")))


@contextlib.contextmanager
def serving(handler, tls=None):
    """An http.server of the test's own on a free loopback port, on a thread of its own:
    yields its base URL (https:// with `tls`, an ssl.SSLContext); shut down on leaving."""
    import http.server
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield "%s://127.0.0.1:%d" % ("https" if tls else "http", srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


def quiet_files(directory):
    """A handler that serves `directory`'s files and logs nothing."""
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=directory, **k)

        def log_message(self, *a):
            pass
    return Quiet


def fault_server(root, *flags):
    """The project's fault server (tests/support/fault_server.py) on a free loopback port:
    (process, base URL). Stop it by its pid (terminate)."""
    srv = subprocess.Popen(["/usr/bin/python3", os.environ["SLUICE_FAULT_SERVER"], root, *flags],
                           stdout=subprocess.PIPE, text=True)
    line = srv.stdout.readline().split()
    if len(line) != 2 or line[0] != "port":
        srv.terminate()
        srv.wait()
        srv.stdout.close()
        raise RuntimeError("the fault server did not start: %r" % line)
    return srv, "http://127.0.0.1:%s" % line[1]


def server_stats(base, reset=False):
    """The fault server's counters; `reset`: its most requests at once start again from now."""
    import urllib.request
    with urllib.request.urlopen(base + ("/__stats?reset" if reset else "/__stats"), timeout=10) as r:
        words = r.read().decode().split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}


class FetchOptions(unittest.TestCase):
    """fetch's options beyond the first version's, by their C++ names."""

    def fetch_one(self, url, **opts):
        p = sluice.Pipeline(sluice.list(url) | sluice.plan() | sluice.fetch(**opts) | sluice.raw()
                            | sluice.batch(size=1))
        got = [b.record(0) for b in p]
        fetch = [s for s in p.figures()["stages"] if s["name"] == "fetch"][0]
        return got, fetch

    def test_a_large_objects_parts_in_parallel_or_whole_as_asked(self):
        body = os.urandom(8 << 20)
        with tempfile.TemporaryDirectory() as www:
            with open(os.path.join(www, "big.bin"), "wb") as f:
                f.write(body)
            # Every answer waits 30 ms (an object store's latency). The server counts the
            # most requests it answered at once; a request ends there a moment after its
            # last byte reaches the client, so parts one after another may count 2.
            srv, base = fault_server(www, "--ttfb-ms", "30")

            def most_at_once(**opts):
                server_stats(base, reset=True)
                got, fetch = self.fetch_one(base + "/big.bin", part_size=1 << 20, max_part_size=1 << 20, **opts)
                self.assertEqual(got, [body])
                self.assertEqual(fetch["parts"], 7)  # 8 requests of 1 MiB: the first and 7 parts
                return server_stats(base)["concurrent_max"], fetch
            try:
                # Parallel from the first answer on (no rate below which they wait: 0), four
                # at a time, each in chunks of 256 KiB.
                most, fetch = most_at_once(chunk_size=256 << 10, parts_in_flight=4, parallel_parts_below_bytes_per_s=0)
                self.assertGreaterEqual(most, 2)
                self.assertEqual(fetch["items_out"], 32)
                # One part at a time, as asked by either option.
                self.assertLessEqual(most_at_once(parts_in_flight=1, parallel_parts_below_bytes_per_s=0)[0], 2)
                self.assertLessEqual(most_at_once(parts_in_flight=4, parallel_parts_below_bytes_per_s=1)[0], 2)
                # parallel_parts=False: one request streams the whole object.
                before = server_stats(base)["requests"]  # (/__stats itself is not counted)
                got, fetch = self.fetch_one(base + "/big.bin", parallel_parts=False, part_size=1 << 20)
                self.assertEqual(got, [body])
                self.assertEqual(fetch["parts"], 0)
                self.assertEqual(server_stats(base)["requests"] - before, 1)
            finally:
                srv.terminate()
                srv.wait()
                srv.stdout.close()
        with self.assertRaisesRegex(TypeError, r"sluice.fetch\(\) has no option 'parts_in_fligth'"):
            sluice.Pipeline(sluice.list("http://127.0.0.1:1/x") | sluice.plan() | sluice.fetch(parts_in_fligth=2)
                            | sluice.raw() | sluice.batch(size=1))

    def test_a_cache_directory_serves_later_passes_and_keeps_to_its_bytes(self):
        bodies = [os.urandom(100_000 + i) for i in range(5)]
        with tempfile.TemporaryDirectory() as www, tempfile.TemporaryDirectory() as cached:
            for i, body in enumerate(bodies):
                with open(os.path.join(www, "o%d.bin" % i), "wb") as f:
                    f.write(body)
            srv, base = fault_server(www)

            def one_pass(**cache):
                before = server_stats(base)["requests"]
                p = sluice.Pipeline(sluice.list(base + "/o{0..4}.bin") | sluice.plan()
                                    | sluice.fetch(cache=dict(stale_after=600, rescan_after=0.5, **cache))
                                    | sluice.raw() | sluice.batch(size=1))
                got = sorted(b.record(0) for b in p)
                self.assertEqual(got, sorted(bodies))
                fetch = [s for s in p.figures()["stages"] if s["name"] == "fetch"][0]
                return server_stats(base)["requests"] - before, fetch

            def copies(d):
                return [n for n in os.listdir(d) if not n.startswith(".")]
            try:
                # The first pass fetches and keeps a copy of each; the second reads them.
                requests, fetch = one_pass(dir=cached)
                self.assertEqual((requests, fetch["cache_misses"]), (5, 5))
                self.assertEqual(len(copies(cached)), 5)
                requests, fetch = one_pass(dir=pathlib.Path(cached))  # a path-like is taken too
                self.assertEqual((requests, fetch["cache_hits"]), (0, 5))
                # max_bytes below every object: none is copied, every pass asks the server.
                with tempfile.TemporaryDirectory() as small:
                    for _ in range(2):
                        requests, fetch = one_pass(dir=small, max_bytes=50_000, chunk_size=1 << 16, map=False)
                        self.assertEqual(requests, 5)
                        self.assertEqual(copies(small), [])
            finally:
                srv.terminate()
                srv.wait()
                srv.stdout.close()
        chain = sluice.list("http://127.0.0.1:1/x") | sluice.plan()
        with self.assertRaisesRegex(TypeError, r"sluice.fetch\(\)'s cache has no option 'max_byte'"):
            sluice.Pipeline(chain | sluice.fetch(cache={"dir": "c", "max_byte": 1}) | sluice.raw() | sluice.batch(size=1))
        with self.assertRaisesRegex(TypeError, r"sluice.fetch\(\)'s cache is a dict of cache_options by name"):
            sluice.Pipeline(chain | sluice.fetch(cache="c") | sluice.raw() | sluice.batch(size=1))
        with self.assertRaisesRegex(ValueError, r"sluice.fetch\(\)'s cache needs 'dir'"):
            sluice.Pipeline(chain | sluice.fetch(cache={"max_bytes": 1 << 30}) | sluice.raw() | sluice.batch(size=1))
        with self.assertRaisesRegex(ValueError, "stale_after is seconds, from 0 to 1e9"):
            sluice.Pipeline(chain | sluice.fetch(cache={"dir": "c", "stale_after": -1}) | sluice.raw()
                            | sluice.batch(size=1))

    def test_a_stalled_transfer_fails_after_the_stall_limit_in_seconds(self):
        with tempfile.TemporaryDirectory() as www:
            with open(os.path.join(www, "s.bin"), "wb") as f:
                f.write(os.urandom(4 << 20))
            srv, base = fault_server(www, "--pstall", "1", "--stall-s", "60")  # half of it, then 60 s of nothing
            try:
                t0 = time.monotonic()
                with self.assertRaises(sluice.NetworkError) as e:
                    self.fetch_one(base + "/s.bin", retries=1, backoff_base=0.001, backoff_cap=0.005, stall=1,
                                   connect_timeout=5)
                took = time.monotonic() - t0
            finally:
                srv.terminate()
                srv.wait()
                srv.stdout.close()
        self.assertIn("Operation too slow", str(e.exception))
        self.assertIn("after 2 attempts", str(e.exception))
        self.assertIn(base + "/s.bin", str(e.exception))
        # A generous bound: each attempt is cut about a second after its last byte, not
        # after the server's 60 (the C++ tests time it closer).
        self.assertLess(took, 30)
        with self.assertRaisesRegex(ValueError, "stall is seconds, from 0 to 1e9"):
            sluice.Pipeline(sluice.list(base + "/s.bin") | sluice.plan() | sluice.fetch(stall=-1) | sluice.raw()
                            | sluice.batch(size=1))

    def test_connect_timeout_in_seconds_ends_a_connection_never_made(self):
        # A listener whose backlog is full: the kernel drops further SYNs, so a connection
        # to it is never made (the default connect_timeout would wait 10 s).
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)
        fillers = []
        try:
            for _ in range(3):
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(hole.getsockname())
                fillers.append(c)
            time.sleep(0.05)
            url = "http://127.0.0.1:%d/x.bin" % hole.getsockname()[1]
            t0 = time.monotonic()
            with self.assertRaises(sluice.NetworkError) as e:
                self.fetch_one(url, retries=0, connect_timeout=0.5, stall=1)
            took = time.monotonic() - t0
        finally:
            for c in fillers:
                c.close()
            hole.close()
        self.assertIn("Failed to connect to 127.0.0.1", str(e.exception))
        self.assertIn(url, str(e.exception))
        self.assertGreaterEqual(took, 0.4)
        self.assertLess(took, 5)  # connect_timeout's half second, not 10 s; generous for a loaded machine

    def test_redirects_are_followed_up_to_max_redirects(self):
        import http.server

        class Hops(http.server.BaseHTTPRequestHandler):
            # /hop/N answers 302 to /hop/N-1; /hop/0 answers the body.
            def do_GET(self):
                n = int(self.path.rsplit("/", 1)[1])
                if n:
                    self.send_response(302)
                    self.send_header("Location", "/hop/%d" % (n - 1))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"there")

            def log_message(self, *a):
                pass
        with serving(Hops) as base:
            url = base + "/hop/3"
            self.assertEqual(self.fetch_one(url, max_redirects=3)[0], [b"there"])
            with self.assertRaises(sluice.NetworkError) as e:
                self.fetch_one(url, max_redirects=2, retries=0)
        self.assertIn(url, str(e.exception))
        self.assertIn("Maximum (2) redirects followed", str(e.exception))

    def test_https_verifies_the_server_by_a_ca_file_or_not_at_all_if_insecure(self):
        import shutil
        import ssl
        if not shutil.which("openssl"):
            self.skipTest("[test skipped] no openssl CLI to make a certificate")
        with tempfile.TemporaryDirectory() as work:
            key, cert = os.path.join(work, "key.pem"), os.path.join(work, "cert.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                            "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(work, "obj.bin"), "wb") as f:
                f.write(b"over TLS\n" * 1000)

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            with serving(quiet_files(work), tls=ctx) as base:
                url = base + "/obj.bin"
                # A certificate no system CA signed: refused, with the URL and curl's reason.
                with self.assertRaises(sluice.NetworkError) as e:
                    self.fetch_one(url, retries=0)
                self.assertIn(url, str(e.exception))
                self.assertIn("certificate", str(e.exception).lower())
                self.assertEqual(self.fetch_one(url, ca_file=cert)[0], [b"over TLS\n" * 1000])
                self.assertEqual(self.fetch_one(url, insecure=True)[0], [b"over TLS\n" * 1000])


class ErrorKinds(unittest.TestCase):
    def fetch_all(self, url):
        chain = sluice.list(url) | sluice.plan() | sluice.fetch(retries=0) | sluice.raw() | sluice.batch(size=1)
        return list(sluice.Pipeline(chain))

    def test_an_http_status_is_an_http_error_naming_the_url_and_status(self):
        with tempfile.TemporaryDirectory() as www, serving(quiet_files(www)) as base:
            url = base + "/not-here.tar"
            with self.assertRaises(sluice.HTTPError) as e:
                self.fetch_all(url)
        self.assertIsInstance(e.exception, sluice.SourceError)
        self.assertEqual(e.exception.code, 404)
        self.assertEqual(e.exception.category, "http")
        self.assertEqual(e.exception.url, url)
        self.assertIn("404", str(e.exception))
        self.assertIn(url, str(e.exception))

    def test_to_device_on_a_gpu_gives_cuda_batches_and_without_one_a_device_error(self):
        p = None
        try:
            p = sluice.Pipeline(images() | sluice.to_device(device=0))
            b = next(p)
        except sluice.DeviceError as e:  # no usable GPU (or no CUDA in this build): named
            self.assertRegex(str(e), "no usable GPU|without the CUDA toolkit")
            return
        self.assertEqual(b.__dlpack_device__(), (2, 0))  # kDLCUDA, device 0
        self.assertEqual(b.labels.__dlpack_device__(), (1, 0))  # labels stay on the host

    def test_a_refused_connection_is_a_network_error(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        with self.assertRaises(sluice.NetworkError) as e:
            self.fetch_all("http://127.0.0.1:%d/x.tar" % port)
        self.assertEqual(e.exception.category, "curl")
        self.assertIn("127.0.0.1:%d" % port, str(e.exception))


class Stop(unittest.TestCase):
    def test_stop_mid_epoch_ends_the_iteration_at_once(self):
        p = sluice.Pipeline(images())
        next(p)
        t0 = time.monotonic()
        p.stop()
        self.assertLess(time.monotonic() - t0, 1.0)
        with self.assertRaises(StopIteration):
            next(p)

    def test_ctrl_c_while_waiting_stops_the_pipeline_promptly(self):
        # A server that accepts and never answers: fetch waits on it until stopped.
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        url = "http://127.0.0.1:%d/never.tar" % srv.getsockname()[1]
        p = sluice.Pipeline(sluice.list(url) | sluice.plan() | sluice.fetch(retries=0) | sluice.raw()
                            | sluice.batch(size=1))
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                next(p)
        finally:
            timer.cancel()
            srv.close()
        self.assertLess(time.monotonic() - t0, 3.0)  # 0.5 s to the signal, then at most ~1 s


if __name__ == "__main__":
    unittest.main()
