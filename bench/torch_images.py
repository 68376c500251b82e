#!/usr/bin/python3
"""The peer of sluice-probe --images: PyTorch's DataLoader as image training reads today.

    torch_images.py --loose DIR | --shards SHARD_OR_URL... | --urls FILE | --s3 ENDPOINT BUCKET FILE
                    [--limit N] [--workers 2] [--batch 256] [--size 224] [--step-ms MS]

--loose: an ImageFolder-like map-style dataset: each __getitem__ opens one file and
decodes it with PIL (libjpeg-turbo), then RandomResizedCrop(size), RandomHorizontalFlip,
PILToTensor; shuffled. --shards: an IterableDataset that reads tar shards with tarfile,
as WebDataset does (a URL streamed over HTTP), shards split among workers. --urls: as --loose, each __getitem__
GETs one URL of FILE (urllib); --s3: each __getitem__ is boto3's get_object of one key of
FILE (path-style, credentials from the environment). --limit: the first N items only (a
remote store at 20 requests/s per worker would take minutes). --step-ms: a simulated GPU step after each
batch (MS per 256 images), to measure how long the step waits for data.
Prints one JSON object: images, seconds, images_per_s, cpu_ms_per_image (this process
from the loader's start, and its workers), peak_rss_bytes (the largest of them), step_wait_share.
Run with Debian's Python (/usr/bin/python3: python3-torch, python3-torchvision).
"""
import argparse
import io
import json
import os
import resource
import tarfile
import time
import urllib.request

import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info


def transform(size):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])


class Loose(Dataset):
    def __init__(self, root, size):
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
        self.t = transform(size)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path = self.files[i]
        label = int(os.path.basename(os.path.dirname(path)).split("-")[-1])
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        return self.t(img), label


class Remote(Dataset):
    """Objects named by URLs or S3 keys, one request per __getitem__ (a client per worker)."""

    def __init__(self, names, size, s3=None):
        self.names, self.s3, self.client = names, s3, None
        self.t = transform(size)

    def __len__(self):
        return len(self.names)

    def get(self, name):
        if self.s3 is None:
            with urllib.request.urlopen(name) as r:
                return r.read()
        if self.client is None:
            import boto3
            from botocore.config import Config
            self.client = boto3.client("s3", endpoint_url=self.s3[0], config=Config(s3={"addressing_style": "path"}))
        return self.client.get_object(Bucket=self.s3[1], Key=name)["Body"].read()

    def __getitem__(self, i):
        name = self.names[i]
        label = int(name.rsplit("/", 2)[-2].split("-")[-1])
        img = Image.open(io.BytesIO(self.get(name))).convert("RGB")
        return self.t(img), label


class Shards(IterableDataset):
    def __init__(self, shards, size):
        self.shards = sorted(shards)
        self.t = transform(size)

    def __iter__(self):
        info = get_worker_info()
        mine = self.shards[info.id :: info.num_workers] if info else self.shards
        for shard in mine:
            # A URL is streamed (tarfile's "r|" mode over the HTTP response), as WebDataset
            # reads remote shards.
            remote = shard.startswith(("http://", "https://"))
            with (urllib.request.urlopen(shard) if remote else open(shard, "rb")) as f, \
                    tarfile.open(fileobj=f, mode="r|" if remote else "r") as tar:
                image = None
                for m in tar:
                    data = tar.extractfile(m).read()
                    key, ext = m.name.rsplit(".", 1)
                    if ext in ("jpg", "jpeg", "png"):
                        image = Image.open(io.BytesIO(data)).convert("RGB")
                    elif ext == "cls" and image is not None:
                        yield self.t(image), int(data)
                        image = None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--loose")
    p.add_argument("--shards", nargs="*")
    p.add_argument("--urls")
    p.add_argument("--s3", nargs=3, metavar=("ENDPOINT", "BUCKET", "KEYS"))
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--step-ms", type=float, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.urls or a.s3:
        with open(a.urls or a.s3[2]) as f:
            names = [line.strip() for line in f if line.strip()]
        ds = Remote(names[: a.limit] if a.limit else names, a.size, a.s3)
    elif a.loose:
        ds = Loose(a.loose, a.size)
        if a.limit:
            ds.files = ds.files[: a.limit]
    else:
        ds = Shards(a.shards, a.size)
    loader = DataLoader(ds, batch_size=a.batch, num_workers=a.workers, shuffle=not a.shards)
    images, waited = 0, 0.0
    start = resource.getrusage(resource.RUSAGE_SELF)  # not the imports: the loop's CPU
    t0 = time.perf_counter()
    last = t0
    for x, y in loader:
        now = time.perf_counter()
        waited += now - last
        images += x.shape[0]
        if a.step_ms:
            time.sleep(a.step_ms / 1000 * x.shape[0] / 256)
        last = time.perf_counter()
    secs = time.perf_counter() - t0
    del loader  # the workers exit: their CPU time is in RUSAGE_CHILDREN
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime - start.ru_utime - start.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"images": images, "seconds": round(secs, 3), "images_per_s": round(images / secs, 1),
                      "cpu_ms_per_image": round(cpu * 1e3 / max(images, 1), 3),
                      "peak_rss_bytes": max(me.ru_maxrss, kids.ru_maxrss) * 1024,
                      "step_wait_share": round(waited / secs, 3) if a.step_ms else None}))


if __name__ == "__main__":
    main()
