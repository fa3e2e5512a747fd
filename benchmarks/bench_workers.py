"""Warm epochs through a torch DataLoader with worker processes: S3 (loopback server,
node-local cache) against local disk.

    python -m benchmarks.bench_workers [--scale 1.0] [--write-doc]

Needs torch and moto's server (the test extras); nothing else.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from benchmarks.report import command_line, load_average, markers, publish

START, END = markers("workers-benchmark")
WORKERS = 2
BATCH = 256
EPOCHS = 6
WHAT = ("The same pipeline object (`snapshot(...).batch(256).to_torch()`) read epoch after "
        "epoch by one `DataLoader(num_workers=2)`, its workers persistent or started afresh "
        "each epoch (torch's default), batches copied into a staging buffer; the snapshot on "
        "local disk, and on a moto S3 server on loopback with `local_cache=` (a warm epoch "
        "reads the node-local copies). Best and median of 6 warm epochs (after the first, "
        "which fills the cache: its time in the last column), the requests a warm epoch makes at most (the server's access log), and "
        "each S3 row against the local-disk row of the same worker setting.")


def warm_epochs(url: str, workload: str, n: int, persistent: bool, cache: str | None,
                count) -> dict:
    import torch

    import snapcache as sc
    from benchmarks.workloads import MAKERS, consume, staging

    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(
        url, progress=False, local_cache=cache, lease_ttl=600)
    for _ in ds.batch(BATCH):  # build (not timed)
        pass
    loader = torch.utils.data.DataLoader(ds.batch(BATCH).to_torch(), batch_size=None,
                                         num_workers=WORKERS, persistent_workers=persistent)
    stage = staging(workload, BATCH)
    times, requests, first = [], [], 0.0
    for epoch in range(EPOCHS + 1):  # the first fills the local cache
        before = count()
        started = time.perf_counter()
        rows = sum(consume(stage, {k: v.numpy() for k, v in batch.items()})
                   for batch in loader)
        elapsed = time.perf_counter() - started
        assert rows == n, (rows, n)
        if epoch:
            times.append(elapsed)
            requests.append(count() - before)
        else:
            first = elapsed
    del loader
    return {"best": min(times), "median": statistics.median(times),
            "requests": max(requests) if requests else 0, "first": first}


def main(argv=None) -> None:
    args = command_line(__doc__, scale=1.0).parse_args(argv)
    from benchmarks.bench_access import request_counter
    from benchmarks.loopback_s3 import loopback_s3

    load = load_average()
    started = time.perf_counter()
    sizes = {"image": max(100, int(2000 * args.scale)),
             "token": max(2000, int(100_000 * args.scale))}
    rows = []
    with loopback_s3() as (server, bucket, _), \
            tempfile.TemporaryDirectory(prefix="snapcache-workers-") as workdir:
        count = request_counter(server, bucket)
        for workload, n in sizes.items():
            for persistent in (False, True):
                local = warm_epochs(os.path.join(workdir, f"local-{workload}-{persistent}"),
                                    workload, n, persistent, None, lambda: 0)
                remote = warm_epochs(f"s3://{bucket}/{workload}-{persistent}", workload, n,
                                     persistent, os.path.join(workdir, f"cache-{workload}"),
                                     count)
                rows.append((workload, n, persistent, local, remote))
    load = f"{load} at the start and {load_average()} at the end"
    lines = [START, "## DataLoader workers: warm epochs on S3 against local disk", "",
             f"`python -m benchmarks.bench_workers --scale {args.scale:g} --write-doc` "
             f"(took {time.perf_counter() - started:.0f} s; 2-core machine, 1-minute load "
             f"average {load}). {WHAT}", "",
             "| workload | workers | local disk s (best / median) | S3 s (best / median) | "
             "S3 requests a warm epoch | S3 time / local time (best) | S3 first epoch s "
             "(empty local cache) |",
             "|---|---|---|---|---|---|---|"]
    for workload, n, persistent, local, remote in rows:
        lines.append(
            f"| {workload} ({n:,}) | {WORKERS} {'persistent' if persistent else 'afresh'} | "
            f"{local['best']:.3f} / {local['median']:.3f} | "
            f"{remote['best']:.3f} / {remote['median']:.3f} | {remote['requests']} | "
            f"{remote['best'] / local['best']:.2f}x | {remote['first']:.3f} |")
    lines.append(END)
    publish("\n".join(lines), START, END, write=args.write)


if __name__ == "__main__":
    sys.exit(main())
