"""Reading a snapshot from a cold local disk: the snapshot's files dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``) before every run, against a raw sequential read of the
same files dropped the same way.

    python -m benchmarks.bench_cold [--scale 1.0] [--runs 7] [--larger 4] [--write-doc]

snapcache: a fresh pipeline object over the committed snapshot, batches of 256 copied into a
staging buffer allocated once an epoch (what a training loop does with each batch), checksums
verified: each record batch against its checksum in the manifest, hashed front to back by one
verifier thread a shard as soon as the shard is opened while the record batches before it are
decoded and consumed (``store/batched_read.BatchedShard``); and, in the same run for
comparison, every shard through the whole-shard path (the whole file hashed before its first
batch is decoded, as for snapshots without the record batch index), and one pipeline object
held across the runs (a training loop's, over a dataset larger than the page cache: every
epoch cold), which pays no per-object cost. raw: each file read front to back in 16 MiB
``readinto`` calls into one buffer.

The "cold" raw read of this machine's virtual disk varies by a factor of 2-4 from one run to
the next (its host caches), so one best-of-N per system would let a lucky raw run decide the
ratio. Instead every snapcache run is paired with the raw runs just before and after it (each
after its own drop; raw, snapcache, raw, whole-shard, raw, ...; the order of snapcache and
whole-shard alternates), its ratio is the mean of those two raw times over its time, and the
table gives the median ratio of ``--runs`` pairs and their range. MB/s are of the files' bytes,
medians; CPU ms is the process's CPU time (all threads), median. The snapshot is written under
``--dir`` (default: a folder in the current directory, which must be on a real disk: on tmpfs
nothing can be dropped).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
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
LARGER = 4.0
"""The token-like rows are measured again with this many times the examples: what an epoch
pays once (the pipeline object, the cold manifest, the last record batches decoded and consumed
after the last byte is read) is a large part of one 40-60 ms shard, and a small one of the
several shards of a larger snapshot."""


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

    def whole(reader, shard, low_memory=False, ahead=False):
        return reader.open_shard(shard, low_memory=low_memory)

    saved = batched_read.open_sequential, ordered_read.open_sequential
    batched_read.open_sequential = ordered_read.open_sequential = whole
    try:
        yield
    finally:
        batched_read.open_sequential, ordered_read.open_sequential = saved


def pipeline(workload: str, n: int, root: str, compression: str) -> sc.Dataset:
    return sc.Dataset.range(n).map(MAKERS[workload]).snapshot(
        root, compression=compression, progress=False).batch(BATCH)


def snapcache_read(workload: str, n: int, root: str, compression: str,
                   held: sc.Dataset | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one epoch through a fresh pipeline object, or through
    ``held`` (one object read epoch after epoch)."""
    stage = staging(workload, BATCH)
    for buffer in stage.values():  # allocated before the loop, as the raw read's buffer is
        buffer.fill(0)
    t, c = time.perf_counter(), time.process_time()
    ds = held if held is not None else pipeline(workload, n, root, compression)
    rows = sum(consume(stage, b) for b in ds)
    assert rows == n
    return time.perf_counter() - t, time.process_time() - c


