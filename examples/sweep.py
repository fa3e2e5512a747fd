"""A hyper-parameter sweep sharing one snapshot.

Four training processes start at once with different learning rates, batch sizes and
augmentation strengths over the same preprocessing. The upstream pipeline (source + expensive
map) is identical, so its fingerprint is too: the first process writes the snapshot, the others
wait for its commit and read it (``on_busy="wait"``, the default), or compute without writing
(``--on-busy compute``). Everything after ``.snapshot()`` differs per run and costs nothing.

    python examples/sweep.py                      # 4 runs, 2000 examples, 5 ms each
    python examples/sweep.py --examples 200 --epochs 3 --cost-ms 1 --json

The snapshot root is a temporary folder, removed at the end, unless ``--root`` names one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import snapcache as sc

CONFIGS = [
    {"lr": 0.05, "batch_size": 32, "noise": 0.0},
    {"lr": 0.02, "batch_size": 64, "noise": 0.1},
    {"lr": 0.1, "batch_size": 16, "noise": 0.05},
    {"lr": 0.01, "batch_size": 128, "noise": 0.2},
]
TRUE_WEIGHTS = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def preprocess(i):
    """The expensive step (decode, resize, tokenize...): runs once per example in the sweep."""
    time.sleep(float(os.environ.get("SWEEP_COST_S", "0")))  # stands for real work
    with open(os.environ["SWEEP_CALLS_LOG"], "a") as log:  # bookkeeping for the demo only
        log.write(f"{i}\n")
    features = np.random.default_rng(i).normal(size=4).astype(np.float32)
    return {"id": i, "features": features, "target": np.float32(features @ TRUE_WEIGHTS)}


def pipeline(root: str, examples: int, config: dict, on_busy: str) -> sc.Dataset:
    noise = config["noise"]

    def augment(e):  # random, cheap, per run: after the snapshot
        jitter = np.random.normal(scale=noise, size=4).astype(np.float32) if noise else 0
        return {**e, "x": e["features"] + jitter}

    return (sc.Dataset.range(examples)
            .map(preprocess, num_parallel_calls=4)
            .snapshot(root, on_busy=on_busy, progress=False)
            .map(augment)
            .shuffle(1000, seed=0)
            .batch(config["batch_size"]))


def train(root: str, examples: int, config: dict, on_busy: str, epochs: int = 2) -> dict:
    weights = np.zeros(4, np.float32)
    seen: list[tuple[int, bytes]] = []
    for epoch in range(epochs):
        for batch in pipeline(root, examples, config, on_busy).iterate(epoch):
            if epoch == 0:
                seen += zip(batch["id"].tolist(), map(bytes, batch["features"]))
            error = batch["x"] @ weights - batch["target"]
            weights -= config["lr"] * batch["x"].T @ error / len(error)
    digest = hashlib.sha256(b"".join(b"%d:%s" % pair for pair in sorted(seen))).hexdigest()
    return {**config, "loss": float(np.mean((weights - TRUE_WEIGHTS) ** 2)),
            "examples": len(seen), "epochs": epochs, "data_sha256": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each run")
    parser.add_argument("--cost-ms", type=float, default=5.0, help="preprocessing per example")
    parser.add_argument("--root", help="snapshot folder, kept (default: a temporary one, "
                                       "removed at the end)")
    parser.add_argument("--on-busy", choices=("wait", "compute"), default="wait")
    parser.add_argument("--json", action="store_true", help="print one JSON summary")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker is not None:  # one training run of the sweep (--root is always given)
        result = train(args.root, args.examples, CONFIGS[args.worker], args.on_busy,
                       args.epochs)
        print(json.dumps(result))
        return

    scratch = tempfile.mkdtemp(prefix="snapcache-sweep-")  # the call log, and the root
    try:
        summary = sweep(args, args.root or os.path.join(scratch, "snaps"), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(summary, args.json)


def sweep(args: argparse.Namespace, root: str, scratch: str) -> dict:
    """Start the runs at once, wait for them, and summarize."""
    log = os.path.join(scratch, "calls")
    env = {**os.environ, "SWEEP_CALLS_LOG": log, "SWEEP_COST_S": str(args.cost_ms / 1000)}
    start = time.perf_counter()
    runs = [subprocess.Popen([sys.executable, __file__, "--worker", str(k), "--root", root,
                              "--examples", str(args.examples), "--epochs", str(args.epochs),
                              "--on-busy", args.on_busy],
                             env=env, stdout=subprocess.PIPE, text=True)
            for k in range(len(CONFIGS))]
    results = []
    for run in runs:
        out, _ = run.communicate()
        if run.returncode:
            for other in runs:  # before their folders are removed
                other.kill()
                other.wait()
            sys.exit(f"a sweep run failed with exit status {run.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    with open(log) as f:
        calls = len(f.read().split())
    return {
        "runs": results, "seconds": round(time.perf_counter() - start, 2),
        "snapshots": len([n for n in os.listdir(root) if not n.startswith(".")]),
        "preprocessing_calls": calls,
        "calls_without_sharing": args.examples * len(results),
        "calls_saved": args.examples * len(results) - calls,
        "same_data": len({r["data_sha256"] for r in results}) == 1,
        "root": args.root,  # None: a temporary root, removed
    }


def report(summary: dict, as_json: bool) -> None:
    results, calls = summary["runs"], summary["preprocessing_calls"]
    if as_json:
        print(json.dumps(summary))
        return
    for r in results:
        print(f"lr={r['lr']:<5} batch={r['batch_size']:<4} noise={r['noise']:<5} "
              f"weight error={r['loss']:.4f}  data {r['data_sha256'][:12]}")
    where = summary["root"] or "a temporary root (removed; --root DIR keeps it)"
    print(f"{len(results)} runs in {summary['seconds']} s, {summary['snapshots']} snapshot in "
          f"{where}; all saw the same data: {summary['same_data']}")
    saved = summary["calls_saved"]
    print(f"preprocessing calls: {calls} instead of {summary['calls_without_sharing']} "
          + (f"({saved} saved)" if saved >= 0 else
             f"({-saved} more: with --on-busy compute, the runs that did not write computed "
             "every epoch until the snapshot was committed)"))


if __name__ == "__main__":
    main()
