"""Source fingerprints: in-memory data by content, files by identity, generators by code."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import FingerprintError
from snapcache.fingerprint.explain import diff_trees
from snapcache.fingerprint.sources import (hash_files_source, hash_generator_source,
                                           hash_iterable_source, hash_range_source)
from snapcache.store.source_files import file_identity


def files_node(paths, strict=False):
    """Fingerprinting is pure: the identities are read first (as the pipeline does)."""
    return hash_files_source([file_identity(os.fspath(p), strict) for p in paths],
                             strict=strict)


def test_iterable_source_by_content_and_order():
    a = hash_iterable_source([1, "two", {"three": 3.0}, np.arange(3)])
    assert a.digest == hash_iterable_source([1, "two", {"three": 3.0}, np.arange(3)]).digest
    assert a.digest != hash_iterable_source(["two", 1, {"three": 3.0}, np.arange(3)]).digest
    assert a.digest != hash_iterable_source([1, "two", {"three": 3.0}, np.arange(4)]).digest
    assert a.label == "source" and a.summary == "4 items"
    assert hash_iterable_source([], label="data").label == "data"
    assert hash_iterable_source([[1, 2]]).digest != hash_iterable_source([1, 2]).digest


def test_iterable_source_unhashable_item_names_its_position():
    with pytest.raises(FingerprintError, match="item #1"):
        hash_iterable_source([1, threading.Lock()])


@pytest.mark.parametrize("make_item", [
    lambda i: i,
    lambda i: f"example-{i}",
    lambda i: {"id": i, "label": i % 10, "path": f"img/{i}.jpg"},
    lambda i: np.full(4, i, np.float32),
], ids=["ints", "strs", "dicts", "arrays"])
def test_iterable_source_100k_items_is_deterministic(make_item):
    """100,000 items hash the same twice and differ when one item does (speed is measured
    in benchmarks/bench_fingerprint.py, not asserted here)."""
    items = [make_item(i) for i in range(100_000)]
    digest = hash_iterable_source(items).digest
    assert hash_iterable_source(list(items)).digest == digest
    items[50_000] = make_item(-1)
    assert hash_iterable_source(items).digest != digest


WORDS = {f"word-{i:02d}" for i in range(20)}


def test_a_set_source_is_taken_sorted():
    """A set's order follows PYTHONHASHSEED; as a source it is sorted, so the examples' order and
    the fingerprint are the same in every process (an audit found three seeds, three snapshots).
    """
    ds = sc.Dataset.from_iterable(WORDS)
    assert list(ds) == sorted(WORDS)
    assert ds.fingerprint() == sc.Dataset.from_iterable(sorted(WORDS)).fingerprint()
    assert list(sc.Dataset.from_iterable(frozenset({3, 1.5, -2}))) == [-2, 1.5, 3]
    pairs = {("b", 1), ("a", 2), ("a", 1)}
    assert list(sc.Dataset.from_iterable(pairs)) == [("a", 1), ("a", 2), ("b", 1)]


def test_a_set_of_files_is_taken_sorted(tmp_path):
    paths = []
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_text("x" * i)
        paths.append(tmp_path / f"f{i:02d}.txt")
    listed = sc.Dataset.from_files(sorted(map(str, paths)))
    for given in ({str(p) for p in paths}, set(paths)):
        ds = sc.Dataset.from_files(given)
        assert list(ds) == list(listed)
        assert ds.fingerprint() == listed.fingerprint()


@pytest.mark.parametrize("items", [
    {1, "a"},                                  # no order between int and str
    {frozenset({1}), frozenset({2})},          # sets are only partly ordered
    {float("nan"), 1.0, 2.0},                  # NaN is not ordered
    {np.int64(1), np.int64(2)},                # not known to be totally ordered
], ids=["mixed", "frozensets", "nan", "numpy"])
def test_a_set_without_one_order_is_refused(items):
    with pytest.raises(TypeError, match=r"sorted\(items, key=\.\.\.\)"):
        sc.Dataset.from_iterable(items)


def test_range_source():
    assert hash_range_source(0, 10, 1).digest == hash_range_source(0, 10, 1).digest
    assert hash_range_source(0, 10, 1).digest != hash_range_source(0, 11, 1).digest
    assert hash_range_source(0, 10, 1).summary == "range(0, 10, 1)"
    with pytest.raises(TypeError):
        hash_range_source(0, 1.5, 1)


def _gen(n, *, start=0):
    yield from range(start, n)


def _gen2(n, *, start=0):
    yield from range(start, n, 2)


def test_generator_source_by_function_and_arguments():
    a = hash_generator_source(_gen, (10,), {"start": 1})
    assert a.digest == hash_generator_source(_gen, (10,), {"start": 1}).digest
    assert a.digest != hash_generator_source(_gen, (11,), {"start": 1}).digest
    assert a.digest != hash_generator_source(_gen, (10,), {"start": 2}).digest
    assert a.digest != hash_generator_source(_gen2, (10,), {"start": 1}).digest
    assert [c.label for c in a.children] == ["generator function", "argument #0",
                                             "argument `start`"]


@pytest.fixture
def files(tmp_path):
    paths = []
    for name, data in [("a.jpg", b"aaa"), ("b.jpg", b"bbbb"), ("c.jpg", b"c")]:
        p = tmp_path / name
        p.write_bytes(data)
        paths.append(str(p))
    return paths


def test_files_source_by_identity(files):
    node = files_node(files)
    assert node.label == "source" and node.summary == "3 files"
    assert [c.label for c in node.children] == [f"file `{p}`" for p in files]
    assert node.children[0].summary.startswith("3 bytes, modified ")
    assert files_node(files).digest == node.digest
    assert files_node(list(reversed(files))).digest != node.digest
    assert files_node(files[:2]).digest != node.digest


def test_files_source_explains_changes(files, tmp_path):
    old = files_node(files)
    extra = []
    for name in ("d.jpg", "e.jpg", "f.jpg"):
        (tmp_path / name).write_bytes(b"x")
        extra.append(str(tmp_path / name))
    assert diff_trees(old, files_node(files + extra)) == ["source: 3 files added"]
    assert diff_trees(old, files_node(files[:2])) == ["source: 1 file removed"]
    with open(files[0], "ab") as f:
        f.write(b"more")
    [line] = diff_trees(old, files_node(files))
    assert line.startswith(f"source: file `{files[0]}` changed (3 bytes, modified ")
    assert " -> 7 bytes, modified " in line


def test_strict_mode_sees_content_behind_same_size_and_mtime(files):
    st = os.stat(files[1])
    loose, strict = files_node(files), files_node(files, strict=True)
    with open(files[1], "r+b") as f:
        f.write(b"XXXX")
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert files_node(files).digest == loose.digest
    assert files_node(files, strict=True).digest != strict.digest


def test_files_source_accepts_path_objects(files):
    import pathlib
    assert files_node([pathlib.Path(p) for p in files]).digest == \
        files_node(files).digest
