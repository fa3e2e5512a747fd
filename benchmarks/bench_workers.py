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
SETTINGS = ((0, False), (WORKERS, False), (WORKERS, True))
"""(num_workers, persistent_workers) of each row: in the loader's process, then 2 workers
started afresh each epoch (torch's default), then 2 persistent ones."""
WHAT = ("The same pipeline object (`snapshot(...).batch(256).to_torch()`) read epoch after "
        "epoch by one `DataLoader`: in the loader's process (`num_workers=0`), or by 2 worker "
        "processes, persistent or started afresh each epoch (torch's default); batches copied "
        "into a staging buffer; the snapshot on "
        "local disk, and on a moto S3 server on loopback with `local_cache=` (a warm epoch "
        "reads the node-local copies). Best and median of 6 warm epochs (after the first, "
        "which fills the cache: its time in the last column), the requests a warm epoch makes at most (the server's access log), and "
        "each S3 row against the local-disk row of the same worker setting. torch alone: the same "
        "loader over an `IterableDataset` that reads nothing and yields the same batches' "
        "tensors (zeros): what handing batches from worker processes to the loader costs by "
        "itself.")


def warm_epochs(url: str, workload: str, n: int, workers: int, persistent: bool,
                cache: str | None, count) -> dict:
    import snapcache as sc
    from benchmarks.workloads import MAKERS

    ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(
        url, progress=False, local_cache=cache, lease_ttl=600)
    for _ in ds.batch(BATCH):  # build (not timed)
        pass
    return _epochs(ds.batch(BATCH).to_torch(), workload, n, workers, persistent, count)


def torch_alone(workload: str, n: int):
    """The control: an ``IterableDataset`` that reads nothing and yields the batches' tensors
    (the workload's fields and shapes, zeros), split across workers as snapcache's streams are:
    what handing the batches from worker processes to the loader costs by itself."""
    import torch

    from benchmarks.workloads import staging

    class TorchAlone(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            fields = staging(workload, BATCH)
            for start in range(worker * BATCH, n, workers * BATCH):
                rows = min(BATCH, n - start)
                yield {key: torch.zeros((rows, *value.shape[1:]),
                                        dtype=torch.from_numpy(value).dtype)
                       for key, value in fields.items()}

    return TorchAlone()


def _epochs(dataset, workload: str, n: int, workers: int, persistent: bool, count) -> dict:
    import torch

    from benchmarks.workloads import consume, staging

    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                         persistent_workers=persistent)
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
            for workers, persistent in SETTINGS:
                name = f"{workload}-{workers}-{persistent}"
                local = warm_epochs(os.path.join(workdir, f"local-{name}"), workload, n,
                                    workers, persistent, None, lambda: 0)
                remote = warm_epochs(f"s3://{bucket}/{name}", workload, n, workers, persistent,
                                     os.path.join(workdir, f"cache-{workload}"), count)
                alone = _epochs(torch_alone(workload, n), workload, n, workers, persistent,
                                lambda: 0)
                rows.append((workload, n, workers, persistent, local, remote, alone))
    load = f"{load} at the start and {load_average()} at the end"
    lines = [START, "## DataLoader workers: warm epochs on S3 against local disk", "",
             f"`python -m benchmarks.bench_workers --scale {args.scale:g} --write-doc` "
             f"(took {time.perf_counter() - started:.0f} s; 2-core machine, 1-minute load "
             f"average {load}). {WHAT}", "",
             "| workload | workers | local disk s (best / median) | S3 s (best / median) | "
             "S3 requests a warm epoch | S3 time / local time (best) | S3 first epoch s "
             "(empty local cache) | torch alone s (best) |",
             "|---|---|---|---|---|---|---|---|"]
    for workload, n, workers, persistent, local, remote, alone in rows:
        setting = ("0 (in the loader's process)" if not workers else
                   f"{workers} {'persistent' if persistent else 'afresh'}")
        lines.append(
            f"| {workload} ({n:,}) | {setting} | "
            f"{local['best']:.3f} / {local['median']:.3f} | "
            f"{remote['best']:.3f} / {remote['median']:.3f} | {remote['requests']} | "
            f"{remote['best'] / local['best']:.2f}x | {remote['first']:.3f} | "
            f"{alone['best']:.3f} |")
    lines.append(END)
    publish("\n".join(lines), START, END, write=args.write)


if __name__ == "__main__":
    sys.exit(main())
