"""Warm random reads of remote shards (snapcache.store.random_access), requests counted in the
access log of this module's own moto server, for the running test's bucket only: a shard's
record batches are read alone (ranged GETs) until they have cost what the whole shard costs,
then it is fetched whole once (one GET), verified, held, and its rows make no request; held
shards stay within their bound, and one dropped starts counting again; a flipped byte in the
fetched shard is refused naming it, in a node-local cache copy is dropped and fetched again;
rows equal a sequential read."""

from __future__ import annotations

import os

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.options import ReadOptions
from snapcache.store import random_access
from snapcache.store.cache import SUFFIX as cache_suffix
from tests.store.test_s3_requests import PARTIAL, bucket_url, logged, not_leases  # noqa: F401

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))


def example(i):
    return {"x": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8), "i": i}


def build(url, n=300):
    ds = sc.Dataset.range(n).map(example).snapshot(url, progress=False, shard_size=256 << 10,
                                                   record_batch_size=32 << 10)
    assert sum(1 for _ in ds) == n


def same(i, got):
    assert got["i"] == i and np.array_equal(got["x"], example(i)["x"])


def batch_starts(snap, index):
    """The first row of each record batch of shard ``index``."""
    first = sum(s.rows for s in snap.shards[:index])
    return [int(s) for s in np.cumsum([0, *snap.shards[index].batch_rows[:-1]]) + first]


def shard_requests(logged, since):
    return [(m, p.split("?")[0].rsplit("/", 1)[-1], st)
            for m, p, st in not_leases(logged.requests(since, status=True))]


def test_a_shard_is_fetched_whole_once_its_ranged_reads_cost_as_much_then_rows_are_free(
        logged, bucket_url, monkeypatch):
    build(bucket_url)
    snap = sc.open_snapshot(bucket_url)
    shard = snap.shards[1]
    monkeypatch.setattr(random_access, "REQUEST_BYTES", shard.bytes // 3)
    starts = batch_starts(snap, 1)
    spent, ranged = 0, 0  # what RemoteRows counts: each ranged read, its bytes and a request
    while spent < shard.bytes:
        spent += shard.bytes // 3 + shard.batch_offsets[ranged + 1] - shard.batch_offsets[ranged]
        ranged += 1
    assert 2 <= ranged < len(starts) - 1
    since = logged.mark()
    for row in starts[:ranged]:
        same(row, snap[row])
    assert snap._rows._shards_held.get(1) is None
    same(starts[ranged], snap[starts[ranged]])  # now fetched whole, verified, held
    first = sum(s.rows for s in snap.shards[:1])
    for row in range(first, first + shard.rows):  # every row of it, any record batch
        same(row, snap[row])
    assert shard_requests(logged, since) == \
        [("GET", shard.path, PARTIAL)] * ranged + [("GET", shard.path, "200")]


def test_a_warm_pass_in_any_order_makes_no_request_and_equals_the_sequential_read(
        logged, bucket_url):
    build(bucket_url)
    snap = sc.open_snapshot(bucket_url)
    everything = list(snap.reader())
    order = np.random.default_rng(5).permutation(len(snap)).tolist()
    for i in order:  # the first pass: ranged reads, then each shard whole once
        same(i, snap[i])
        assert everything[i]["i"] == i
    assert len(snap._rows._shards_held) == len(snap.shards)
    since = logged.mark()
    for i in np.random.default_rng(6).permutation(len(snap)).tolist():
        same(i, snap[i])
    assert shard_requests(logged, since) == []


def test_held_remote_shards_stay_within_half_the_read_budget_and_a_dropped_one_rents_again(
        logged, bucket_url, monkeypatch):
    build(bucket_url)
    plain = sc.open_snapshot(bucket_url)
    largest = max(s.bytes for s in plain.shards)
    monkeypatch.setattr(random_access, "REQUEST_BYTES", largest)  # whole at the second batch
    budget = 2 * largest + 2  # half of it: one shard, never two
    snap = sc.open_snapshot(bucket_url, read=ReadOptions(prefetch_bytes=budget))
    held = snap._rows._shards_held
    assert held.budget == budget // 2
    zero, one = batch_starts(snap, 0), batch_starts(snap, 1)
    for row in (zero[0], zero[1], one[0], one[1]):
        same(row, snap[row])
        assert held.held_bytes <= budget // 2 and len(held) <= 1
    assert held.get(1) is not None and held.get(0) is None  # shard 0 dropped for shard 1
    since = logged.mark()
    same(zero[2], snap[zero[2]])  # shard 0 counts from nothing again: a ranged read
    assert shard_requests(logged, since) == [("GET", snap.shards[0].path, PARTIAL)]


def test_a_flipped_byte_in_the_fetched_shard_is_refused_naming_it(logged, bucket_url,
                                                                   monkeypatch):
    build(bucket_url)
    snap = sc.open_snapshot(bucket_url)
    shard = snap.shards[1]
    monkeypatch.setattr(random_access, "REQUEST_BYTES", shard.bytes)
    starts = batch_starts(snap, 1)
    same(starts[0], snap[starts[0]])  # a ranged read of record batch 0: intact
    fs = logged.server.filesystem()
    key = f"{snap.url.removeprefix('s3://')}/{shard.path}"
    data = bytearray(fs.cat(key))
    data[shard.batch_offsets[3] + 100] ^= 0x10
    fs.pipe(key, bytes(data))
    with pytest.raises(sc.CorruptSnapshotError, match="is corrupt: checksum") as info:
        snap[starts[1]]  # the shard fetched whole: its checksum does not match
    assert shard.path in str(info.value) and "snapcache purge --root" in str(info.value)
    assert snap._rows._shards_held.get(1) is None


def test_a_flipped_byte_in_the_node_local_copy_is_dropped_and_the_shard_fetched_again(
        logged, bucket_url, tmp_path, monkeypatch):
    build(bucket_url)
    cache = str(tmp_path / "cache")
    filled = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=cache))
    assert sum(1 for _ in filled.reader()) == 300  # every shard copied into the cache
    shard = filled.shards[1]
    monkeypatch.setattr(random_access, "REQUEST_BYTES", shard.bytes)
    [copy] = [os.path.join(d, f) for d, _, files in os.walk(cache) for f in files
              if f.endswith(shard.path + cache_suffix)]
    with open(copy, "r+b") as f:
        f.seek(shard.batch_offsets[3] + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    snap = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=cache))
    starts = batch_starts(snap, 1)
    since = logged.mark()
    same(starts[0], snap[starts[0]])  # record batch 0 from the local copy: intact
    same(starts[1], snap[starts[1]])  # held: the copy fails its checksum, fetched again
    same(starts[3] + 1, snap[starts[3] + 1])  # the damaged record batch, from the good bytes
    assert snap._rows._shards_held.get(1) is not None
    assert shard_requests(logged, since) == [("GET", shard.path, "200")]
