"""Recording a shard costs the same however many came before it.

A writer records each shard it finishes in its progress record (so that a crashed run's shards
are reused). Writing a snapshot of many small shards (one or two ~1.5 KB examples in 2 KB
shards, raw, local disk) shows the cost of that record per shard: the time between examples
over the last tenth of the shards against the first tenth. A record rewritten whole for each
shard makes that ratio grow with the number of shards (10,000 shards of 64 MB, 640 GB, meant 6
MB of JSON written for each one near the end); a constant cost keeps it near 1.

    python -m benchmarks.bench_many_shards [--shards 4000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np

import snapcache as sc

TARGET = 1.5
"""Per-shard time over the last tenth of the shards, at most this many times the first
tenth's."""


def run(shards: int) -> dict:
    root = tempfile.mkdtemp(prefix="snapcache-many-")
    stamps: list[float] = []

    def make(i):
        stamps.append(time.perf_counter())
        return {"i": i, "x": np.full(1500, i % 251, np.uint8)}

    try:
        ds = sc.Dataset.range(shards).map(make).snapshot(root, shard_size=2048,
                                                         compression=None, progress=False)
        start = time.perf_counter()
        count = sum(1 for _ in ds)
        total = time.perf_counter() - start
        snap = sc.open_snapshot(root, sc.ls(root)[0].id)
        written = len(snap.manifest.shards)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    tenth = count // 10
    first = (stamps[tenth] - stamps[0]) / tenth
    last = (stamps[-1] - stamps[-1 - tenth]) / tenth
    return {"examples": count, "shards": written, "seconds": total,
            "first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4000, help="examples (~1 a shard)")
    args = parser.parse_args()
    r = run(args.shards)
    met = "met" if r["ratio"] <= TARGET else "MISSED"
    print(f"{r['examples']} examples in {r['shards']} shards, {r['seconds']:.1f} s; per example: "
          f"first tenth {r['first_ms']:.2f} ms, last tenth {r['last_ms']:.2f} ms = "
          f"{r['ratio']:.2f}x (target <= {TARGET}x: {met})")


if __name__ == "__main__":
    main()
