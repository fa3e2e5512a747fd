"""Ordered reads and random access of a committed snapshot give exactly the rows the order
names, as columns or examples, from every record batch layout; a manifest whose record
batches disagree with the shard is refused."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import snapcache as sc
from snapcache.store.fs import Storage
from snapcache.store.order import EpochOrder, Layout, Share
from snapcache.store import order as order_module
from snapcache.store import ordered_read, row_access
from snapcache.store.gather import blocks_of
from snapcache.store.ordered_read import layout_of, ordered_pieces
from snapcache.store.row_access import RowAccess
from snapcache.store.reader import SnapshotReader
from tests.equality import assert_same_example


def example(i):
    return {"x": np.full((3,), i, np.int32), "i": i, "s": f"s{i}"}


def ragged(i):
    return {"x": np.arange(i % 5, dtype=np.int16), "i": i}


def row_bytes(reader):
    return [(s.raw_bytes or s.bytes) / max(1, s.rows) for s in reader.manifest.shards]


def build(root, make, n=500, compression="zstd", **kw):
    ds = sc.Dataset.range(n).map(make).snapshot(root, compression=compression,
                                                  shard_size=kw.get("shard_size", 6000),
                                                  progress=False, **{
                                                      k: v for k, v in kw.items()
                                                      if k == "record_batch_size"})
    list(ds)
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    return SnapshotReader.open(Storage(root).child(fp)), ds


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("seed,window", [(None, 1), (0, 1), (3, 64), (5, 1000)])
def test_ordered_pieces_give_the_rows_of_the_order(root, compression, seed, window):
    reader, _ = build(root, example, compression=compression)
    layout = layout_of(reader.manifest)
    assert len(layout.rows) > 3 and (layout.batch >= 0).all()
    order = EpochOrder(layout, seed, 2, window)
    for streams in (1, 3):
        seen = []
        for k in range(streams):
            share = Share.of([(0, len(order))], streams, k, window=window)
            for mode in ("columns", "rows"):
                got = []
                for a, b, rows in ordered_pieces(reader, order, share.pieces(), mode=mode,
                                                 piece=37, threads=2, budget=1 << 20):
                    ids = rows["i"].tolist() if mode == "columns" else [r["i"] for r in rows]
                    assert len(ids) == b - a
                    assert ids == order.rows(a, b).tolist()
                    if mode == "rows":
                        assert_same_example(example(ids[0]), rows[0])
                    got.extend(ids)
            seen.extend(got)
        assert sorted(seen) == list(range(500))


def test_blocks_of_a_piece_are_its_distinct_blocks_ascending():
    rng = np.random.default_rng(0)
    for blocks in ([], [3], [5] * 7, [4, 4, 2, 9, 2], rng.integers(0, 50, 300),
                   rng.permutation(20)):
        blocks = np.asarray(blocks, dtype=np.int64)
        assert blocks_of(blocks) == np.unique(blocks).tolist()


@pytest.mark.parametrize("seed,window", [(None, 1), (4, 300)])
def test_the_first_piece_is_decoded_before_any_other_block_is_asked_for(root, monkeypatch,
                                                                        seed, window):
    """The first piece's blocks decode alone (the next ones would compete with them for the
    CPU and delay the first batch); once the consumer comes back, the reading runs ahead."""
    monkeypatch.setattr(order_module, "RUN_BYTES", 0)  # each record batch its own block
    reader, _ = build(root, example, n=2000, compression="zstd", shard_size=8000)
    order = EpochOrder(layout_of(reader.manifest), seed, 0, window)
    asked = []
    real = ordered_read.BlockDecoder.decode
    monkeypatch.setattr(ordered_read.BlockDecoder, "decode",
                        lambda self, block: (asked.append(block), real(self, block))[1])
    pieces = ordered_pieces(reader, order, [(0, len(order))], mode="columns", piece=100,
                            threads=2, budget=1 << 30)
    a, b, first = next(pieces)
    assert first["i"].tolist() == order.rows(a, b).tolist()
    located = order.run(a, b)
    needed = {located[0]} if located is not None else set(blocks_of(order.locate(a, b)[0]))
    assert sorted(asked) == sorted(needed)       # nothing else before the first piece
    rest = list(pieces)
    assert len(set(asked)) > len(needed) + 2 and rest[-1][1] == len(order)


@pytest.mark.parametrize("seed", [None, 4])
@pytest.mark.parametrize("piece,budget", [(20, 1 << 30), (5000, 1 << 30), (20, 1)])
def test_each_block_is_decoded_once_an_epoch(root, monkeypatch, seed, piece, budget):
    """Without a shuffle window every block is decoded once an epoch, the first one too: the
    first piece is planned alone, and the pieces after it that lie in the same block are
    planned with it (they cost no decoding) instead of decoding that block again once the
    first piece is consumed. Also through a pipeline's batches, whose pieces (4,096
    positions) end inside a record batch."""
    monkeypatch.setattr(order_module, "RUN_BYTES", 0)  # each record batch its own block
    reader, ds = build(root, example, n=2000, compression="lz4", shard_size=8000)
    layout = layout_of(reader.manifest)
    assert (layout.rows[:-1] > 20).all() and len(layout.rows) > 3
    order = EpochOrder(layout, seed, 0, 1)
    asked = []
    real = ordered_read.BlockDecoder.decode
    monkeypatch.setattr(ordered_read.BlockDecoder, "decode",
                        lambda self, block: (asked.append(block), real(self, block))[1])
    got = []
    n = len(order)
    ranges = [(a, min(n, a + piece)) for a in range(0, n, piece)]  # as a Share's pieces
    for a, b, rows in ordered_pieces(reader, order, ranges, mode="columns", threads=2,
                                     budget=budget):  # budget 1: one block at a time
        got.extend(rows["i"].tolist())
    assert got == order.rows(0, n).tolist()
    assert sorted(asked) == list(range(len(layout.rows)))
    if seed is None and piece == 20 and budget > 1:
        big = build(os.path.join(root, "big"), example, n=20_000, compression="lz4",
                    shard_size=2_000_000)[0]
        assert max(layout_of(big.manifest).rows) > 4096
        asked.clear()
        pipeline = sc.Dataset.range(20_000).map(example).snapshot(
            os.path.join(root, "big"), compression="lz4", shard_size=2_000_000, progress=False)
        assert sum(len(b["i"]) for b in pipeline.batch(256)) == 20_000
        assert sorted(asked) == list(range(len(layout_of(big.manifest).rows)))


def test_runs_of_merges_consecutive_small_record_batches_of_a_shard(root, monkeypatch):
    """Unshuffled reads decode runs of small record batches as one block: the runs keep every
    row at its position, never cross a shard, stay within RUN_BYTES (decoded, estimated from
    the manifest) unless one record batch alone is larger, and the layout itself comes back
    when nothing merges."""
    reader, _ = build(root, example, n=2000, compression="none", shard_size=8000)
    layout = layout_of(reader.manifest)
    shards = reader.manifest.shards
    per_row = max((s.raw_bytes or s.bytes) / s.rows for s in shards)
    monkeypatch.setattr(order_module, "RUN_BYTES", int(per_row * 700))
    runs = order_module.runs_of(layout, row_bytes(reader))
    assert 0 < runs.num_blocks < layout.num_blocks
    assert runs.num_rows == layout.num_rows
    assert set(runs.start.tolist()) <= set(layout.start.tolist())  # cut only where blocks were
    for b in range(runs.num_blocks):
        inside = (layout.start >= runs.start[b]) & (layout.start < runs.start[b] + runs.rows[b])
        assert set(layout.shard[inside].tolist()) == {runs.shard[b]}      # one shard
        assert layout.batch[inside].tolist() == list(range(runs.batch[b], runs.batch[b] +
                                                           inside.sum()))  # consecutive
        assert runs.rows[b] * per_row <= 700 * per_row or inside.sum() == 1
    assert order_module.runs_of(layout, row_bytes(reader)) is runs  # computed once
    monkeypatch.setattr(order_module, "RUN_BYTES", 0)
    fresh = layout_of(reader.manifest)
    assert order_module.runs_of(fresh, row_bytes(reader)) is fresh


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_unshuffled_reads_decode_runs_and_still_check_every_record_batch(root, monkeypatch,
                                                                         compression):
    """An unshuffled read of small record batches decodes one block a run (fewer decodes than
    record batches), gives the rows in order, and still checks each record batch against its
    own checksum: a flipped byte in one of them raises naming it, after every row before it
    (those before it in its run too)."""
    monkeypatch.setattr(order_module, "RUN_BYTES", 8192)  # several runs a shard
    reader, _ = build(root, example, n=3000, compression=compression, shard_size=60_000,
                      record_batch_size=2048)
    layout = layout_of(reader.manifest)
    runs = order_module.runs_of(layout, row_bytes(reader))
    assert len(reader.manifest.shards) < runs.num_blocks < layout.num_blocks // 2
    asked = []
    real = ordered_read.BlockDecoder.decode
    monkeypatch.setattr(ordered_read.BlockDecoder, "decode",
                        lambda self, block: (asked.append(block), real(self, block))[1])
    order = EpochOrder(layout, None, 0, 1)
    for mode in ("columns", "rows"):
        asked.clear()
        got = []
        for a, b, rows in ordered_pieces(reader, order, [(0, len(order))], mode=mode,
                                         piece=64, threads=2, budget=1 << 30):
            got.extend(rows["i"].tolist() if mode == "columns" else [r["i"] for r in rows])
        assert got == list(range(3000))
        assert sorted(asked) == list(range(runs.num_blocks))
    shard = reader.manifest.shards[0]
    # a record batch inside a run (the shard's first record batch is a block of its own)
    second_run = runs.start[1]
    target = next(j for j in range(1, len(shard.batch_rows))
                  if sum(shard.batch_rows[:j]) > second_run)
    assert target >= 2
    path = os.path.join(reader.storage.full(""), shard.path)
    with open(path, "r+b") as f:
        f.seek(shard.batch_offsets[target] + (shard.batch_offsets[target + 1] -
                                              shard.batch_offsets[target]) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    fresh = SnapshotReader.open(reader.storage)
    first_row = sum(shard.batch_rows[:target])
    run_start = max(s for s in runs.start.tolist() if s <= first_row)
    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match=f"record batch {target}\\b"):
        for a, b, rows in ordered_pieces(fresh, EpochOrder(layout_of(fresh.manifest), None, 0,
                                                           1),
                                         [(0, 3000)], mode="columns", piece=64, threads=2,
                                         budget=1 << 30):
            seen.extend(rows["i"].tolist())
    assert 0 < run_start < first_row  # the damaged record batch is inside a run
    assert seen == list(range(first_row))  # every row before it, those of its run too


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_each_shard_is_opened_once_and_a_damaged_one_raises_after_the_rows_before_it(
        root, monkeypatch, compression):
    """The next shard is opened ahead while the consumer is on the one before: each shard is
    still opened once an epoch, and a damaged one fails where its damaged record batch comes
    (shards are read record batch by record batch), after every batch before it, not when it
    was opened ahead."""
    reader, ds = build(root, example, n=2000, compression=compression, shard_size=8000)
    shards = reader.manifest.shards
    assert len(shards) >= 3 and {s.compression for s in shards} == {compression}
    opened = []
    real = ordered_read.open_sequential

    def counting(reader, shard, **kw):
        opened.append(shard.path)
        return real(reader, shard, **kw)

    monkeypatch.setattr(ordered_read, "open_sequential", counting)
    batches = ds.batch(64)
    assert sum(len(b["i"]) for b in batches) == 2000
    assert sorted(opened) == sorted(s.path for s in shards)  # each once
    path = os.path.join(reader.storage.url, shards[2].path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))
    offsets = shards[2].batch_offsets
    (k,) = [j for j in range(len(offsets) - 1) if offsets[j] <= len(data) // 2 < offsets[j + 1]]
    before = shards[0].rows + shards[1].rows + sum(shards[2].batch_rows[:k])
    damaged = f"{shards[2].path}' record batch {k} is corrupt: checksum"
    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match=damaged):
        for batch in batches:
            seen.extend(batch["i"].tolist())
    assert seen == list(range(before // 64 * 64))


def test_shards_larger_than_the_budget_are_read_in_low_memory_mode(root, monkeypatch):
    """A shard larger than the open-shard half of the budget is opened in low-memory mode (its
    pages dropped as they are decoded: tests/store/test_sequential_read.py measures it; and
    after each block for shards read whole); rows are the same."""
    reader, _ = build(root, example, n=500, compression="none")
    order = EpochOrder(layout_of(reader.manifest), None, 0)
    modes, released = [], []
    real_open, real_release = ordered_read.open_sequential, SnapshotReader.release_pages

    def open_sequential(reader, shard, **kw):
        modes.append(kw.get("low_memory", False))
        return real_open(reader, shard, **kw)

    def release_pages(self, shard):
        released.append(shard.path)
        return real_release(self, shard)

    monkeypatch.setattr(ordered_read, "open_sequential", open_sequential)
    monkeypatch.setattr(SnapshotReader, "release_pages", release_pages)
    sizes = [s.bytes for s in reader.manifest.shards]
    for budget, low in ((4 * max(sizes), False), (min(sizes), True)):
        modes.clear(), released.clear()
        ids = [i for _, _, rows in ordered_pieces(reader, order, [(0, 500)], mode="columns",
                                                  threads=2, budget=budget)
               for i in rows["i"].tolist()]
        assert ids == list(range(500))
        assert set(modes) == {low} and bool(released) == low


def test_ragged_snapshots_read_as_examples(root):
    reader, _ = build(root, ragged)
    order = EpochOrder(layout_of(reader.manifest), 1, 0, 50)
    out = [r for _, _, rows in ordered_pieces(reader, order, [(0, 500)], mode="rows")
           for r in rows]
    assert [r["i"] for r in out] == order.rows(0, 500).tolist()
    for r in out[:20]:
        assert_same_example(ragged(r["i"]), r)


def test_older_manifests_without_record_batches_still_read(root):
    reader, _ = build(root, example)
    doc = json.loads(reader.storage.read_bytes("manifest.json"))
    for s in doc["shards"]:
        del s["batch_rows"]
    reader.storage.write_atomic("manifest.json", json.dumps(doc).encode())
    old = SnapshotReader.open(reader.storage)
    layout = layout_of(old.manifest)
    assert (layout.batch == -1).all()
    order = EpochOrder(layout, 4, 1, 30)
    ids = [i for _, _, rows in ordered_pieces(old, order, [(0, 500)], mode="columns")
           for i in rows["i"].tolist()]
    assert ids == order.rows(0, 500).tolist()
    access = RowAccess(old)
    assert [access[i]["i"] for i in range(500)] == list(range(500))


def test_random_access(root):
    reader, _ = build(root, example)
    access = RowAccess(reader, budget=1)   # keeps one decoded record batch
    assert len(access) == 500
    for i in [0, 1, 499, 137, -1, 250]:
        assert_same_example(example(i % 500), access[i])
    assert [e["i"] for e in access.take([5, 400, 5, 3])] == [5, 400, 5, 3]
    with pytest.raises(IndexError, match="out of range"):
        access[500]
    with pytest.raises(TypeError):
        access["a"]


def zero_dim(i):
    return (np.array(i, np.float32), f"s{i}")


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("make", [example, ragged, zero_dim])
@pytest.mark.parametrize("budget", [1, None])
def test_random_access_decodes_each_record_batch_once_while_kept(root, compression, make,
                                                                budget, monkeypatch):
    # (rows of raw shards are read alone until a batch has been read WHOLE_AFTER times: here
    # a batch read for a second row is decoded whole)
    monkeypatch.setattr(row_access, "WHOLE_AFTER", 1)
    reader, _ = build(root, make, compression=compression)
    batches = len(layout_of(reader.manifest).rows)
    assert batches > 3
    access = RowAccess(reader, budget=budget)
    decoded, decode = [], reader._decoder.row_reader
    monkeypatch.setattr(reader._decoder, "row_reader",
                        lambda batch: decoded.append(batch.num_rows) or decode(batch))
    order = np.random.default_rng(0).permutation(500).tolist()
    for i in order:
        assert_same_example(make(i), access[i])
    if budget is None:   # everything fits: each record batch decoded once
        assert len(decoded) == batches and sum(decoded) == 500
    else:                # one batch kept: decoded again whenever the next row is elsewhere
        assert len(decoded) > batches
    decoded.clear()
    taken = access.take(order)
    assert len(decoded) <= batches   # take: each record batch at most once, whatever budget
    for i, e in zip(order, taken):
        assert_same_example(make(i), e)


def test_a_record_batch_whose_rows_disagree_with_the_manifest_is_refused(root):
    reader, _ = build(root, example)
    doc = json.loads(reader.storage.read_bytes("manifest.json"))
    rows = doc["shards"][0]["batch_rows"]
    doc["shards"][0]["batch_rows"] = [rows[0] - 1, rows[1] + 1] + rows[2:]
    reader.storage.write_atomic("manifest.json", json.dumps(doc).encode())
    with pytest.raises(sc.CorruptSnapshotError, match="record batch 0 has"):
        RowAccess(SnapshotReader.open(reader.storage))[0]


def test_record_batches_that_disagree_with_the_manifest_are_refused(root):
    reader, _ = build(root, example)
    doc = json.loads(reader.storage.read_bytes("manifest.json"))
    rows = doc["shards"][0]["batch_rows"]
    assert len(rows) >= 2
    doc["shards"][0]["batch_rows"] = [rows[0] + rows[1]] + rows[2:]
    reader.storage.write_atomic("manifest.json", json.dumps(doc).encode())
    with pytest.raises(sc.CorruptSnapshotError, match="record batches"):
        RowAccess(SnapshotReader.open(reader.storage))[0]


def test_ordered_reads_and_random_access_on_s3(s3_root):
    ds = sc.Dataset.range(300).map(example).snapshot(s3_root, shard_size=4000, progress=False)
    list(ds)
    storage = Storage(s3_root)
    (fp,) = [d for d in storage.listdir() if len(d) == 32]
    reader = SnapshotReader.open(storage.child(fp))
    order = EpochOrder(layout_of(reader.manifest), 2, 1, 40)
    ids = [i for _, _, rows in ordered_pieces(reader, order, [(0, 300)], mode="columns")
           for i in rows["i"].tolist()]
    assert ids == order.rows(0, 300).tolist()
    access = RowAccess(reader)
    assert [e["i"] for e in access.take([299, 0, 150])] == [299, 0, 150]
    assert [e["i"] for e in ds.shuffle(40, seed=2).iterate(1)] == ids


def test_layout_id_changes_with_anything_that_moves_an_example():
    """``layout_id``: which example sits at each position of every epoch order, so equal for
    equal shard lists and different when rows, record batches, contents or the shards' order
    differ (an iterator state is refused on another)."""
    import dataclasses
    from types import SimpleNamespace

    from snapcache.store.manifest import ShardInfo
    from snapcache.store.ordered_read import layout_id

    def shard(rows, batches, k):
        return ShardInfo(path=f"s{k}.arrow", rows=rows, bytes=100, checksum=f"xxh3_64:{k:016x}",
                         batch_rows=batches)

    def of(*shards):
        return layout_id(SimpleNamespace(shards=shards))

    a, b = shard(10, (5, 5), 1), shard(6, (6,), 2)
    assert of(a, b) == of(dataclasses.replace(a, path="other.arrow"), b)  # names do not count
    assert len({of(a, b), of(b, a), of(dataclasses.replace(a, batch_rows=(4, 6)), b),
                of(dataclasses.replace(a, batch_rows=None), b),
                of(dataclasses.replace(a, checksum="xxh3_64:" + "f" * 16), b),
                of(shard(16, (5, 5, 6), 1)), of(a)}) == 7
