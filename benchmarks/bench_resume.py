"""Resume and random-access benchmarks (issue #15).

    python -m benchmarks.bench_resume [--examples 40000] [--no-write]

- Resume: time from resuming a state saved at 90% of an epoch to the next batch, against the
  time to the first batch of a fresh epoch, for ``snapshot -> map -> shuffle(seed) -> batch``
  through ``Dataset.iterate(state=...)`` and through torchdata's ``StatefulDataLoader``
  (``load_state_dict``, 2 workers). A loader that replays to its position would pay the
  "replay 90%" column.
- Random access: ``snap[i]`` latency (``snapcache.open_snapshot(...)[i]``) for random indices, on local
  disk and on the loopback S3 server (moto, as the tests use): the first touch of a shard loads
  and verifies it; the first of a record batch decodes it once; later rows of it are an index.
  Against LitData and Mosaic streaming: ``benchmarks/bench_access.py``.

Results go to docs/benchmarks.md between the ``resume-benchmarks`` markers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

import numpy as np

import snapcache as sc
from benchmarks.loopback_s3 import loopback_s3
from benchmarks.report import command_line, markers, publish

START, END = markers("resume-benchmarks")
BATCH = 256


def example(i: int) -> dict:
    """Noise (incompressible, like decoded photos) so shards hold what their size says."""
    image = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return {"image": image, "label": np.int64(i)}


def augment(e: dict) -> dict:
    return {"image": e["image"][:, ::-1], "label": e["label"]}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def resume_numbers(root: str, n: int, repeats: int = 3) -> dict:
    base = sc.Dataset.range(n).map(example).snapshot(root, shard_size=8 << 20, progress=False)
    for _ in base.batch(1024):
        pass
    ds = base.map(augment).shuffle(10_000, seed=0).batch(BATCH)
    steps = n // BATCH
    at = int(steps * 0.9)

    fresh, resumed, replay = [], [], []
    for r in range(repeats):
        fresh.append(timed(lambda: next(iter(ds.iterate(r)))))
        it = ds.iterate(r)
        replay.append(timed(lambda: [next(it) for _ in range(at)]))
        state = json.loads(json.dumps(it.state_dict()))
        it.close()
        resumed.append(timed(lambda: next(ds.iterate(state=state))))
    out = {"fresh": min(fresh), "resumed": min(resumed), "replay": min(replay)}

    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return out
    loader_fresh, loader_resumed = [], []
    for r in range(repeats):
        loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)
        loader_fresh.append(timed(lambda: next(iter(loader))))
        loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)
        it = iter(loader)
        for _ in range(at):
            next(it)
        state = loader.state_dict()
        del it
        again = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)

        def resume() -> None:
            again.load_state_dict(state)
            next(iter(again))

        loader_resumed.append(timed(resume))
    out.update(loader_fresh=min(loader_fresh), loader_resumed=min(loader_resumed))
    return out


def access_numbers(root: str, n: int, probes: int = 300, storage_options=None) -> dict:
    ds = sc.Dataset.range(n).map(example).snapshot(root, shard_size=4 << 20, progress=False,
                                                   storage_options=storage_options)
    for _ in ds.batch(1024):
        pass
    access = sc.open_snapshot(root, storage_options=storage_options)  # the public handle
    reader = access.reader()
    rng = np.random.default_rng(0)
    indices = rng.integers(0, n, probes).tolist()
    cold = [timed(lambda i=i: access[i]) for i in indices]
    warm = [timed(lambda i=i: access[i]) for i in rng.integers(0, n, probes).tolist()]
    q = lambda xs, p: float(np.quantile(xs, p)) * 1e3  # noqa: E731
    return {"shards": len(reader.manifest.shards), "cold_median_ms": q(cold, 0.5),
            "cold_p99_ms": q(cold, 0.99), "warm_median_ms": q(warm, 0.5),
            "warm_p99_ms": q(warm, 0.99), "probes": probes}


def s3_access_numbers(n: int) -> dict | None:
    with contextlib.ExitStack() as stack:
        try:
            _, bucket, _ = stack.enter_context(loopback_s3())
        except RuntimeError:  # no moto or s3fs here: the S3 row is left out
            return None
        return access_numbers(f"s3://{bucket}/snaps", n, probes=100)


def report(n: int, resume: dict, local: dict, s3: dict | None) -> str:
    L = [START, "", "## Resume and random access", "",
         f"`python -m benchmarks.bench_resume --examples {n}` (one machine, 2 cores shared; "
         f"{n} examples of a 32x32x3 uint8 noise image and a label, zstd, 8 MiB shards for resume and 4 MiB for access; "
         f"`snapshot -> map(augment) -> shuffle(10_000, seed=0) -> batch({BATCH})`).", "",
         "| path | first batch of a fresh epoch | next batch after resuming at 90% | ratio |"
         " replaying to 90% |",
         "|---|---|---|---|---|",
         f"| `Dataset.iterate(state=...)` | {resume['fresh'] * 1e3:.1f} ms | "
         f"{resume['resumed'] * 1e3:.1f} ms | {resume['resumed'] / resume['fresh']:.2f}x | "
         f"{resume['replay'] * 1e3:.0f} ms |"]
    if "loader_fresh" in resume:
        L.append(f"| `StatefulDataLoader.load_state_dict` (2 workers) | "
                 f"{resume['loader_fresh'] * 1e3:.1f} ms | "
                 f"{resume['loader_resumed'] * 1e3:.1f} ms | "
                 f"{resume['loader_resumed'] / resume['loader_fresh']:.2f}x | |")
    L += ["", "The resume target is < 2x the fresh epoch's first batch: a resumed epoch reads the "
          "window it resumes in and nothing before it (no replay).", "",
          "`snap[i]` for random `i` (`snapcache.open_snapshot(root)[i]`; the first row of a "
          "record batch reads and verifies only the pages holding it on local disk (raw "
          "shards), that record batch alone on S3, and decodes that row; its second row reads, "
          "verifies and decodes the batch into views kept within half the read budget, later "
          "rows of a kept batch are an index; cold: the first probes of a fresh handle, warm: "
          "as many more after them):", "",
          "| storage | shards | cold median | cold p99 | warm median | warm p99 |",
          "|---|---|---|---|---|---|"]
    for name, row in (("local disk", local), ("loopback S3 (moto)", s3)):
        if row is None:
            continue
        L.append(f"| {name} | {row['shards']} | {row['cold_median_ms']:.2f} ms | "
                 f"{row['cold_p99_ms']:.1f} ms | {row['warm_median_ms']:.2f} ms | "
                 f"{row['warm_p99_ms']:.1f} ms |")
    L += ["", "Against LitData's and Mosaic streaming's `dataset[i]` on the same data: the next "
          "section (`python -m benchmarks.bench_access`).", "", END]
    return "\n".join(L)


def main(argv=None) -> None:
    parser = command_line(__doc__, writes_by_default=True)
    parser.add_argument("--examples", type=int, default=40_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        resume = resume_numbers(os.path.join(tmp, "resume"), args.examples)
        local = access_numbers(os.path.join(tmp, "access"), args.examples)
    s3 = s3_access_numbers(min(args.examples, 10_000))
    text = report(args.examples, resume, local, s3)
    publish(text, START, END, write=args.write)

if __name__ == "__main__":
    main()
