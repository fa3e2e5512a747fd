"""Shuffled reads of small record batches decode each shuffle window whole, in parts
(:class:`snapcache.store.gather.Window`): the same rows as block by block, a window decoded only
where it pays, and a damaged record batch raising after the same rows as block by block."""

from __future__ import annotations

import os

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import ordered_read
from snapcache.store.fs import Storage
from snapcache.store.gather import Window
from snapcache.store.order import EpochOrder, Layout, Share
from snapcache.store.ordered_read import layout_of, ordered_pieces
from snapcache.store.reader import SnapshotReader

N = 3000


def example(i):
    return {"x": np.full((4,), i, np.int32), "i": i}


def build(root, compression="lz4", n=N):
    """A snapshot of ``n`` rows in record batches of 32 rows, over three shards."""
    list(sc.Dataset.range(n).map(example).snapshot(
        root, compression=compression, shard_size=40_000, record_batch_size=1_000,
        progress=False))
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    return SnapshotReader.open(Storage(root).child(fp)), Storage(root).child(fp)


@pytest.fixture
def spans_decoded(monkeypatch):
    """The parts of windows decoded (each a tuple of spans)."""
    calls = []
    real = ordered_read.BlockDecoder.decode_spans
    monkeypatch.setattr(ordered_read.BlockDecoder, "decode_spans",
                        lambda self, spans: (calls.append(spans), real(self, spans))[1])
    return calls


