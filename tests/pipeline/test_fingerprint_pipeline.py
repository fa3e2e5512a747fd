"""Fingerprints of whole pipelines: what counts, what does not, escape hatches, warnings."""

from __future__ import annotations

import os
import re
import sys
import warnings

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import RandomnessWarning
from snapcache.fingerprint import register

SIZE = 224


def decode_and_resize(i):
    return {"x": np.full(3, i * SIZE)}


def upstream():
    return sc.Dataset.range(20).map(decode_and_resize)


def test_downstream_ops_do_not_change_the_snapshot_key(tmp_path):
    a = upstream().snapshot(str(tmp_path / "a")).shuffle(5, seed=1).batch(4)
    b = upstream().snapshot(str(tmp_path / "b")).map(lambda e: e).batch(8).prefetch(2)
    list(a)
    list(b)
    # another root path, other downstream ops: the same snapshot folder name
    assert os.listdir(tmp_path / "a") == os.listdir(tmp_path / "b") == [upstream().fingerprint()]


def test_prefetch_cache_and_parallelism_do_not_count():
    base = sc.Dataset.range(5).map(decode_and_resize)
    same = sc.Dataset.range(5).prefetch(3).map(decode_and_resize, num_parallel_calls=4).cache()
    assert base.fingerprint() == same.fingerprint()


def test_what_is_computed_counts():
    fps = {
        sc.Dataset.range(5).fingerprint(),
        sc.Dataset.range(6).fingerprint(),
        sc.Dataset.range(5).map(decode_and_resize).fingerprint(),
        sc.Dataset.range(5).map(decode_and_resize).batch(2).fingerprint(),
        sc.Dataset.range(5).map(decode_and_resize).batch(3).fingerprint(),
        sc.Dataset.range(5).map(decode_and_resize).filter(bool).fingerprint(),
        sc.Dataset.range(5).shuffle(3, seed=1).fingerprint(),
        sc.Dataset.range(5).shuffle(3, seed=2).fingerprint(),
        sc.Dataset.range(5).take(3).fingerprint(),
        sc.Dataset.from_iterable([1, 2, 3]).fingerprint(),
        sc.Dataset.from_iterable([1, 2, 4]).fingerprint(),
    }
    assert len(fps) == 11


def test_global_change_invalidates(tmp_path, monkeypatch):
    before = upstream().fingerprint()
    monkeypatch.setattr(__import__(__name__), "SIZE", 256)
    assert upstream().fingerprint() != before


def test_unhashable_capture_names_it_and_the_way_out(tmp_path):
    import threading

    lock = threading.Lock()

    def with_lock(i):
        with lock:
            return i

    ds = sc.Dataset.range(3).map(with_lock)
    with pytest.raises(sc.FingerprintError) as info:
        ds.fingerprint()
    message = str(info.value)
    assert "closure `lock`" in message and "map #1" in message
    assert 'key="' in message and "register" in message
    # nothing was written for a pipeline that cannot be fingerprinted
    with pytest.raises(sc.FingerprintError):
        list(ds.snapshot(str(tmp_path)))
    assert not os.path.exists(tmp_path) or os.listdir(tmp_path) == []


def test_key_replaces_the_fingerprint(tmp_path):
    import threading

    lock = threading.Lock()
    calls = []

    def with_lock(i):
        with lock:
            calls.append(i)
            return i * 2

    ds = sc.Dataset.range(4).map(with_lock).snapshot(str(tmp_path), key="my-version-7")
    assert list(ds) == [0, 2, 4, 6]
    assert list(ds) == [0, 2, 4, 6]
    assert len(calls) == 4
    (folder,) = os.listdir(tmp_path)
    # the key alone decides: another upstream with the same key reads the same snapshot
    other = sc.Dataset.range(100).snapshot(str(tmp_path), key="my-version-7")
    assert list(other) == [0, 2, 4, 6]
    assert os.listdir(tmp_path) == [folder]
    assert "hit" in str(other.explain())


