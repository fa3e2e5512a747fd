"""The fingerprint of a pipeline object is taken once, at its first iteration, and kept for its
later epochs (a memo cache filling on call must not turn epoch 2 into a miss; an in-memory
source must not be hashed again every epoch). A new pipeline object is fingerprinted afresh."""

from __future__ import annotations

import numpy as np

import pytest

import snapcache as sc
from snapcache.fingerprint import sources as source_fp


class CallLog(list):
    """Bookkeeping of the test, not state of the function."""


sc.fingerprint.register(CallLog, lambda log: "call-log")


class Tokenizer:
    """Like a BPE tokenizer: a ``cache`` dict that fills as it is called."""

    def __init__(self):
        self.cache = {}
        self.calls = CallLog()

    def __call__(self, word):
        self.calls.append(word)
        if word not in self.cache:
            self.cache[word] = np.array([ord(c) for c in word], dtype=np.int32)
        return {"ids": self.cache[word]}


WORDS = ["alpha", "beta", "gamma", "delta", "beta", "alpha"]


def test_a_memo_cache_filling_on_call_does_not_miss_epoch_two(tmp_path):
    tok = Tokenizer()
    ds = sc.Dataset.from_iterable(WORDS).map(tok).snapshot(str(tmp_path), progress=False)
    first = [e["ids"].tolist() for e in ds]
    assert len(tok.calls) == len(WORDS)
    assert tok.cache  # the function's attributes changed while it ran
    second = [e["ids"].tolist() for e in ds]
    third = [e["ids"].tolist() for e in ds]
    assert first == second == third
    assert len(tok.calls) == len(WORDS), "a later epoch ran the map instead of the snapshot"
    folders = [p for p in tmp_path.iterdir() if p.is_dir() and (p / "manifest.json").exists()]
    assert len(folders) == 1
    # ds.fingerprint() and explain() report the same value the epochs used
    assert ds.explain().hit
    assert folders[0].name == ds.explain().fingerprint


def test_an_in_memory_source_is_hashed_once_across_epochs(tmp_path, monkeypatch):
    calls = []
    real = source_fp.hash_iterable_source
    monkeypatch.setattr(source_fp, "hash_iterable_source",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    items = [np.full(4, i, dtype=np.int64) for i in range(50)]
    ds = sc.Dataset.from_iterable(items).map(lambda x: x + 1).snapshot(str(tmp_path),
                                                                        progress=False)
    for _ in range(3):
        assert sum(1 for _ in ds) == 50
    ds.fingerprint()
    ds.explain()
    assert len(calls) == 1


@pytest.mark.parametrize("delta", [False, None])
def test_files_are_stated_once_across_epochs(tmp_path, monkeypatch, delta):
    # delta=False: an ordinary snapshot fingerprints every file once; delta=None (the
    # default, a delta snapshot): the files are listed and stated once, never hashed into a
    # per-file tree (the lineage counts the source by kind).
    from snapcache.pipeline.ops import sources as source_ops

    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text(str(i))
    calls, stats = [], []
    real, real_stat = source_fp.hash_files_source, source_ops.file_identities
    monkeypatch.setattr(source_fp, "hash_files_source",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    monkeypatch.setattr(source_ops, "file_identities",
                        lambda *a, **k: (stats.append(1), real_stat(*a, **k))[1])
    ds = sc.Dataset.from_files(str(tmp_path / "*.txt")).map(len).snapshot(
        str(tmp_path / "snaps"), progress=False, delta=delta)
    for _ in range(3):
        assert sum(1 for _ in ds) == 5
    assert len(calls) == (1 if delta is False else 0)
    if delta is None:
        assert len(stats) == 1


def test_a_new_pipeline_from_changed_data_gets_a_new_fingerprint(tmp_path):
    items = [1, 2, 3]
    ds = sc.Dataset.from_iterable(items).snapshot(str(tmp_path), progress=False)
    assert list(ds) == [1, 2, 3]
    before = ds.fingerprint()
    items.append(4)
    # The same pipeline object keeps what it was fingerprinted with ...
    assert ds.fingerprint() == before
    # ... a pipeline built again from the changed data is fingerprinted afresh.
    rebuilt = sc.Dataset.from_iterable(items).snapshot(str(tmp_path), progress=False)
    assert rebuilt.fingerprint() != before
    assert list(rebuilt) == [1, 2, 3, 4]


def test_pipelines_sharing_an_upstream_each_take_their_own(tmp_path):
    items = [1, 2, 3]
    base = sc.Dataset.from_iterable(items).map(lambda x: x * 10)
    a = base.snapshot(str(tmp_path), progress=False)
    assert list(a) == [10, 20, 30]
    items.append(4)
    b = base.snapshot(str(tmp_path), progress=False)
    assert b.fingerprint() != a.fingerprint()
    assert list(b) == [10, 20, 30, 40]


def test_dataloader_workers_started_each_epoch_reuse_the_parents_fingerprint(tmp_path,
                                                                              monkeypatch):
    """Non-persistent DataLoader workers are forked afresh every epoch: the fingerprint taken
    in the parent at to_torch() is inherited, not retaken by each worker each epoch."""
    torch = __import__("pytest").importorskip("torch")
    log = tmp_path / "hashed"
    real = source_fp.hash_iterable_source

    def counted(*args, **kwargs):
        with open(log, "a") as f:  # appended from whichever process hashes
            f.write("x")
        return real(*args, **kwargs)

    monkeypatch.setattr(source_fp, "hash_iterable_source", counted)
    tok = Tokenizer()
    ds = sc.Dataset.from_iterable(WORDS * 4).map(tok).snapshot(str(tmp_path / "snaps"),
                                                               progress=False)
    torch_ds = ds.to_torch()
    loader = torch.utils.data.DataLoader(torch_ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    for epoch in range(2):
        torch_ds.set_epoch(epoch)
        assert len(list(loader)) == len(WORDS) * 4
    assert log.read_text() == "x"
    folders = [p for p in (tmp_path / "snaps").iterdir() if (p / "manifest.json").exists()]
    assert len(folders) == 1


def test_threads_racing_to_the_first_fingerprint_all_get_the_stored_one():
    import threading

    ds = sc.Dataset.from_iterable([np.arange(1000) + i for i in range(200)]).map(
        lambda x: x * 2)
    barrier = threading.Barrier(4)
    got = []

    def first():
        barrier.wait()
        got.append(ds.fingerprint())

    threads = [threading.Thread(target=first) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0] == ds.fingerprint()
