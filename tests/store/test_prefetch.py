"""``SnapshotReader.prefetch``: whole shards of a remote snapshot copied into the node-local
cache, in the order given, for processes about to read them (a DataLoader's workers)."""

from __future__ import annotations

import os
import threading
import time

import fsspec
import numpy as np
import pytest

import snapcache as sc
from snapcache.store.cache import ShardCache
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader


def example(i):
    return {"x": np.full(2000, i % 251, dtype=np.uint8), "i": i}


@pytest.fixture
def remote(request):
    """A committed snapshot of 6 shards on ``memory://`` (not local: read through the cache)."""
    url = f"memory://snapcache-prefetch-{os.getpid()}-{request.node.name}"
    ds = sc.Dataset.range(60).map(example).snapshot(url, shard_size=20_000, progress=False,
                                                    compression="none")
    assert sum(1 for _ in ds) == 60
    storage = Storage(url).child(ds.open_snapshot().id)
    yield storage
    fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


class Fetches:
    """Records the shard reads of a storage (its ``read_bytes``), optionally held back."""

    def __init__(self, storage, monkeypatch, *, hold=None, fail=()):
        self.paths: list[str] = []
        self.hold, self.fail = hold, fail
        real = storage.read_bytes

        def read_bytes(rel, *args, **kwargs):
            if rel.endswith(".arrow"):
                self.paths.append(rel)
                if self.hold is not None:
                    assert self.hold.wait(60)
                if rel in self.fail:
                    raise OSError(f"{rel}: the store is unreachable")
            return real(rel, *args, **kwargs)

        monkeypatch.setattr(storage, "read_bytes", read_bytes)


def open_reader(storage, cache):
    return SnapshotReader.open(storage, cache=cache)


def test_shards_are_copied_in_the_order_given_and_only_once(remote, tmp_path, monkeypatch):
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    reader = open_reader(remote, cache)
    shards = reader.manifest.shards
    assert len(shards) >= 6
    fetches = Fetches(reader.storage, monkeypatch)
    order = [shards[i] for i in (3, 0, 5, 1, 4, 2)]
    cache.get(f"{reader.manifest.fingerprint}/{shards[4].path}", shards[4].bytes,
              lambda: remote.read_bytes(shards[4].path))  # already in the cache
    fetches.paths.clear()
    assert reader.prefetch(order)
    assert reader.wait_for_cache(60)
    assert fetches.paths == [s.path for s in order if s is not shards[4]]
    assert reader.prefetch(order)  # all there now: nothing fetched
    assert reader.wait_for_cache(60) and len(fetches.paths) == 5
    # every copy is whole and read back as the snapshot
    again = open_reader(remote, cache)
    fetches.paths.clear()
    assert sorted(int(e["i"]) for e in again.examples()) == list(range(60))
    assert fetches.paths == []


def test_at_most_half_the_cache_is_filled(remote, tmp_path, monkeypatch):
    probe = open_reader(remote, None)
    shards = probe.manifest.shards
    limit = 2 * (shards[0].bytes + shards[1].bytes) + 10
    cache = ShardCache(tmp_path / "cache", limit)
    reader = open_reader(remote, cache)
    fetches = Fetches(reader.storage, monkeypatch)
    assert not reader.prefetch(shards)  # not all of them: the rest is the readers' to fetch
    assert reader.wait_for_cache(60)
    assert fetches.paths == [shards[0].path, shards[1].path]


def test_it_returns_once_the_first_copies_hold_their_shards(remote, tmp_path, monkeypatch):
    """A reader that asks for a shard being copied waits for the copy instead of fetching it
    again: the first copies have taken their locks when ``prefetch`` returns (their fetches
    may not have begun yet)."""
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    reader = open_reader(remote, cache)
    shards = reader.manifest.shards
    want = {i: remote.read_bytes(shards[i].path) for i in (0, 1)}
    release = threading.Event()
    fetches = Fetches(reader.storage, monkeypatch, hold=release)
    real_get = cache.get

    def slow_to_start(*args, **kwargs):  # the copies are slow to take their locks
        if threading.current_thread().name.startswith("snapcache-cache-fill"):
            time.sleep(0.3)
        return real_get(*args, **kwargs)

    monkeypatch.setattr(cache, "get", slow_to_start)
    assert reader.prefetch(shards, started=2)
    monkeypatch.setattr(cache, "get", real_get)
    got: dict[int, bytes] = {}

    def read(i):
        key = f"{reader.manifest.fingerprint}/{shards[i].path}"
        got[i] = cache.get(key, shards[i].bytes, lambda: b"fetched again").to_pybytes()

    readers = [threading.Thread(target=read, args=(i,)) for i in (0, 1)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(0.2)
    assert all(t.is_alive() for t in readers)  # both waiting for the copies under way
    release.set()
    for t in readers:
        t.join(60)
    assert got == want  # the copies' bytes, not fetched again
    assert reader.wait_for_cache(60)
    assert sorted(fetches.paths) == sorted(s.path for s in shards)  # each shard fetched once


def test_a_copy_that_fails_is_left_to_the_readers(remote, tmp_path, monkeypatch, caplog):
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    reader = open_reader(remote, cache)
    shards = reader.manifest.shards
    Fetches(reader.storage, monkeypatch, fail={shards[2].path})
    assert reader.prefetch(shards)
    assert reader.wait_for_cache(60)
    assert "could not copy" in caplog.text and shards[2].path in caplog.text
    key = f"{reader.manifest.fingerprint}/{shards[2].path}"
    assert cache.peek(key, shards[2].bytes) is None
    monkeypatch.undo()
    fresh = open_reader(remote, cache)
    assert sorted(int(e["i"]) for e in fresh.examples()) == list(range(60))


def test_without_a_local_cache_nothing_is_copied(remote, monkeypatch):
    reader = open_reader(remote, None)
    fetches = Fetches(reader.storage, monkeypatch)
    assert not reader.prefetch(reader.manifest.shards)
    assert fetches.paths == []


def test_at_most_a_few_copies_at_once_and_more_readers_are_told(remote, tmp_path, monkeypatch):
    """Each copy is held in memory whole: at most PREFETCH_THREADS at once. With more readers
    than that, some may find their first shard not under way yet: ``prefetch`` says so
    (False), unless nothing is left to copy."""
    from snapcache.store import reader as reader_module

    monkeypatch.setattr(reader_module, "PREFETCH_THREADS", 2)
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    reader = open_reader(remote, cache)
    shards = reader.manifest.shards
    release = threading.Event()
    fetches = Fetches(reader.storage, monkeypatch, hold=release)
    assert not reader.prefetch(shards, started=3)
    # prefetch returns once the first copies hold their shards' locks; each then reads its
    # shard (found in a CI run under load: the second had not reached its read yet)
    deadline = time.monotonic() + 60
    while len(fetches.paths) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(fetches.paths) == sorted([shards[0].path, shards[1].path])  # two at once
    release.set()
    assert reader.wait_for_cache(60) and len(fetches.paths) == len(shards)
    assert reader.prefetch(shards, started=3)  # everything there: nobody fetches
    fresh = open_reader(remote, ShardCache(tmp_path / "other", 1 << 30))
    assert fresh.prefetch(shards[:2], started=3)  # as many to copy as at once: all under way
    assert fresh.wait_for_cache(60)