def read(reader, order, ranges, **kw):
    """The ids the ordered read gives, piece by piece, checked against the order."""
    got = []
    for a, b, rows in ordered_pieces(reader, order, ranges, mode="columns", **kw):
        assert rows["i"].tolist() == order.rows(a, b).tolist()
        assert (rows["x"] == rows["i"][:, None]).all()
        got.extend(rows["i"].tolist())
    return got


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("window", [400, 1000])
def test_a_window_of_small_record_batches_is_decoded_in_parts(root, spans_decoded,
                                                              compression, window):
    reader, _ = build(root, compression)
    layout = layout_of(reader.manifest)
    assert len(reader.manifest.shards) >= 2 and len(layout.rows) > 50
    order = EpochOrder(layout, 7, 1, window)
    for streams in (1, 3):
        seen = []
        for k in range(streams):
            share = Share.of([(0, N)], streams, k, window=window)
            seen.extend(read(reader, order, share.pieces(), piece=64, threads=2,
                             budget=64 << 20))
        assert sorted(seen) == list(range(N))
    assert spans_decoded
    # every part is whole blocks in their sequence, and a window's parts are at most 2
    for spans in spans_decoded:
        assert all(hi > lo >= 0 for _, lo, hi in spans)
    windows = -(-N // window)
    assert windows <= len(spans_decoded) <= 2 * windows * (1 + 3)


def test_a_resumed_read_decodes_a_window_whole_only_when_it_reads_most_of_it(root,
                                                                             spans_decoded):
    reader, _ = build(root)
    order = EpochOrder(layout_of(reader.manifest), 3, 0, 1000)
    # resumed at 1,700: window 1 (1,000-2,000) is 30% read, block by block; 2 and 3 whole
    assert read(reader, order, [(1700, N)], piece=100, threads=1, budget=64 << 20) == \
        order.rows(1700, N).tolist()
    assert [spans[0][0] for spans in spans_decoded] == [int(order.window_blocks(2000, N)[0][0])]
    spans_decoded.clear()
    # 40% of window 0 read (block by block), window 1 whole; ranges that adjoin join
    assert read(reader, order, [(600, 900), (900, 1300), (1300, 2000)], piece=100, threads=2,
                budget=64 << 20) == order.rows(600, 2000).tolist()
    assert {spans[0][0] for spans in spans_decoded} <= set(
        order.window_blocks(1000, 2000)[0].tolist())
    assert 1 <= len(spans_decoded) <= 2


def test_windows_larger_than_a_quarter_of_the_budget_read_block_by_block(root, spans_decoded):
    reader, _ = build(root)
    order = EpochOrder(layout_of(reader.manifest), 3, 0, N)
    window_bytes = sum(s.raw_bytes or s.bytes for s in reader.manifest.shards)
    assert read(reader, order, [(0, N)], piece=128, threads=2,
                budget=4 * window_bytes - 1024) == order.rows(0, N).tolist()
    assert not spans_decoded
    assert read(reader, order, [(0, N)], piece=128, threads=2,
                budget=8 * window_bytes) == order.rows(0, N).tolist()
    assert len(spans_decoded) == 2


def test_rows_mode_and_few_or_large_blocks_read_block_by_block(root, spans_decoded,
                                                               monkeypatch):
    reader, _ = build(root)
    order = EpochOrder(layout_of(reader.manifest), 3, 0, 500)
    got = [r["i"] for _, _, rows in ordered_pieces(reader, order, [(0, N)], mode="rows",
                                                   piece=64, threads=2) for r in rows]
    assert got == order.rows(0, N).tolist() and not spans_decoded
    monkeypatch.setattr(ordered_read, "ASSEMBLE_BLOCK_BYTES", 1)  # blocks "too large"
    assert read(reader, order, [(0, N)], piece=64, threads=2) == order.rows(0, N).tolist()
    assert not spans_decoded
    monkeypatch.setattr(ordered_read, "ASSEMBLE_BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(ordered_read, "ASSEMBLE_BLOCKS", 10_000)  # "too few" blocks
    assert read(reader, order, [(0, N)], piece=64, threads=2) == order.rows(0, N).tolist()
    assert not spans_decoded


def flip_a_byte_of(storage, shard, j):
    path = os.path.join(storage.root, shard.path)
    with open(path, "r+b") as f:
        at = (shard.batch_offsets[j] + shard.batch_offsets[j + 1]) // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def pieces_until_error(reader, order):
    got = []
    with pytest.raises(sc.CorruptSnapshotError) as info:
        for a, b, rows in ordered_pieces(reader, order, [(0, N)], mode="columns", piece=50,
                                         threads=2, budget=64 << 20):
            assert rows["i"].tolist() == order.rows(a, b).tolist()
            got.append((a, b))
    return got, str(info.value)


def test_a_damaged_record_batch_raises_after_the_rows_block_by_block_gives(
        root, spans_decoded, monkeypatch):
    """With a window of small record batches, the pieces before the first that needs the
    damaged record batch come out, then its error naming it, as without windows."""
    reader, storage = build(root, "none")
    order = EpochOrder(layout_of(reader.manifest), 5, 0, 1000)
    layout = order.layout
    damaged = int(order.locate(1500, 1501)[0][0])  # a record batch of the second window
    shard = reader.manifest.shards[int(layout.shard[damaged])]
    flip_a_byte_of(storage, shard, int(layout.batch[damaged]))

    with_windows = pieces_until_error(SnapshotReader.open(storage), order)
    assert spans_decoded
    monkeypatch.setattr(ordered_read, "ASSEMBLE_BLOCKS", 10_000)
    spans_decoded.clear()
    block_by_block = pieces_until_error(SnapshotReader.open(storage), order)
    assert not spans_decoded
    assert with_windows == block_by_block
    assert f"record batch {int(layout.batch[damaged])} is corrupt: checksum" in \
        with_windows[1] and shard.path in with_windows[1]
    # it raised at the first piece holding a row of the damaged record batch
    first = int(np.flatnonzero(order.locate(0, N)[0] == damaged)[0])
    done = with_windows[0][-1][1]
    assert 1000 <= first and done <= first < min(done + 50, order.window_of(done)[1])


def test_window_of_cuts_parts_of_whole_blocks_and_takes_rows_across_them():
    layout = Layout.from_shards([50, 30], [[10, 10, 10, 20], [5, 5, 20]])
    order = EpochOrder(layout, 1, 0, 33)
    row_ids = np.arange(80)
    for first in range(0, 80, 33):
        stop = min(80, first + 33)
        for parts in (1, 2, 3, 5):
            window = Window.of(order, first, stop, parts=parts)
            assert window.starts[0] == 0 and window.starts[-1] == stop - first
            assert len(window.spans) <= parts
            decoded = []
            for spans in window.spans:
                ids = np.concatenate([row_ids[layout.start[b] + lo:layout.start[b] + hi]
                                      for b, lo, hi in spans])
                decoded.append({"i": ids, "two": np.stack([ids, ids], axis=1)})
            for a, b in [(first, stop), (first + 3, min(stop, first + 9))]:
                got = window.take(decoded, window.rows(order, a, b))
                assert got["i"].tolist() == order.rows(a, b).tolist()
                assert (got["two"][:, 1] == got["i"]).all()