def test_a_snapshot_after_a_keyed_snapshot_keys_on_its_key_and_what_follows(tmp_path):
    """The key names the version of everything below it: a new key rebuilds the snapshots
    above it too, and what is below it (unhashable, the reason for a key) is not looked at."""
    import threading

    lock = threading.Lock()

    def pipeline(key, scale=10, inner="inner", more=False):
        below = sc.Dataset.range(3).map(lambda i, lock=lock: i)
        if more:
            below = below.filter(bool)
        inner = below.snapshot(str(tmp_path / inner), key=key, progress=False)
        return inner.map(lambda i: i * scale).snapshot(str(tmp_path / "outer"), progress=False)

    first = pipeline("v1")
    assert list(first) == [0, 10, 20]
    assert pipeline("v1").fingerprint() == first.fingerprint()
    assert pipeline("v2").fingerprint() != first.fingerprint()
    assert pipeline("v1", scale=3).fingerprint() != first.fingerprint()  # after the key counts
    # the same key in another root is another dataset (train and val, both "v1")
    assert pipeline("v1", inner="inner2").fingerprint() != first.fingerprint()
    # ops added below the keyed snapshot, the key kept: nothing after it changes
    assert pipeline("v1", more=True).fingerprint() == first.fingerprint()
    keyed = sc.Dataset.range(5).snapshot(str(tmp_path / "k"), key="v1")
    assert keyed.fingerprint() == sc.Dataset.range(9).snapshot(str(tmp_path / "k"),
                                                               key="v1").fingerprint()


class Resizer:
    def __init__(self, size):
        self.size = size
        self._cache = {}


def test_register_teaches_a_new_type():
    import threading

    class Handle:  # unhashable: holds a lock
        def __init__(self, version):
            self.version = version
            self.lock = threading.Lock()

    h1, h2 = Handle(1), Handle(2)
    with pytest.raises(sc.FingerprintError):
        sc.Dataset.range(2).map(lambda i: (h1, i)[1]).fingerprint()
    register(Handle, lambda h: ("Handle", h.version))
    f1 = sc.Dataset.range(2).map(lambda i: (h1, i)[1]).fingerprint()
    f2 = sc.Dataset.range(2).map(lambda i: (h2, i)[1]).fingerprint()
    assert f1 != f2


def _augment(i):
    return i + np.random.rand()


def _seeded(i):
    return i + np.random.default_rng(i).random()