def bare_read(workload: str, n: int, root: str, compression: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the same epoch by a reader with none of snapcache's layers
    but its design: the snapshot opened (its manifest read), each shard mapped, its record
    batches hashed front to back on one thread and decoded (``pa.ipc.read_record_batch``, then
    numpy views) on 2 threads as soon as each one's digest matches, batches of up to 256 rows
    of each record batch copied into the staging buffer. No Arrow or shape validation, no
    pipeline, read lease or fingerprint. What this design can reach on this machine."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import xxhash

    from snapcache.store.batched_read import as_columns

    stage = staging(workload, BATCH)
    for buffer in stage.values():
        buffer.fill(0)
    t, c = time.perf_counter(), time.process_time()
    reader = sc.open_snapshot(root).reader()
    rows = 0
    with ThreadPoolExecutor(2) as pool:
        for shard in reader.manifest.shards:
            buffer, _ = reader.storage.map_file(shard.path, shard.bytes)
            view, offsets = memoryview(buffer), shard.batch_offsets
            hashed = [threading.Event() for _ in shard.batch_checksums]

            def verify():
                for i, expected in enumerate(shard.batch_checksums):
                    part = view[offsets[i]:offsets[i + 1]]
                    if xxhash.xxh3_64(part).hexdigest() != expected:
                        raise AssertionError(f"record batch {i} does not match its checksum")
                    hashed[i].set()

            def decode(i):
                hashed[i].wait()
                message = pa.ipc.read_message(buffer.slice(offsets[i], offsets[i + 1] - offsets[i]))
                return as_columns(pa.ipc.read_record_batch(message, reader._arrow_schema),
                                  reader._decoder)

            verifier = threading.Thread(target=verify, daemon=True)
            verifier.start()
            for future in [pool.submit(decode, i) for i in range(len(hashed))]:
                columns = future.result()
                count = len(next(iter(columns.values())))
                for start in range(0, count, BATCH):
                    rows += consume(stage, {k: v[start:start + BATCH] for k, v in columns.items()})
            verifier.join()
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


def measure(workdir: str, workload: str, n: int, compression: str, runs: int) -> dict:
    root = os.path.join(workdir, f"{workload}-{n}-{compression}")
    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(root, compression=compression,
                                                            progress=False)
    for _ in ds:
        pass
    shards = [p for p in files_of(root) if p.endswith(".arrow")]
    size = sum(os.path.getsize(p) for p in shards)
    everything = [p for p in files_of(root) if p.endswith((".arrow", ".json"))]

    def cold(read, *args):
        drop(everything)
        return read(*args)

    held = pipeline(workload, n, root, compression)
    for _ in held:  # its first epoch (warm): what a held object pays once is paid
        pass
    raws = [cold(raw_read, shards)]
    paired: dict[str, list[tuple[float, float, float]]] = {
        "ours": [], "whole": [], "held": [], "bare": []}
    firsts: dict[str, list[float]] = {"ours": [], "whole": []}
    for run in range(runs):
        kinds = ("ours", "whole", "held", "bare")
        for kind in kinds[run % 4:] + kinds[:run % 4]:
            if kind == "bare":
                seconds, cpu = cold(bare_read, workload, n, root, compression)
            else:
                with whole_shards() if kind == "whole" else contextlib.nullcontext():
                    seconds, cpu = cold(snapcache_read, workload, n, root, compression,
                                        held if kind == "held" else None)
            raws.append(cold(raw_read, shards))
            raw_seconds = (raws[-2][0] + raws[-1][0]) / 2
            paired[kind].append((raw_seconds / seconds, seconds, cpu))
        for kind in ("ours", "whole"):
            with whole_shards() if kind == "whole" else contextlib.nullcontext():
                firsts[kind].append(cold(first_batch, workload, n, root, compression))
    drop(everything)
    warm_raw = min(raw_read(shards)[0], raw_read(shards)[0])
    shutil.rmtree(root, ignore_errors=True)
    median = statistics.median
    out = {"bytes": size, "shards": len(shards), "examples": n, "runs": runs,
           "raw_s": median(r[0] for r in raws), "raw_fastest_s": min(r[0] for r in raws),
           "raw_slowest_s": max(r[0] for r in raws), "raw_cpu": median(r[1] for r in raws),
           "warm_raw_s": warm_raw}
    for kind, pairs in paired.items():
        ratios = [p[0] for p in pairs]
        out[kind] = {"ratio": median(ratios), "low": min(ratios), "high": max(ratios),
                     "s": median(p[1] for p in pairs), "cpu": median(p[2] for p in pairs),
                     "first_s": median(firsts[kind]) if kind in firsts else None}
    return out


def render(args, results, elapsed, load) -> str:
    L = [START, "## Cold local disk\n"]
    L.append(f"`python -m benchmarks.bench_cold --scale {args.scale} --runs {args.runs} "
             f"--write-doc` (took {elapsed:.0f} s; ext4 on a virtual disk; 2-core machine "
             f"shared with other jobs, 1-minute load average {load[0]} at the start and "
             f"{load[1]} at the end). Before every run each file of the snapshot is dropped "
             "from the page cache with `posix_fadvise(DONTNEED)`. raw: the same shard files "
             "read sequentially in 16 MiB `readinto` calls. snapcache: a fresh pipeline object, "
             "batches of 256 copied into a staging buffer, every record batch checked against "
             "its checksum in the manifest (hashed front to back by a verifier thread per "
             "shard while the batches before it are decoded, in parallel, and consumed). "
             "whole-shard: the same read with every shard hashed whole before its first batch "
             "is decoded (snapshots without the record batch index, and every uncompressed "
             "shard until this run's code). held object: one pipeline object read epoch after "
             "epoch, each epoch cold (a training loop over data larger than the page cache). "
             "bare reader: the same epoch read by a few lines with none of snapcache's layers "
             "but its design (`bare_read`: manifest, mapped shard, record batches hashed front "
             "to back on one thread and decoded on two, batches of up to 256 rows of each "
             "record batch copied into the staging buffer; no validation, pipeline, lease or "
             "fingerprint): what this design reaches on this machine. "
             + (f"token x{args.larger:g}: the token-like workload with {args.larger:g} times "
                "the examples, in several shards: what an epoch pays once (the pipeline object, "
                "the cold manifest, the last record batches decoded and consumed after the last "
                "byte is read) weighs less against a longer read. " if args.larger else "") +
             "The cold raw read varies between runs (the virtual "
             "disk's host caches it: the raw range column), so each snapcache run is paired with "
             "the raw runs just before and after it: ratio = their mean time / snapcache's "
             f"time, the median of {args.runs} pairs and, in brackets, the lowest and highest. "
             "MB/s, ms and CPU ms (the process's CPU time, all threads) are medians; first "
             "batch: from building a fresh pipeline object to its first batch, cold, median. "
             "The page-cache column is the same raw read with the files cached, to show the "
             "drop took effect.\n")
    L.append("| workload | codec asked | shards | file MB | raw cold MB/s (range) "
             "| snapcache cold MB/s | ratio (range) | >= 0.8x | held object ratio (range) "
             "| whole-shard ratio (range) | bare reader ratio (range) "
             "| snapcache ms (examples/s) | CPU ms raw / snapcache / whole-shard "
             "| first batch ms snapcache / whole-shard | raw page cache MB/s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (workload, compression), r in results.items():
        mb = r["bytes"] / 1e6
        ours, whole, held, bare = r["ours"], r["whole"], r["held"], r["bare"]
        L.append(f"| {workload} | {compression} | {r['shards']} | {mb:,.0f} | "
                 f"{mb / r['raw_s']:,.0f} ({mb / r['raw_slowest_s']:,.0f}-"
                 f"{mb / r['raw_fastest_s']:,.0f}) | {mb / ours['s']:,.0f} | "
                 f"{ours['ratio']:.2f}x ({ours['low']:.2f}-{ours['high']:.2f}) | "
                 f"{verdict(ours['ratio'] >= 0.8)} | {held['ratio']:.2f}x "
                 f"({held['low']:.2f}-{held['high']:.2f}) | {whole['ratio']:.2f}x "
                 f"({whole['low']:.2f}-{whole['high']:.2f}) | {bare['ratio']:.2f}x "
                 f"({bare['low']:.2f}-{bare['high']:.2f}) | "
                 f"{ours['s'] * 1e3:,.0f} ({r['examples'] / ours['s']:,.0f}) | "
                 f"{r['raw_cpu'] * 1e3:,.0f} / {ours['cpu'] * 1e3:,.0f} / "
                 f"{whole['cpu'] * 1e3:,.0f} | {ours['first_s'] * 1e3:,.0f} / "
                 f"{whole['first_s'] * 1e3:,.0f} | {mb / r['warm_raw_s']:,.0f} |")
    L.append(END)
    return "\n".join(L)


def main(argv=None):
    parser = command_line(__doc__, scale=1.0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--runs", type=int, default=7,
                        help="snapcache runs (each paired with raw runs) per row (default 7)")
    parser.add_argument("--larger", type=float, default=LARGER,
                        help="also the token-like rows with this many times the examples "
                             f"(default {LARGER:g}; 0: not)")
    args = parser.parse_args(argv)
    start_load = load_average()
    started = time.perf_counter()
    tokens = max(10_000, int(200_000 * args.scale))
    rows = [("image", "image", max(200, int(4000 * args.scale))), ("token", "token", tokens)]
    if args.larger:  # (row label, workload, examples)
        rows.append((f"token x{args.larger:g}", "token", int(tokens * args.larger)))
    base = args.dir or os.getcwd()
    workdir = tempfile.mkdtemp(prefix="snapcache-cold-", dir=base)
    results = {}
    try:
        for label, workload, n in rows:
            for compression in CODECS:
                results[(label, compression)] = measure(workdir, workload, n, compression,
                                                        args.runs)
                print(f"  {label} {compression} {results[(label, compression)]}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(args, results, time.perf_counter() - started,
                     (start_load, load_average()))
    publish(section, START, END, write=args.write)


if __name__ == "__main__":
    main()
