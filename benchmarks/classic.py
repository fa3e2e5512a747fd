"""The classic input-pipeline experiments (after tf.data's performance guide), with snapcache.

An artificial source: opening costs 30 ms, each example 15 ms to read; a 30 ms "expensive" map;
a 10 ms training step. All latencies are sleeps, like the guide's, so they overlap on threads.
Each pipeline runs ``EPOCHS`` epochs; the table reports wall time and the ratio to the naive one.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

import snapcache as sc

OPEN_S, READ_S, MAP_S, STEP_S = 0.030, 0.015, 0.030, 0.010
SOURCES, PER_SOURCE, EPOCHS = 2, 6, 3


def artificial(source_index):
    time.sleep(OPEN_S)
    for i in range(PER_SOURCE):
        time.sleep(READ_S)
        yield {"x": np.full(4, source_index * PER_SOURCE + i, np.float32)}


def expensive(example):
    time.sleep(MAP_S)
    return {"x": example["x"] * 2}


def sources():
    return sc.Dataset.range(SOURCES).interleave(artificial, cycle_length=1)


def run(ds, epochs=EPOCHS):
    t = time.perf_counter()
    per_epoch = []
    for _ in range(epochs):
        e = time.perf_counter()
        for _ in ds:
            time.sleep(STEP_S)
        per_epoch.append(time.perf_counter() - e)
    return time.perf_counter() - t, per_epoch


def pipelines(root):
    A = sc.AUTOTUNE
    parallel_sources = sc.Dataset.range(SOURCES).interleave(
        artificial, cycle_length=SOURCES, num_parallel_calls=A)
    return [
        ("naive: source -> map -> step", sources().map(expensive)),
        ("prefetch", sources().map(expensive).prefetch(A)),
        ("parallel interleave", parallel_sources.map(expensive).prefetch(A)),
        ("parallel map", sources().map(expensive, num_parallel_calls=A).prefetch(A)),
        ("parallel interleave + parallel map",
         parallel_sources.map(expensive, num_parallel_calls=A).prefetch(A)),
        ("cache after map", sources().map(expensive).cache().prefetch(A)),
        ("snapshot after map", sources().map(expensive).snapshot(root, progress=False)
         .prefetch(A)),
    ]


def scalar_vs_vectorized(n=10_000, batch=256):
    def inc(x):
        return x + 1
    data = np.arange(n, dtype=np.float32)
    scalar = sc.Dataset.from_iterable(data).map(inc).batch(batch)
    vector = sc.Dataset.from_iterable(data).batch(batch).map(inc)
    out = []
    for name, ds in (("scalar map then batch (10,000 tiny examples)", scalar),
                     ("batch then vectorized map", vector)):
        t = time.perf_counter()
        for _ in ds:
            pass
        out.append((name, time.perf_counter() - t))
    return out


def main():
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name, ds in pipelines(root):
            total, per_epoch = run(ds)
            rows.append((name, total, per_epoch))
    vec = scalar_vs_vectorized()
    return rows, vec


if __name__ == "__main__":
    for r in main()[0]:
        print(r)
