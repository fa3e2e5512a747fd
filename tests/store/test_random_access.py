"""Warm random reads of local shards (snapcache.store.random_access): a shard's second row read
alone maps and holds it, rows of a held shard are decoded from the map without a system call,
each page checked against its checksum the first time a row uses it (a flipped byte in a page
not used before is refused naming the shard), held shards stay within their bound, and rows
equal a sequential read whatever the order or the threads."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import random_access, row_read
from snapcache.store.row_access import RowAccess
from snapcache.store.reader import SnapshotReader
from tests.equality import assert_same_example
from tests.store.test_row_read import Reads, build, example, flip


def rows_of(snap, index):
    """(first row of each record batch of shard ``index``, the shard's first row)."""
    first = sum(s.rows for s in snap.shards[:index])
    shard = snap.shards[index]
    starts = np.cumsum([0, *shard.batch_rows[:-1]]) + first
    return [int(s) for s in starts], first


def test_a_shards_second_row_read_alone_maps_it_then_rows_make_no_system_call(
        tmp_path, monkeypatch):
    snap, storage = build(str(tmp_path))
    starts, _ = rows_of(snap, 1)
    assert len(starts) >= 5
    reads = Reads(monkeypatch)
    fresh = sc.open_snapshot(str(tmp_path))
    assert_same_example(example(starts[0] + 1), fresh[starts[0] + 1])  # pread, pages only
    assert reads.preads and reads.others == []
    held = fresh._rows._shards_held
    assert len(held) == 0  # one row: the shard is not mapped
    count = len(reads.preads)
    for row in starts[1:]:  # the first row of every other record batch of the shard
        assert_same_example(example(row + 2), fresh[row + 2])
    assert len(held) == 1 and held.held_bytes == snap.shards[1].bytes
    assert len(reads.preads) == count and reads.others == []


def test_every_row_in_any_order_equals_the_sequential_read(tmp_path):
    snap, storage = build(str(tmp_path), n=600)
    everything = list(snap.reader())
    fresh = sc.open_snapshot(str(tmp_path))
    order = np.random.default_rng(7).permutation(len(snap)).tolist()
    for i in order:
        assert_same_example(everything[i], fresh[i])
    assert len(fresh._rows._shards_held) == len(snap.shards)  # all small enough to hold
    again = sc.open_snapshot(str(tmp_path))  # threads sharing one handle
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(again.__getitem__, order))
    for i, row in zip(order, got, strict=True):
        assert_same_example(everything[i], row)


@pytest.mark.parametrize("small", [True, False], ids=["verified-whole", "page-by-page"])
def test_a_flipped_byte_in_a_held_shards_unused_page_is_refused_naming_the_shard(
        tmp_path, monkeypatch, small):
    """A small shard is checked whole when it is held: damaged before, its pages are then
    checked one by one as used (rows of intact pages still read); a larger one is always
    checked page by page, so damage after it was held is found too."""
    if not small:
        monkeypatch.setattr(row_read, "POPULATE_BYTES", 0)
    snap, storage = build(str(tmp_path))
    starts, _ = rows_of(snap, 0)
    shard = snap.shards[0]
    j = 3  # a record batch no row was read from: its pages are not checked yet
    data = storage.read_bytes(shard.path)
    at = data.find(example(starts[j] + 1)["image"].tobytes(), shard.batch_offsets[j])
    assert shard.batch_offsets[j] < at < shard.batch_offsets[j + 1]
    rows = sc.open_snapshot(str(tmp_path))
    assert_same_example(example(starts[0]), rows[starts[0]])  # pread: the shard not held
    if small:
        flip(storage, shard, at + 10)  # before the shard is held
    assert_same_example(example(starts[1]), rows[starts[1]])  # the shard is held now
    held = rows._rows._shards_held.get(0)
    assert held is not None and held.checked is not None  # not verified whole
    if not small:
        flip(storage, shard, at + 10)  # the map sees it: MAP_SHARED over the page cache
    assert_same_example(example(starts[2]), rows[starts[2]])  # intact pages read
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 3: page \d+ .*checksum") \
            as info:
        rows[starts[j] + 1]
    assert shard.path in str(info.value) and "snapcache purge --root" in str(info.value)
    flip(storage, shard, at + 10)  # undone: the page was never marked checked
    assert_same_example(example(starts[j] + 1), rows[starts[j] + 1])


def test_a_small_intact_shard_is_verified_whole_when_held(tmp_path):
    snap, storage = build(str(tmp_path))
    starts, _ = rows_of(snap, 0)
    rows = sc.open_snapshot(str(tmp_path))
    for row in starts[:2]:
        assert_same_example(example(row), rows[row])
    held = rows._rows._shards_held.get(0)
    assert held is not None and held.checked is None  # one hash: no page left to check


@pytest.mark.parametrize("populate", [True, False], ids=["populated", "faulted-in"])
def test_held_local_shards_stay_within_half_the_read_budget_and_max_held(tmp_path, monkeypatch, populate):
    if not populate:
        monkeypatch.setattr(row_read, "POPULATE_BYTES", 0)
    snap, storage = build(str(tmp_path), n=600)
    largest = max(s.bytes for s in snap.shards)
    assert len(snap.shards) >= 3
    budget = 2 * (2 * largest)  # half of it: two shards
    rows = RowAccess(SnapshotReader.open(storage), budget=budget)
    held = rows._shards_held
    assert held.budget == budget // 2
    everything = list(snap.reader())
    for i in np.random.default_rng(3).permutation(len(snap)).tolist():
        assert_same_example(everything[i], rows[i])
        assert held.held_bytes <= budget // 2 and len(held) <= 2
    assert len(held) == 2
    monkeypatch.setattr(random_access, "MAX_HELD", 1)  # and at most so many shards
    few = RowAccess(SnapshotReader.open(storage), budget=budget)
    for i in np.random.default_rng(5).permutation(len(snap)).tolist():
        assert_same_example(everything[i], few[i])
        assert len(few._shards_held) <= 1
    assert len(few._shards_held) == 1
    tiny = RowAccess(SnapshotReader.open(storage), budget=largest)  # half: no shard fits
    for i in np.random.default_rng(4).permutation(len(snap))[:200].tolist():
        assert_same_example(everything[i], tiny[i])
    assert len(tiny._shards_held) == 0 and tiny._shards_held.held_bytes == 0


def test_rows_of_a_damaged_map_size_are_refused(tmp_path):
    snap, storage = build(str(tmp_path))
    starts, _ = rows_of(snap, 0)
    rows = sc.open_snapshot(str(tmp_path))
    assert_same_example(example(starts[0]), rows[starts[0]])
    path = os.path.join(storage.root, snap.shards[0].path)
    with open(path, "ab") as f:  # longer than the manifest says
        f.write(b"\0")
    with pytest.raises(sc.CorruptSnapshotError, match="bytes, the manifest says") as info:
        rows[starts[1]]
    assert snap.shards[0].path in str(info.value)
