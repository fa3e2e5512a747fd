"""Reading a snapshot from a cold local disk: the snapshot's files dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``) before every run, against a raw sequential read of the
same files dropped the same way.

    python -m benchmarks.bench_cold [--scale 1.0] [--write-doc]

snapcache: a fresh pipeline object over the committed snapshot, batches of 256 copied into a
staging buffer, checksums verified: each record batch of a compressed shard against its
checksum in the manifest as it is decoded (``store/batched_read.BatchedShard``; uncompressed shards are hashed
whole, see ``open_sequential``), and, in the same run for comparison, every shard through the
whole-shard path (the whole file hashed before its first batch is decoded; what every
sequential read did before; for uncompressed shards the same path twice, which shows the
run's noise). raw: each file read front to
back in 16 MiB ``readinto`` calls into one buffer. Best of 3 runs each, alternated. MB/s are of
the files' bytes; CPU ms is the process's CPU time (all threads) of the best run. The snapshot
is written under ``--dir`` (default: a folder in the current directory, which must be on a real
disk: on tmpfs nothing can be dropped).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time

import snapcache as sc
from benchmarks.report import command_line, load_average, markers, publish, verdict
from benchmarks.workloads import MAKERS, consume, staging

START, END = markers("cold-benchmark")
CODECS = ("auto", "zstd", "none")
"""Asked of snapcache: "auto" is the default (lz4 for the token-like rows, raw for the image-like
ones); "zstd" asked explicitly."""
BATCH = 256
CHUNK = 16 << 20


def files_of(folder: str) -> list[str]:
    return sorted(os.path.join(b, f) for b, _, fs in os.walk(folder) for f in fs)


def drop(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(paths) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of reading ``paths`` front to back."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    t, c = time.perf_counter(), time.process_time()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
    return time.perf_counter() - t, time.process_time() - c


@contextlib.contextmanager
def whole_shards():
    """Sequential reads open every shard whole (hashed before its first batch is decoded), as
    for snapshots written before the record batch index: the path this benchmark compares
    with, in the same run."""
    from snapcache.store import batched_read, ordered_read

    def whole(reader, shard, low_memory=False):
        return reader.open_shard(shard, low_memory=low_memory)

    saved = batched_read.open_sequential, ordered_read.open_sequential
    batched_read.open_sequential = ordered_read.open_sequential = whole
    try:
        yield
    finally:
        batched_read.open_sequential, ordered_read.open_sequential = saved


def snapcache_read(workload: str, n: int, root: str, compression: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one epoch through a fresh pipeline object."""
    stage = staging(workload, BATCH)
    t, c = time.perf_counter(), time.process_time()
    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(
        root, compression=compression, progress=False).batch(BATCH)
    rows = sum(consume(stage, b) for b in ds)
    assert rows == n
    return time.perf_counter() - t, time.process_time() - c


def first_batch(workload: str, n: int, root: str, compression: str) -> float:
    """Seconds from building a fresh pipeline object to its first batch."""
    t = time.perf_counter()
    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(
        root, compression=compression, progress=False).batch(BATCH)
    it = iter(ds)
    next(it)
    elapsed = time.perf_counter() - t
    it.close()
    return elapsed


def measure(workdir: str, workload: str, n: int, compression: str, runs: int = 3) -> dict:
    root = os.path.join(workdir, f"{workload}-{compression}")
    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(root, compression=compression,
                                                            progress=False)
    for _ in ds:
        pass
    shards = [p for p in files_of(root) if p.endswith(".arrow")]
    size = sum(os.path.getsize(p) for p in shards)
    everything = [p for p in files_of(root) if p.endswith((".arrow", ".json"))]
    ours, whole, raw, firsts, whole_firsts = [], [], [], [], []
    for _ in range(runs):
        drop(everything)
        raw.append(raw_read(shards))
        drop(everything)
        ours.append(snapcache_read(workload, n, root, compression))
        drop(everything)
        with whole_shards():
            whole.append(snapcache_read(workload, n, root, compression))
        drop(everything)
        firsts.append(first_batch(workload, n, root, compression))
        drop(everything)
        with whole_shards():
            whole_firsts.append(first_batch(workload, n, root, compression))
    drop(everything)
    warm_raw = min(raw_read(shards)[0], raw_read(shards)[0])
    shutil.rmtree(root, ignore_errors=True)
    (raw_s, raw_cpu), (ours_s, ours_cpu), (whole_s, whole_cpu) = min(raw), min(ours), min(whole)
    return {"bytes": size, "raw_s": raw_s, "ours_s": ours_s, "whole_s": whole_s,
            "raw_cpu": raw_cpu, "ours_cpu": ours_cpu, "whole_cpu": whole_cpu,
            "warm_raw_s": warm_raw, "shards": len(shards), "examples": n,
            "first_s": min(firsts), "whole_first_s": min(whole_firsts)}