def test_randomness_upstream_warns(tmp_path):
    with pytest.warns(RandomnessWarning, match="map #1 `_augment`.*np.random") as caught:
        line = sys._getframe().f_lineno + 1
        list(sc.Dataset.range(3).map(_augment).snapshot(str(tmp_path / "a")))
    [warning] = [w for w in caught if issubclass(w.category, RandomnessWarning)]
    assert (warning.filename, warning.lineno) == (__file__, line)  # the user's line
    with pytest.warns(RandomnessWarning, match="unseeded shuffle"):
        list(sc.Dataset.range(3).shuffle(2).snapshot(str(tmp_path / "b")))
    with pytest.warns(RandomnessWarning, match=r"unseeded generator \(`np.random.default_rng\(\)`"):
        list(sc.Dataset.range(3).map(lambda i: np.random.default_rng().random())
             .snapshot(str(tmp_path / "e")))
    with pytest.warns(RandomnessWarning, match=r"builtin `hash\(\)`.*PYTHONHASHSEED"):
        list(sc.Dataset.range(3).map(lambda i: hash(f"tok{i}") % 7).snapshot(str(tmp_path / "f")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(sc.Dataset.range(3).map(_seeded).shuffle(2, seed=0).snapshot(str(tmp_path / "c")))
        # randomness after the snapshot is what users want: no warning
        list(sc.Dataset.range(3).snapshot(str(tmp_path / "d")).map(_augment).shuffle(2))


def test_randomness_warnings_can_be_filtered_by_the_users_module(tmp_path):
    """Attributed to the user's line, a warning obeys filters by module (and ``-W error``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=RandomnessWarning, module=re.escape(__name__))
        with pytest.raises(RandomnessWarning):
            list(sc.Dataset.range(3).map(_augment).snapshot(str(tmp_path / "a")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=RandomnessWarning, module=re.escape(__name__))
        list(sc.Dataset.range(3).map(_augment).snapshot(str(tmp_path / "b")))


def test_a_warning_in_a_pipeline_a_function_iterates_points_at_that_function(tmp_path):
    inner = sc.Dataset.range(2).map(_augment).snapshot(str(tmp_path / "inner"))
    line = sys._getframe().f_lineno + 3  # the loop in expand()

    def expand(i):
        return [x + i for x in inner]
    with pytest.warns(RandomnessWarning) as caught:
        list(sc.Dataset.range(2).interleave(expand))
    [warning] = [w for w in caught if issubclass(w.category, RandomnessWarning)]
    assert (warning.filename, warning.lineno) == (__file__, line)


def test_explain_common_misses(tmp_path, monkeypatch):
    import fsspec  # noqa: F401  (files source)

    root = str(tmp_path / "snaps")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"{i}.txt").write_text(str(i))
    # An ordinary snapshot (delta=False; a delta snapshot's explain is in test_delta.py):
    # a grown file list is another snapshot, explained by its closest one.
    pipeline = lambda: (sc.Dataset.from_files(str(data / "*.txt"))  # noqa: E731
                        .map(decode_path).snapshot(root, name="files", delta=False))
    ds = pipeline()
    assert "no committed snapshot to compare with" in str(ds.explain())
    list(ds)
    assert ds.explain().hit
    for i in range(3, 6):
        (data / f"{i}.txt").write_text(str(i))
    report = str(pipeline().explain())
    assert "closest: snapshot" in report and "(files)" in report
    assert "source: 3 files added" in report, report
    monkeypatch.setattr(__import__(__name__), "SCALE", 3)
    for i in range(3, 6):
        (data / f"{i}.txt").unlink()
    report = str(pipeline().explain())
    assert "map #1 `decode_path`: global `SCALE` changed (2 -> 3)" in report, report


SCALE = 2


def decode_path(path):
    return {"n": int(open(path).read()) * SCALE}


def test_captured_datasets_count_by_their_pipeline():
    def make(n):
        inner = sc.Dataset.range(n)
        return sc.Dataset.range(2).interleave(lambda i: inner, cycle_length=1)

    assert make(3).fingerprint() == make(3).fingerprint() != make(4).fingerprint()
    # snapcache itself is a library (by version), even when installed from a checkout
    ds = sc.Dataset.range(3).interleave(lambda i: sc.Dataset.range(i), cycle_length=2)
    assert ds.fingerprint()


def records(i):
    return [i * 10 + k for k in range(3)]


def test_interleave_autotune_is_this_machines_cpu_count_once_and_counts(tmp_path, monkeypatch):
    """cycle_length decides the order (and what a take after it keeps): AUTOTUNE is resolved
    when the pipeline is built, so a snapshot's fingerprint says what its examples are and
    every process that runs the pipeline (Ray tasks, workers) runs the same cycle."""
    import pickle

    from snapcache.pipeline import dataset

    def pipeline():
        return sc.Dataset.range(4).interleave(records).take(4).snapshot(str(tmp_path),
                                                                         progress=False)

    monkeypatch.setattr(dataset, "available_cpus", lambda: 1)
    one = pipeline()
    monkeypatch.setattr(dataset, "available_cpus", lambda: 2)
    two = pipeline()
    assert list(one) == [0, 1, 2, 10] and list(two) == [0, 10, 1, 11]
    assert one.fingerprint() != two.fingerprint()
    assert one._op.parent.parent.cycle_length == 1
    shipped = pickle.loads(pickle.dumps(one))  # to a worker with another CPU count
    assert list(shipped) == [0, 1, 2, 10]
