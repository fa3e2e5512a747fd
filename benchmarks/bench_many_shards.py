"""Recording a shard costs the same however many came before it.

A writer records each shard it finishes in its progress record (so that a crashed run's shards
are reused). Writing a snapshot of many small shards (one or two ~1.5 KB examples in 2 KB
shards, raw, local disk) shows the cost of that record per shard: the time between examples
over the last tenth of the shards against the first tenth. A record rewritten whole for each
shard makes that ratio grow with the number of shards (10,000 shards of 64 MB, 640 GB, meant 6
MB of JSON written for each one near the end); a constant cost keeps it near 1.

    python -m benchmarks.bench_many_shards [--shards 4000] [--write-doc]
"""

from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np

import snapcache as sc
from benchmarks import report

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


def main(argv: list[str] | None = None) -> None:
    parser = report.command_line(__doc__)
    parser.add_argument("--shards", type=int, default=4000,
                        help="examples to write (about 2 a shard; default 4000)")
    args = parser.parse_args(argv)
    load = report.load_average()
    r = run(args.shards)
    start, end = report.markers("many-shards-benchmark")
    lines = [
        start, "## Recording a shard as shards accumulate", "",
        f"`python -m benchmarks.bench_many_shards --shards {args.shards} --write-doc` (1-minute "
        f"load average {load} at the start, {report.load_average()} at the end): a snapshot of "
        f"{r['examples']:,} examples of ~1.5 KB in 2 KB shards ({r['shards']:,} shards, raw, "
        f"local disk), written in {r['seconds']:.1f} s. Per example over the first tenth of "
        f"the examples: {r['first_ms']:.2f} ms; over the last tenth: {r['last_ms']:.2f} ms.",
        "",
        *report.target_rows([(f"last tenth per example <= {TARGET}x the first tenth's",
                              f"{r['last_ms']:.2f} vs {r['first_ms']:.2f} ms = "
                              f"{r['ratio']:.2f}x", r["ratio"] <= TARGET)]),
        "",
        "Before the progress record was kept in files of 256 shards (7667d92), the same run took "
        "87.1 s: 3.81 ms an example over the first tenth and 39.95 ms over the last (10.5x), "
        "each shard rewriting the record of every shard before it.",
        end]
    report.publish("\n".join(lines), start, end, write=args.write)


if __name__ == "__main__":
    main()
