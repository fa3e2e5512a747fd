"""Shuffled later epochs of a held pipeline by record batch size: shuffle windows of many small
record batches decoded whole (``store/gather.Window``) against block by block.

    python -m benchmarks.bench_shuffle [--scale 1.0] [--write-doc]

The same pipeline object, ``snapshot(root, record_batch_size=R).shuffle(10_000, seed=1)
.batch(256)``, read epoch after epoch, batches copied into a staging buffer; each epoch read once
with windows decoded whole (the default) and once block by block (the window path switched off
in the same process: ``ordered_read.ASSEMBLE_BLOCKS`` set out of reach), alternated, best of 5
each. A window is decoded whole when it spans at least 8 record batches of at most 1 MiB decoded
on average and fits a quarter of the read budget: the default 16 MiB record batches never are.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import snapcache as sc
from benchmarks.report import command_line, load_average, markers, publish
from benchmarks.workloads import MAKERS, consume, staging
from snapcache.store import ordered_read

START, END = markers("shuffle-benchmark")
EPOCHS = 5
BATCH = 256
WINDOW = 10_000
RECORD_BATCHES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "16 MiB (default)": 16 << 20}
OFF = 1 << 62


def epoch_seconds(ds, stage, n) -> float:
    started = time.perf_counter()
    rows = sum(consume(stage, batch) for batch in ds)
    assert rows == n, (rows, n)
    return time.perf_counter() - started


def measure(workdir: str, workload: str, n: int) -> list[tuple[str, float, float]]:
    """(record batch size, best epoch windows whole, best epoch block by block) a size."""
    items = [MAKERS[workload](i) for i in range(n)]
    stage = staging(workload, BATCH)
    rows = []
    on = ordered_read.ASSEMBLE_BLOCKS
    for label, size in RECORD_BATCHES.items():
        root = tempfile.mkdtemp(dir=workdir)
        ds = sc.Dataset.from_iterable(items).snapshot(
            root, key=f"{workload}-{size}", record_batch_size=size, progress=False)
        for _ in ds.batch(4096):  # build
            pass
        held = ds.shuffle(WINDOW, seed=1).batch(BATCH)
        times: dict[int, list[float]] = {on: [], OFF: []}
        try:
            for _ in range(EPOCHS):
                for setting in (on, OFF):
                    ordered_read.ASSEMBLE_BLOCKS = setting
                    times[setting].append(epoch_seconds(held, stage, n))
        finally:
            ordered_read.ASSEMBLE_BLOCKS = on
        print(f"  {workload} {label}: whole {[round(t, 3) for t in times[on]]}, block by "
              f"block {[round(t, 3) for t in times[OFF]]}", file=sys.stderr, flush=True)
        rows.append((label, min(times[on]), min(times[OFF])))
        del ds, held
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv=None) -> None:
    args = command_line(__doc__, scale=1.0).parse_args(argv)
    load = load_average()
    started = time.perf_counter()
    sizes = {"token": max(20_000, int(200_000 * args.scale)),
             "image": max(1000, int(4000 * args.scale))}
    with tempfile.TemporaryDirectory(prefix="snapcache-shuffle-") as workdir:
        results = {w: measure(workdir, w, n) for w, n in sizes.items()}
    lines = [START, "## Shuffled epochs by record batch size", "",
             f"`python -m benchmarks.bench_shuffle --scale {args.scale:g} --write-doc` (took "
             f"{time.perf_counter() - started:.0f} s; 2-core machine, 1-minute load average "
             f"{load} at the start and {load_average()} at the end). The same pipeline object, "
             f"`snapshot(root, record_batch_size=R).shuffle({WINDOW:_}, seed=1).batch({BATCH})`, "
             "read epoch after epoch, batches copied into a staging buffer; each epoch read "
             "with shuffle windows of many small record batches decoded whole (the default) and "
             "block by block (switched off in the same process), alternated; best of "
             f"{EPOCHS} each. The default record batches are never decoded as windows (the two "
             "columns run the same code there).", "",
             "| workload | record batches | windows whole s | block by block s | speed-up |",
             "|---|---|---|---|---|"]
    for workload, rows in results.items():
        for label, whole, blocks in rows:
            lines.append(f"| {workload} ({sizes[workload]:,}) | {label} | {whole:.3f} | "
                         f"{blocks:.3f} | {blocks / whole:.2f}x |")
    lines.append(END)
    publish("\n".join(lines), START, END, write=args.write)


if __name__ == "__main__":
    main()
