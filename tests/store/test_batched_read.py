"""Fast snapshot reads: batches cut from Arrow columns equal the generic path; shuffles are
permutations, reproducible, different per epoch; the prefetch is bounded in bytes."""

from __future__ import annotations

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import batched_read, layout, ordered_read
from snapcache.store.codec import Decoder
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader, load_manifest


def image(i):
    return {"image": np.full((4, 5, 3), i % 251, np.uint8), "label": np.int64(i), "w": i * 0.5,
            "name": f"n{i}", "flag": i % 3 == 0, "zero_d": np.array(i, np.int16)}


def token(i):
    return (np.arange(i, i + 16, dtype=np.int32), i)


def plain(i):
    return np.float32(i)


def assert_same_batch(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same_batch(a[k], b[k])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_batch(x, y)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("make", [image, token, plain])
@pytest.mark.parametrize("batch_size,drop", [(1, False), (7, False), (64, True), (1000, False)])
def test_batches_equal_the_generic_path(root, compression, make, batch_size, drop):
    n = 300
    snap = sc.Dataset.range(n).map(make).snapshot(root, compression=compression,
                                                  shard_size=4096, progress=False)
    list(snap)  # write
    fast = list(snap.batch(batch_size, drop))
    generic = list(sc.Dataset.range(n).map(make).batch(batch_size, drop))
    assert len(fast) == len(generic)
    for a, b in zip(fast, generic):
        assert_same_batch(a, b)


def test_the_fast_path_is_taken_and_hands_out_read_only_views(root, monkeypatch):
    calls = []
    original = batched_read.cut_batches
    monkeypatch.setattr(batched_read, "cut_batches",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    snap = sc.Dataset.range(100).map(token).snapshot(root, progress=False)
    list(snap.batch(10))  # the writing epoch: generic
    assert not calls
    batches = list(snap.batch(10))
    assert calls and len(batches) == 10
    assert not batches[0][0].flags.writeable


def test_ragged_snapshots_use_the_generic_path(root):
    snap = sc.Dataset.range(10).map(lambda i: np.zeros(i % 3, np.int8)).snapshot(
        root, progress=False)
    list(snap)
    with pytest.raises(sc.SnapcacheError, match="different shapes"):
        list(snap.batch(4))
    assert [len(b) for b in snap.batch(1)] == [1] * 10


def epochs_of(ds, count):
    out = []
    for e in range(count):
        labels = []
        for b in ds.iterate(e):
            labels.extend(np.asarray(b["label"]).reshape(-1).tolist())
        out.append(labels)
    return out


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("buffer_size", [1, 10, 100, 1000])
def test_shuffle_after_snapshot_is_a_permutation_each_epoch(root, compression, buffer_size):
    n = 500
    snap = sc.Dataset.range(n).map(image).snapshot(root, compression=compression,
                                                   shard_size=4096, progress=False)
    list(snap)
    ds = snap.shuffle(buffer_size, seed=7).batch(32)
    epochs = epochs_of(ds, 3)
    for labels in epochs:
        assert sorted(labels) == list(range(n))
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs == epochs_of(ds, 3), "same seed, same epochs: same orders"
    other = epochs_of(snap.shuffle(buffer_size, seed=8).batch(32), 1)
    assert other[0] != epochs[0]


def test_shuffle_without_batch_yields_examples_like_the_generic_path(root):
    n = 200
    snap = sc.Dataset.range(n).map(image).snapshot(root, shard_size=4096, progress=False)
    list(snap)
    out = list(snap.shuffle(50, seed=1))
    by_label = {int(e["label"]): e for e in out}
    assert sorted(by_label) == list(range(n))
    for i in (0, 17, 199):
        want = image(i)
        got = by_label[i]
        assert type(got["w"]) is float and type(got["flag"]) is bool and type(got["name"]) is str
        assert got["zero_d"].shape == () and got["zero_d"].dtype == np.int16
        assert_same_batch(got["image"], want["image"])
        assert (got["w"], got["name"], got["flag"]) == (want["w"], want["name"], want["flag"])
    assert [int(e["label"]) for e in out] != list(range(n))


def committed_reader(root):
    (name,) = [n for n in Storage(root).listdir() if layout.is_fingerprint(n)]
    folder = Storage(root).child(name)
    return SnapshotReader(folder, load_manifest(folder))


@pytest.mark.parametrize("make", [
    image, token, plain, lambda i: {"a": np.int64(i)}, lambda i: {"a": i, "b": f"s{i}"},
    lambda i: {"a": i, "b": np.float32(i), "c": np.arange(3) + i},
    lambda i: {"a": i, "b": i * 2, "c": np.arange(3) + i, "d": "x" * (i % 4)}])
def test_row_list_gives_the_examples_the_generic_reader_gives(root, make):
    """row_list (the one-by-one read's runs) builds dicts of up to three fields its own way:
    the same examples, keys in the same order, the same types, as the generic reader."""
    list(sc.Dataset.range(40).map(make).snapshot(root, shard_size=1024, progress=False))
    reader = committed_reader(root)
    decoder = Decoder(reader.schema)
    listed, generic = [], []
    for batch in reader.record_batches():
        listed += batched_read.row_list(batched_read.as_columns(batch, decoder), reader.schema)
        generic += list(decoder.rows(batch))
    assert len(listed) == len(generic) == 40
    for a, b in zip(listed, generic):
        assert type(a) is type(b)
        if isinstance(a, dict):
            assert list(a) == list(b)
            assert [type(v) for v in a.values()] == [type(v) for v in b.values()]
        assert_same_batch(a, b)


def test_window_shuffle_mixes_beyond_one_window():
    chunks = ({"x": np.arange(i, i + 10)} for i in range(0, 1000, 10))
    out = np.concatenate([c["x"] for c in batched_read.window_shuffle(
        chunks, 50, np.random.default_rng(0))])
    assert sorted(out.tolist()) == list(range(1000))
    # rows travel beyond their window: some of the first 100 come out after position 200
    assert out[200:].min() < 100


def test_cut_batches_across_chunk_boundaries():
    chunks = [{"x": np.arange(0, 5)}, {"x": np.arange(5, 6)}, {"x": np.arange(6, 20)}]
    out = [b["x"].tolist() for b in batched_read.cut_batches(iter(chunks), 4)]
    assert out == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15],
                   [16, 17, 18, 19]]
    out = [b["x"].tolist() for b in batched_read.cut_batches(iter(chunks), 6, True)]
    assert out == [list(range(6)), list(range(6, 12)), list(range(12, 18))]