def render(args, results, elapsed, load) -> str:
    L = [START, "## Cold local disk\n"]
    L.append(f"`python -m benchmarks.bench_cold --scale {args.scale} --write-doc` (took "
             f"{elapsed:.0f} s; ext4 on a virtual disk; 2-core machine shared with other jobs, "
             f"1-minute load average {load} at the start, so only the ratios of this run mean "
             "anything). Before every run each file of "
             "the snapshot is dropped from the page cache with `posix_fadvise(DONTNEED)`. "
             "raw: the same shard files read sequentially in 16 MiB `readinto` calls. "
             "snapcache: a fresh pipeline object, batches of 256 copied into a staging buffer, "
             "every record batch of a compressed shard checked against its checksum in the "
             "manifest as it is decoded (several in parallel), uncompressed shards hashed whole "
             "before their first batch. whole-shard: the same read with every shard hashed "
             "whole before its first batch is decoded (snapshots without the record batch "
             "index, and every sequential read before), measured in the same run (for "
             "uncompressed shards the same path as snapcache's: the difference is the run's "
             "noise). Best of 3 each, "
             "alternated; CPU ms: the process's CPU time of that run, all threads; first batch: "
             "from building a fresh pipeline object to its first batch, cold, best of 3. The "
             "page-cache column is the same raw read with the files cached, to show the drop "
             "took effect.\n")
    L.append("| workload | codec asked | shards | file MB | raw cold MB/s | snapcache cold MB/s "
             "| ratio | >= 0.8x | whole-shard ratio | snapcache ms (examples/s) "
             "| CPU ms raw / snapcache / whole-shard | first batch ms snapcache / whole-shard "
             "| raw page cache MB/s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (workload, compression), r in results.items():
        mb = r["bytes"] / 1e6
        ratio = r["raw_s"] / r["ours_s"]
        L.append(f"| {workload} | {compression} | {r['shards']} | {mb:,.0f} | "
                 f"{mb / r['raw_s']:,.0f} | {mb / r['ours_s']:,.0f} | {ratio:.2f}x | "
                 f"{verdict(ratio >= 0.8)} | {r['raw_s'] / r['whole_s']:.2f}x | "
                 f"{r['ours_s'] * 1e3:,.0f} ({r['examples'] / r['ours_s']:,.0f}) | "
                 f"{r['raw_cpu'] * 1e3:,.0f} / {r['ours_cpu'] * 1e3:,.0f} / "
                 f"{r['whole_cpu'] * 1e3:,.0f} | {r['first_s'] * 1e3:,.0f} / "
                 f"{r['whole_first_s'] * 1e3:,.0f} | {mb / r['warm_raw_s']:,.0f} |")
    L.append(END)
    return "\n".join(L)


def main(argv=None):
    parser = command_line(__doc__, scale=1.0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    load = load_average()
    started = time.perf_counter()
    sizes = {"image": max(200, int(4000 * args.scale)),
             "token": max(10_000, int(200_000 * args.scale))}
    base = args.dir or os.getcwd()
    workdir = tempfile.mkdtemp(prefix="snapcache-cold-", dir=base)
    results = {}
    try:
        for workload, n in sizes.items():
            for compression in CODECS:
                results[(workload, compression)] = measure(workdir, workload, n, compression)
                print(f"  {workload} {compression} {results[(workload, compression)]}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(args, results, time.perf_counter() - started, load)
    publish(section, START, END, write=args.write)


if __name__ == "__main__":
    main()
