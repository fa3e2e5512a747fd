"""Fault injection: a failing disk during writing leaves no snapshot and no partial files."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader, load_manifest
from snapcache.store.writer import SnapshotWriter
from snapcache.errors import StoreError
from snapcache.store.options import WriteOptions

FP = "0123456789abcdef0123456789abcdef"


class FullDisk:
    """A file on a disk with ``budget[0]`` bytes free: it fails like a full disk after that."""

    def __init__(self, raw, budget):
        self.raw, self.budget = raw, budget

    def write(self, data):
        self.budget[0] -= len(data)
        if self.budget[0] < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.raw.write(data)

    def __getattr__(self, name):
        return getattr(self.raw, name)


@pytest.mark.parametrize("budget", [0, 10_000, 300_000])
def test_full_disk_raises_and_leaves_nothing(tmp_path, monkeypatch, budget):
    storage = Storage(str(tmp_path)).child(FP)
    real_open = Storage.open_output
    free = [budget]
    monkeypatch.setattr(Storage, "open_output",
                        lambda self, rel, **kw: FullDisk(real_open(self, rel, **kw), free))
    writer = SnapshotWriter(storage, fingerprint=FP,
                            options=WriteOptions(shard_size=100_000, record_batch_size=20_000))
    with pytest.raises(StoreError, match="No space left.*Nothing was committed"):
        for i in range(2000):
            writer.write({"x": np.random.default_rng(i).random(100)})
        writer.commit()
    writer.abort()
    assert load_manifest(storage) is None
    left = os.listdir(tmp_path / FP)
    # no partial file: only finished shards and the progress record that lists them
    assert not [n for n in left if n.endswith(".tmp")]
    progress = [n for n in left if n.startswith("progress-")]
    shards = {n for n in left if n.endswith(".arrow")}
    if shards:
        record = json.loads((tmp_path / FP / progress[0]).read_text())
        assert {s["path"] for s in record["shards"]} == shards


def test_writer_context_manager_commits_or_aborts(tmp_path):
    storage = Storage(str(tmp_path)).child(FP)
    with pytest.raises(RuntimeError):
        with SnapshotWriter(storage, fingerprint=FP) as writer:
            writer.write({"x": 1})
            raise RuntimeError("user code failed")
    assert load_manifest(storage) is None
    with SnapshotWriter(storage, fingerprint=FP) as writer:
        writer.write({"x": 1})
    assert load_manifest(storage).num_examples == 1
    with pytest.raises(RuntimeError, match="already committed"):
        writer.write({"x": 2})


def test_an_interruption_inside_a_record_batch_write_keeps_only_whole_shards(
        tmp_path, monkeypatch):
    """Record batches are written on the caller's thread, so Ctrl-C can land in the middle
    of one. The shard in progress is then torn: it is deleted, not kept, even when the
    interruption asks to keep what was written; finished shards stay recorded, and a resumed
    run reads every example back."""
    from snapcache.store import indexed_file
    from snapcache.store.protocol import best_progress
    storage = Storage(str(tmp_path)).child(FP)
    options = WriteOptions(shard_size=100_000, record_batch_size=20_000)
    real_write = indexed_file.HashingSink.write
    calls = [0]

    def interrupted(self, data):
        calls[0] += 1
        written = real_write(self, data)
        if calls[0] == 60:  # after the bytes went out: Arrow sees the write fail
            raise KeyboardInterrupt
        return written

    monkeypatch.setattr(indexed_file.HashingSink, "write", interrupted)
    writer = SnapshotWriter(storage, fingerprint=FP, options=options)
    examples = [{"x": np.random.default_rng(i).random(100)} for i in range(2000)]
    with pytest.raises(KeyboardInterrupt):
        for example in examples:
            writer.write(example)
    writer.abort(keep=True)  # what an interrupted epoch asks for
    monkeypatch.setattr(indexed_file.HashingSink, "write", real_write)
    left = os.listdir(tmp_path / FP)
    assert not [n for n in left if n.endswith(".tmp")]
    kept = best_progress(storage, 0, 1)
    assert kept is not None and kept.shards, "the finished shards are kept"
    assert {s.path for s in kept.shards} == {n for n in left if n.endswith(".arrow")}
    resumed = SnapshotWriter(storage, fingerprint=FP, options=options, resume=kept)
    rows = sum(s.rows for s in kept.shards)
    for example in examples[rows:]:
        resumed.write(example)
    manifest = resumed.commit()
    assert manifest.num_examples == len(examples)
    back = [e["x"] for e in SnapshotReader(storage, manifest)]
    assert len(back) == len(examples)
    assert all(np.array_equal(a, b["x"]) for a, b in zip(back, examples))


@pytest.mark.parametrize("budget", [0, 300_000])
def test_a_full_disk_met_by_the_thread_writing_large_rows_out_raises_and_leaves_nothing(
        tmp_path, monkeypatch, budget):
    """Rows of 16 KB or more are written to their shard's file by a thread
    (store/background_write.py); its failure comes out of the writer like any other."""
    from snapcache.store import background_write
    real = os.writev
    free = [budget]

    def writev(fd, pieces):
        free[0] -= sum(memoryview(p).nbytes for p in pieces)
        if free[0] < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, pieces)

    monkeypatch.setattr(background_write.os, "writev", writev)
    storage = Storage(str(tmp_path)).child(FP)
    writer = SnapshotWriter(storage, fingerprint=FP,
                            options=WriteOptions(shard_size=200_000, record_batch_size=60_000))
    with pytest.raises(StoreError, match="No space left.*Nothing was committed"):
        for i in range(200):
            writer.write({"x": np.random.default_rng(i).random(2500)})  # 20 KB rows
        writer.commit()
    writer.abort()
    assert load_manifest(storage) is None
    left = os.listdir(tmp_path / FP)
    assert not [n for n in left if n.endswith(".tmp")]
    shards = {n for n in left if n.endswith(".arrow")}
    if budget:
        assert shards, "the shards finished before the disk was full are kept"
    if shards:
        progress = [n for n in left if n.startswith("progress-")]
        record = json.loads((tmp_path / FP / progress[0]).read_text())
        assert {s["path"] for s in record["shards"]} == shards