def test_prefetch_is_bounded_in_bytes(root, monkeypatch):
    snap = sc.Dataset.range(2000).map(token).snapshot(root, shard_size=8192,
                                                      prefetch_bytes=16 << 10,
                                                      progress=False)
    list(snap)
    budgets = []
    original = ordered_read.read_budget

    def spy(threads, budget):
        budgets.append(budget)
        return original(threads, budget)
    monkeypatch.setattr(ordered_read, "read_budget", spy)
    assert sum(len(b[1]) for b in snap.batch(100)) == 2000
    assert budgets == [16 << 10]


def test_record_batches_hold_at_most_the_budget_ahead(root, monkeypatch):
    from snapcache.store.reader import SnapshotReader
    from snapcache.store.fs import Storage
    snap = sc.Dataset.range(3000).map(token).snapshot(root, shard_size=4096, progress=False)
    list(snap)
    storage = Storage(root).child(_only_child(root))
    reader = SnapshotReader.open(storage)
    opened = []
    original = batched_read.open_sequential
    monkeypatch.setattr(batched_read, "open_sequential", lambda reader, shard, **k:
                        opened.append(shard) or original(reader, shard, **k))
    budget = 3 * max(s.bytes for s in reader.manifest.shards)
    it = batched_read.record_batches(reader, reader.manifest.shards, threads=2, budget=budget)
    next(it)
    import time
    time.sleep(0.1)
    assert 1 <= len(opened) <= 3  # half the budget for open shards, at least one
    assert 1 + sum(1 for _ in it) == sum(1 for _ in reader.record_batches())


def _only_child(root):
    import os
    (name,) = [n for n in os.listdir(root) if not n.startswith(".")]
    return name


def test_fast_batched_path_holds_a_read_lease_and_records_use(tmp_path):
    import os

    import snapcache as sc

    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(64).map(lambda i: {"x": np.full(4, i)}).snapshot(root)
    list(ds)
    (folder,) = os.listdir(root)
    assert "last-used.json" not in os.listdir(os.path.join(root, folder))  # written, not read
    from snapcache.pipeline import snapshot_exec

    snapshot_exec._last_used.clear()
    it = iter(ds.batch(8))
    next(it)
    names = os.listdir(os.path.join(root, folder))
    assert any(n.startswith("reader-") for n in names) and "last-used.json" in names
    list(it)
    # held by the pipeline object across epochs (renewed in the background) until collected
    assert any(n.startswith("reader-") for n in os.listdir(os.path.join(root, folder)))
    import gc
    import time

    del ds, it
    gc.collect()
    deadline = time.monotonic() + 60
    while any(n.startswith("reader-") for n in os.listdir(os.path.join(root, folder))) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(n.startswith("reader-") for n in os.listdir(os.path.join(root, folder)))


@pytest.mark.parametrize("row_bytes, record_batch_size, n, want", [
    (1024, 4 << 20, 6000, (1024, 4096, 880)),      # the first cut at FIRST_RECORD_BATCH (1 MiB)
    (4096, 4 << 20, 3000, (1024, 1024, 952)),      # but at least PIECE_ROWS (1,024) rows
    (4096, 64 << 10, 3000, (16,) * 187 + (8,)),    # and at most the others' rows
])
def test_a_streams_first_record_batch_is_cut_small(root, row_bytes, record_batch_size, n,
                                                   want):
    """A read's first batch waits for its whole record batch to be read, checked and decoded:
    the writer cuts a stream's first record batch at FIRST_RECORD_BATCH, at least PIECE_ROWS
    rows (a read's first piece) and at most the rest's (``record_batch_size``); powers of two
    of rows all, so batches of up to 1,024 rows still line up with every record batch."""
    from snapcache.store.options import FIRST_RECORD_BATCH
    from snapcache.store.order import PIECE_ROWS

    assert (FIRST_RECORD_BATCH, PIECE_ROWS) == (1 << 20, 1024)
    ds = sc.Dataset.range(n).map(lambda i: np.full(row_bytes // 4, i, np.int32)).snapshot(
        root, record_batch_size=record_batch_size, compression="none", progress=False)
    assert [int(x[0]) for x in ds] == list(range(n))          # the writing epoch
    (shard,) = committed_reader(root).manifest.shards
    assert shard.batch_rows == want
    assert all(end % min(256, want[0]) == 0 for end in np.cumsum(want)[:-1])
    assert [int(b[0, 0]) for b in ds.batch(256)] == list(range(0, n, 256))
