"""Snapshot throughput against the baselines, one system and one phase per fresh process.

    python -m benchmarks.throughput write SYSTEM WORKLOAD COMPRESSION N DIR
    python -m benchmarks.throughput read  SYSTEM WORKLOAD COMPRESSION N DIR [PREFETCH_BYTES]
    python -m benchmarks.throughput reread SYSTEM WORKLOAD COMPRESSION N DIR
    python -m benchmarks.throughput alternate snapcache WORKLOAD A:B N DIR_A DIR_B

Each prints one JSON line. ``reread`` is ``read`` without the one-by-one pass (a repeated
measurement of the first batch and the batched epochs). Readers run in their own process so peak RSS (``ru_maxrss``) is the
reading alone. Every system's batches are copied into the same preallocated staging buffers.
Systems: snapcache, raw (numpy ``readinto`` of the same bytes from page cache), pickle (one
pickled list of examples a shard), tfdata (``tf.data.Dataset.save``/``load``: the snapshot file
format and reader), hf (Hugging Face datasets' ``map`` cache file, ``with_format("numpy",
dtype=None)``).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import pickle
import resource
import sys
import time

import numpy as np

from benchmarks.workloads import MAKERS, TOKENS, consume, consume_one, example_bytes, staging

BATCH = 256
EPOCHS = 3
PICKLE_SHARD = 1000
TF_CODECS = {"none": None, "lz4": "SNAPPY", "zstd": "GZIP"}
SINGLE_LIMIT = {"tfdata": 20_000, "hf": 20_000}
"""Examples the one-by-one pass reads of the peers that do ~3,500 examples/s here (all
200,000 token-like ones took a minute each); their rate is steady long before."""


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so
    a child would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dir_size(path: str) -> int:
    total = 0
    for base, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(base, f)) for f in files)
    return total


# -- snapcache ---------------------------------------------------------------------------------
def _sc_pipeline(workload, n, root, compression, snapshot=True, prefetch_bytes=None):
    import snapcache as sc
    ds = sc.Dataset.range(n).map(MAKERS[workload])
    if snapshot:
        ds = ds.snapshot(root, compression=compression, progress=False,
                         prefetch_bytes=prefetch_bytes)
    return ds


def write_snapcache(workload, compression, n, root):
    """The writing epoch; for ``none`` also the same epoch without a snapshot just before it
    (once a workload: it does not depend on the codec)."""
    out = {}
    if compression == "none":
        t = time.perf_counter()
        for _ in _sc_pipeline(workload, n, root, compression, snapshot=False):
            pass
        out["no_snapshot_s"] = time.perf_counter() - t
    t = time.perf_counter()
    for _ in _sc_pipeline(workload, n, root, compression):
        pass
    written = time.perf_counter() - t
    return {"first_epoch_s": written, **out, "disk_bytes": dir_size(root)}


def read_snapcache(workload, compression, n, root, prefetch_bytes=None):
    import snapcache  # noqa: F401  (imports are not part of the time to first batch)
    stage = staging(workload, BATCH)
    t0 = time.perf_counter()
    ds = _sc_pipeline(workload, n, root, compression, prefetch_bytes=prefetch_bytes)
    batched = ds.batch(BATCH)
    it = iter(batched)
    consume(stage, next(it))
    first = time.perf_counter() - t0
    for b in it:
        consume(stage, b)
    return first, lambda: (consume(stage, b) for b in batched), lambda: (
        consume_one(stage, e, i % BATCH) for i, e in enumerate(ds))


# -- raw numpy read of the same bytes ----------------------------------------------------------
def _raw_paths(root, workload):
    key = "image" if workload == "image" else "tokens"
    other = "label" if workload == "image" else "length"
    return key, other, os.path.join(root, f"{key}.bin"), os.path.join(root, f"{other}.bin")


def write_raw(workload, compression, n, root):
    os.makedirs(root, exist_ok=True)
    key, other, p1, p2 = _raw_paths(root, workload)
    with open(p1, "wb") as f1, open(p2, "wb") as f2:
        for i in range(n):
            e = MAKERS[workload](i)
            f1.write(np.ascontiguousarray(e[key]).tobytes())
            f2.write(np.int64(e[other]).tobytes())
    return {"disk_bytes": dir_size(root)}


def read_raw(workload, compression, n, root):
    key, other, p1, p2 = _raw_paths(root, workload)
    stage = staging(workload, BATCH)
    a, b = stage[key], stage[other]

    def epoch():
        with open(p1, "rb", buffering=0) as f1, open(p2, "rb", buffering=0) as f2:
            for start in range(0, n, BATCH):
                m = min(BATCH, n - start)
                f1.readinto(memoryview(a[:m]).cast("B"))
                f2.readinto(memoryview(b[:m]).cast("B"))
                yield m

    t0 = time.perf_counter()
    next(epoch())
    first = time.perf_counter() - t0
    return first, epoch, None


# -- pickle per shard --------------------------------------------------------------------------
def write_pickle(workload, compression, n, root):
    os.makedirs(root, exist_ok=True)
    for s, start in enumerate(range(0, n, PICKLE_SHARD)):
        examples = [MAKERS[workload](i) for i in range(start, min(n, start + PICKLE_SHARD))]
        with open(os.path.join(root, f"shard-{s:05d}.pkl"), "wb") as f:
            pickle.dump(examples, f, protocol=5)
    return {"disk_bytes": dir_size(root)}


def read_pickle(workload, compression, n, root):
    files = sorted(os.path.join(root, f) for f in os.listdir(root))
    stage = staging(workload, BATCH)

    def examples():
        for path in files:
            with open(path, "rb") as f:
                yield from pickle.load(f)

    def batches():
        chunk = []
        for e in examples():
            chunk.append(e)
            if len(chunk) == BATCH:
                yield consume(stage, {k: np.stack([c[k] for c in chunk]) for k in stage})
                chunk = []
        if chunk:
            yield consume(stage, {k: np.stack([c[k] for c in chunk]) for k in stage})

    t0 = time.perf_counter()
    next(batches())
    first = time.perf_counter() - t0
    return first, batches, lambda: (consume_one(stage, e, i % BATCH)
                                    for i, e in enumerate(examples()))


# -- tf.data -----------------------------------------------------------------------------------
def _tf_signature(tf, workload):
    if workload == "image":
        return {"image": tf.TensorSpec((128, 128, 3), tf.uint8),
                "label": tf.TensorSpec((), tf.int64)}
    return {"tokens": tf.TensorSpec((TOKENS,), tf.int32), "length": tf.TensorSpec((), tf.int64)}


def write_tfdata(workload, compression, n, root):
    import tensorflow as tf

    def gen():
        for i in range(n):
            e = MAKERS[workload](i)
            yield {k: np.asarray(v) for k, v in e.items()}

    ds = tf.data.Dataset.from_generator(gen, output_signature=_tf_signature(tf, workload))
    t = time.perf_counter()
    ds.save(root, compression=TF_CODECS[compression])
    return {"first_epoch_s": time.perf_counter() - t, "disk_bytes": dir_size(root),
            "codec": TF_CODECS[compression] or "none"}


def read_tfdata(workload, compression, n, root):
    import tensorflow as tf
    stage = staging(workload, BATCH)
    t0 = time.perf_counter()
    base = tf.data.Dataset.load(root, compression=TF_CODECS[compression])
    batched = base.batch(BATCH).prefetch(tf.data.AUTOTUNE)
    it = batched.as_numpy_iterator()
    consume(stage, next(it))
    first = time.perf_counter() - t0
    for b in it:
        consume(stage, b)
    single = base.prefetch(tf.data.AUTOTUNE)
    return first, lambda: (consume(stage, b) for b in batched.as_numpy_iterator()), lambda: (
        consume_one(stage, e, i % BATCH) for i, e in enumerate(single.as_numpy_iterator()))


# -- Hugging Face datasets ---------------------------------------------------------------------
def _hf_features(datasets, workload):
    if workload == "image":
        return datasets.Features({"image": datasets.Array3D((128, 128, 3), "uint8"),
                                  "label": datasets.Value("int64")})
    return datasets.Features({"tokens": datasets.Sequence(datasets.Value("int32"),
                                                          length=TOKENS),
                              "length": datasets.Value("int64")})


def _hf_make_batch(batch, workload):
    rows = [MAKERS[workload](int(i)) for i in batch["i"]]
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}


def write_hf(workload, compression, n, root):
    import datasets
    datasets.disable_progress_bars()
    os.makedirs(root, exist_ok=True)
    src = datasets.Dataset.from_dict({"i": np.arange(n)})
    t = time.perf_counter()
    src.map(_hf_make_batch, batched=True, batch_size=1000, fn_kwargs={"workload": workload},
            remove_columns=["i"], features=_hf_features(datasets, workload),
            cache_file_name=os.path.join(root, "cache.arrow"))
    return {"first_epoch_s": time.perf_counter() - t, "disk_bytes": dir_size(root)}


def read_hf(workload, compression, n, root):
    import datasets
    datasets.disable_progress_bars()
    stage = staging(workload, BATCH)
    t0 = time.perf_counter()
    ds = datasets.Dataset.from_file(os.path.join(root, "cache.arrow")).with_format(
        "numpy", dtype=None)
    it = ds.iter(batch_size=BATCH)
    consume(stage, next(it))
    first = time.perf_counter() - t0
    for b in it:
        consume(stage, b)
    return first, lambda: (consume(stage, b) for b in ds.iter(batch_size=BATCH)), lambda: (
        consume_one(stage, e, i % BATCH) for i, e in enumerate(ds))


WRITERS = {"snapcache": write_snapcache, "raw": write_raw, "pickle": write_pickle,
           "tfdata": write_tfdata, "hf": write_hf}
ALTERNATE_EPOCHS = 20
"""Epochs of each snapshot an ``alternate`` process reads, one of each in turn."""


def alternate(workload: str, codecs: str, n: int, root_a: str, root_b: str) -> dict:
    """Two snapcache snapshots of one workload (``codecs`` "A:B") read in one process, an
    epoch of one then of the other, :data:`ALTERNATE_EPOCHS` each (which goes first
    alternates): ``b_over_a`` is A's median epoch time over B's, B's speed relative to A's.
    Fresh processes of the same reader differ by up to 25% here (each its own mappings and
    buffers), more than the ~30 ms epochs of one process do, so a comparison of two
    snapshots is steadiest within one process."""
    names = codecs.split(":")
    readers = [read_snapcache(workload, c, n, root)[1]
               for c, root in zip(names, (root_a, root_b))]
    epochs: list[list[float]] = [[], []]
    for i in range(ALTERNATE_EPOCHS):
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            epochs[j].append(timed(readers[j], n)[0])
    a, b = (statistics.median(e) for e in epochs)
    return {"b_over_a": a / b, "epochs_s": {names[0]: epochs[0], names[1]: epochs[1]}}


READERS = {"snapcache": read_snapcache, "raw": read_raw, "pickle": read_pickle,
           "tfdata": read_tfdata, "hf": read_hf}


def timed(run, count):
    t = time.perf_counter()
    total = 0
    for m in run():
        total += m if isinstance(m, int) else 1
    return time.perf_counter() - t, total


def main(argv):
    phase, system, workload, compression, n, root = argv[:6]
    n = int(n)
    if phase == "write":
        out = WRITERS[system](workload, compression, n, root)
    elif phase == "alternate":
        out = alternate(workload, compression, n, root, argv[6])
    else:
        extra = [int(argv[6])] if len(argv) > 6 and system == "snapcache" else []
        first, batched, single = READERS[system](workload, compression, n, root, *extra)
        epochs = []
        for _ in range(EPOCHS):
            seconds, count = timed(batched, n)
            epochs.append(seconds)
        best = min(epochs)
        payload = n * example_bytes(workload)
        out = {"first_batch_s": first, "batched_s": best, "batched_mb_s": payload / best / 1e6,
               "batched_ex_s": n / best, "epochs_s": epochs}
        if single is not None and phase == "read":
            limit = min(n, SINGLE_LIMIT.get(system, n))
            seconds, count = timed(lambda: itertools.islice(single(), limit), n)
            out["single_ex_s"] = count / seconds
        out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
