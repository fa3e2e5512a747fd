"""Source fingerprints: in-memory data by content, files by identity, generators by code."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

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
