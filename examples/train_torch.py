#!/usr/bin/python3
"""A small CNN trained with PyTorch on WebDataset image shards, fed by sluice or by
PyTorch's DataLoader: the same model, augmentation and batches, so the two loaders can
be compared (bench/run.sh trainers runs both on the same data).

    train_torch.py --loader sluice|dataloader [--steps N] [--batch B] [--size S]
                   [--classes C] [--workers W] SHARD...

Shards: sluice-gen DIR --images --format tar (labels tied to each photo's hue, so the
loss falls). sluice: list | plan | read | webdataset | decode_images | shuffle |
batch_images, tensors taken with torch.from_dlpack (no copy). DataLoader: an
IterableDataset reading the shards with tarfile, as WebDataset does, PIL decoding,
RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize, W workers.
Prints one JSON object: loader, steps, images, seconds, images_per_s,
cpu_ms_per_image (this process and its workers), loss_first, loss_last.
Run with Debian's Python (/usr/bin/python3); sluice from PYTHONPATH or pip.
"""
import argparse
import io
import json
import resource
import tarfile
import time

import torch

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def sluice_batches(a):
    import sluice
    chain = (sluice.list(*a.shards) | sluice.plan(epochs=1000, seed=17) | sluice.read() | sluice.webdataset()
             | sluice.decode_images(size=a.size, concurrency=a.workers) | sluice.shuffle(buffer=1024)
             | sluice.batch_images(size=a.batch, drop_last=True, dtype="float32", mean=MEAN, std=STD))
    for b in sluice.Pipeline(chain, cpu_threads=a.workers):
        yield torch.from_dlpack(b), torch.from_dlpack(b.labels)


def dataloader_batches(a):
    import torchvision.transforms as T
    from PIL import Image
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    t = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])

    class Shards(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            mine = sorted(a.shards)[info.id::info.num_workers] if info else sorted(a.shards)
            while True:  # epochs, until the trainer has its steps
                for shard in mine:
                    with tarfile.open(shard) as tar:
                        image = None
                        for m in tar:
                            data = tar.extractfile(m).read()
                            ext = m.name.rsplit(".", 1)[-1]
                            if ext in ("jpg", "jpeg", "png"):
                                image = Image.open(io.BytesIO(data)).convert("RGB")
                            elif ext == "cls" and image is not None:
                                yield t(image), int(data)
                                image = None

    yield from DataLoader(Shards(), batch_size=a.batch, num_workers=a.workers, drop_last=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--loader", choices=["sluice", "dataloader"], required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("shards", nargs="+")
    a = p.parse_args()
    torch.manual_seed(17)
    torch.set_num_threads(1)  # the model is small: the input is what this measures
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, a.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    batches = sluice_batches(a) if a.loader == "sluice" else dataloader_batches(a)
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if len(losses) == a.steps:
            break
    secs = time.perf_counter() - t0
    batches.close()  # stops the pipeline or the workers; their CPU is in the figures below
    del batches
    r1, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime + kids.ru_utime + kids.ru_stime
    images = len(losses) * a.batch
    k = min(20, len(losses))
    print(json.dumps({"loader": a.loader, "steps": len(losses), "images": images, "seconds": round(secs, 3),
                      "images_per_s": round(images / secs, 1), "cpu_ms_per_image": round(cpu * 1e3 / images, 3),
                      "loss_first": round(sum(losses[:k]) / k, 4), "loss_last": round(sum(losses[-k:]) / k, 4)}))


if __name__ == "__main__":
    main()
