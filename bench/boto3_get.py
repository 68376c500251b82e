#!/usr/bin/env python3
"""The peer for bench/run.sh s3: boto3's get_object, the usual Python way.

  boto3_get.py ENDPOINT BUCKET THREADS KEY...   (a KEY of @FILE reads keys from FILE)

Each key is read whole (get_object()["Body"].read() in 1 MiB pieces) by a thread pool of
THREADS; prints {"objects", "bytes", "seconds", "objects_per_s", "bytes_per_s"} as JSON.
Path-style addressing; the credentials are whatever the environment gives (the bench
server does not check them).
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config


def main():
    endpoint, bucket, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keys = []
    for k in sys.argv[4:]:
        if k.startswith("@"):
            with open(k[1:]) as f:
                keys += [line.strip() for line in f if line.strip()]
        else:
            keys.append(k)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, max_pool_connections=threads,
                                    retries={"max_attempts": 10}))

    def get(key):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        n = 0
        while True:
            piece = body.read(1 << 20)
            if not piece:
                return n
            n += len(piece)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    s = time.perf_counter() - t0
    print(json.dumps({"objects": len(keys), "bytes": total, "seconds": round(s, 4),
                      "objects_per_s": round(len(keys) / s, 1), "bytes_per_s": round(total / s)}, separators=(",", ":")))


if __name__ == "__main__":
    main()
