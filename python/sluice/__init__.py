"""sluice from Python: the same stages, with the same option names, as the C++ library.

    import sluice, torch
    batches = (sluice.list("shards/shard-*.tar") | sluice.plan(epochs=2, seed=17)
               | sluice.read() | sluice.webdataset() | sluice.decode_images(size=224)
               | sluice.shuffle(buffer=4096) | sluice.batch_images(size=256, dtype="float32"))
    p = sluice.Pipeline(batches)
    for b in p:                       # waits with the GIL released
        x = torch.from_dlpack(b)      # [256, 3, 224, 224], no copy
        y = torch.from_dlpack(b.labels)

A chain is a list of stage specs, (name, options); `|` joins chains. The C++ side checks,
when the Pipeline is made, that each stage takes what the chain before it gives, and
that each option exists. After to_device(ring=N), a batch (or a tensor made from it)
holds its ring slot until dropped; a for loop's variable keeps the previous batch while
the next is fetched, so keeping k batches needs ring >= k + 2.

Errors carry the C++ library's text: sluice.Error (a RuntimeError; .code, .category);
sluice.SourceError for a path or URL that cannot be read or holds corrupt data (.url,
.offset), with the subclasses HTTPError (.code is the status), NetworkError (a curl
code) and DecompressError (zlib); DeviceError for CUDA.
"""
import json as _json

from . import _sluice
from ._sluice import DecompressError, DeviceError, Error, HTTPError, NetworkError, SourceError  # noqa: F401

__all__ = ["Chain", "Pipeline", "Error", "SourceError", "HTTPError", "NetworkError", "DecompressError",
           "DeviceError", "list", "plan", "read", "fetch", "raw", "tar",
           "tfrecord", "recordio", "lines", "webdataset", "map", "decode_images", "shuffle", "batch",
           "batch_images", "to_device", "merge_states"]


class Chain:
    """Stages not yet run: join with `|`, run with Pipeline(chain)."""

    def __init__(self, specs):
        self.specs = specs

    def __or__(self, other):
        if not isinstance(other, Chain):
            return NotImplemented
        return Chain(self.specs + other.specs)

    def __repr__(self):
        return " | ".join("%s(%s)" % (n, ", ".join("%s=%r" % kv for kv in o.items())) for n, o in self.specs)


def _stage(name):
    def make(**options):
        return Chain([(name, options)])
    make.__name__ = name
    make.__doc__ = "sluice.%s(**options): the C++ stage sluice::%s, with its option names." % (name, name)
    return make


def list(*patterns):  # noqa: A001 (the C++ name)
    """The URLs or paths matching the patterns (globs, {a..b} ranges, s3:// prefixes)."""
    return Chain([("list", {"patterns": [str(p) for p in patterns]})])


plan = _stage("plan")
read = _stage("read")
fetch = _stage("fetch")
raw = _stage("raw")
tar = _stage("tar")
tfrecord = _stage("tfrecord")
recordio = _stage("recordio")
lines = _stage("lines")
webdataset = _stage("webdataset")
decode_images = _stage("decode_images")
def map(fn, **options):  # noqa: A001 (the C++ name)
    """fn(bytes) -> bytes on each record, on the CPU pool (concurrency=, order=); it holds
    the GIL only while it runs, so the pipeline's other stages go on beside it. An
    exception in fn ends the pipeline with sluice.Error carrying its traceback."""
    return Chain([("map", dict(options, fn=fn))])


shuffle = _stage("shuffle")
batch = _stage("batch")
batch_images = _stage("batch_images")
to_device = _stage("to_device")


class Pipeline:
    """Runs a chain that ends in batches. Iterate it; state() is the data position
    (bytes) that Pipeline(chain, resume=state) goes on from; figures() the per-stage
    figures as a dict; stop() ends it (so does Ctrl-C while it waits, and del).
    cpu_threads: the CPU pool's size, C++'s pipeline_options.runtime.cpu_threads (0: the CPUs
    the process may run on). metrics: {"file": path, "port": n, "interval": seconds}, the live
    figures in Prometheus' text format (C++'s pipeline_options.metrics; port 0 picks a
    free one, metrics_port() says which). trace: a file for a Chrome trace of the run,
    written when it stops. tune: let the tuner move requests in flight, files in flight
    and the workers of decode and collation while it runs (C++'s pipeline_options.tune;
    figures()["tuned"] lists what it chose, to pin). memory: one budget in bytes for the
    whole pipeline (C++'s pipeline_options.memory; 0: none)."""

    def __init__(self, chain, resume=b"", cpu_threads=0, metrics=None, trace="", tune=False, memory=0):
        if isinstance(resume, (bytes, bytearray)):
            resume = bytes(resume).decode()
        self._p = _sluice.Pipeline(chain.specs, resume, cpu_threads, metrics or {}, trace, tune, memory)

    def metrics_port(self):
        """The loopback port serving the figures (metrics={"port": 0} picks one); -1: none."""
        return self._p.metrics_port()

    def __iter__(self):
        return self

    def __next__(self):
        return self._p.next()

    def state(self):
        return self._p.state()

    def figures(self):
        return _json.loads(self._p.figures_json())

    def table(self):
        return self._p.table()

    def memory(self):
        """to_device's memory (the ring's buffers) as a dict: reserved_bytes, in_use_bytes
        (held by batches or tensors), free_bytes, allocations; {} without to_device."""
        return self._p.memory()

    def stop(self):
        self._p.stop()


def merge_states(states):
    """Merges the states (bytes from Pipeline.state()) of every rank of a world, saved
    after the same step, into one state that a world of any other size resumes from:
    Pipeline(chain, resume=merged) on every new rank (C++: sluice::merge_states)."""
    return _sluice.merge_states([bytes(s) for s in states])
