"""The epoch order and streams' shares are pure: every epoch a permutation, fixed by (seed,
epoch) whatever the number of streams, different between epochs; shares disjoint, covering,
balanced; what remains after a lockstep stop is exactly what was not read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from snapcache.store.order import EpochOrder, Layout, Share, choose_chunk

shard_lists = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=6), min_size=1,
                       max_size=6)


def layout_of(shards, known=True):
    return Layout.from_shards([sum(s) for s in shards], [s if known else None for s in shards])


@settings(max_examples=60, deadline=None)
@given(shards=shard_lists, seed=st.integers(-5, 2**40), epoch=st.integers(0, 5),
       window=st.integers(1, 50), known=st.booleans())
def test_every_epoch_is_a_permutation(shards, seed, epoch, window, known):
    layout = layout_of(shards, known)
    order = EpochOrder(layout, seed, epoch, window)
    rows = order.rows(0, len(order))
    assert sorted(rows.tolist()) == list(range(layout.num_rows))
    # any split of the positions gives the same rows
    cut = len(order) // 3
    assert np.array_equal(np.concatenate([order.rows(0, cut), order.rows(cut, len(order))]), rows)
    # (block, offset) agree with rows
    blocks, offsets = order.locate(0, len(order))
    assert (offsets < layout.rows[blocks]).all() and (offsets >= 0).all()


@settings(max_examples=60, deadline=None)
@given(shards=shard_lists, seed=st.one_of(st.none(), st.integers(0, 99)),
       window=st.integers(1, 20), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_runs_and_blocks_in_agree_with_locate(shards, seed, window, cuts):
    """``run`` is ``locate`` for a range inside one block without a window; ``blocks_in``
    lists every block a range reads, in the order first read (a superset with a window)."""
    order = EpochOrder(layout_of(shards), seed, 1, window)
    bounds = sorted({0, len(order), *(c % (len(order) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:]):
        blocks, offsets = order.locate(a, b)
        run = order.run(a, b)
        single = order.window == 1 and (blocks == blocks[0]).all()
        assert (run is not None) == bool(single)
        if run is not None:
            assert blocks.tolist() == [run[0]] * (b - a)
            assert offsets.tolist() == list(range(run[1], run[1] + b - a))
        listed = order.blocks_in(a, b).tolist()
        assert len(set(listed)) == len(listed) and set(blocks.tolist()) <= set(listed)
        if order.window == 1:
            firsts = list(dict.fromkeys(blocks.tolist()))
            assert listed == firsts


def blocks_by_definition(shard_rows, batch_rows, block):
    """The blocks of a layout, one tuple ``(rows, shard, batch, offset)`` each, as the module
    docstring defines them."""
    out = []
    for i, total in enumerate(shard_rows):
        known = batch_rows[i]
        if known is not None and sum(known) == total:
            out += [(r, i, j, 0) for j, r in enumerate(known) if r > 0]
        else:
            out += [(min(block, total - o), i, -1, o) for o in range(0, total, block)]
    return out


@settings(max_examples=100, deadline=None)
@given(shards=st.lists(st.tuples(st.lists(st.integers(0, 9), max_size=4),
                                 st.sampled_from(["known", "unknown", "wrong sum"])),
                       max_size=6),
       block=st.integers(1, 7))
def test_layouts_are_their_blocks_by_definition(shards, block):
    """Record batches where the manifest lists them, else fallback blocks of FALLBACK_BLOCK
    rows (built without a Python object a block: their count follows from a claimed row count
    alone), in shard order: the same blocks, so the same orders, as ever."""
    from snapcache.store import order

    rows = [sum(b) + (kind == "wrong sum") for b, kind in shards]
    known = [b if kind != "unknown" else None for b, kind in shards]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(order, "FALLBACK_BLOCK", block)
        layout = Layout.from_shards(rows, known)
    want = blocks_by_definition(rows, known, block)
    got = list(zip(layout.rows.tolist(), layout.shard.tolist(), layout.batch.tolist(),
                   layout.offset.tolist()))
    assert got == want and layout.num_rows == sum(rows)
    assert layout.start.tolist() == np.cumsum([0] + [r for r, *_ in want])[:-1].tolist()
    assert all(a.dtype == np.int64 for a in (layout.start, layout.rows, layout.shard,
                                             layout.batch, layout.offset))


def test_unseeded_is_the_rows_in_order():
    layout = Layout.from_shards([5, 7], [[2, 3], None])
    assert EpochOrder(layout, None, 3, 10).rows(0, 12).tolist() == list(range(12))


@pytest.mark.parametrize("seed", [0, 1, 123])
def test_epochs_and_seeds_differ_and_repeat(seed):
    layout = Layout.from_shards([1000] * 5, [[128] * 7 + [104]] * 5)
    orders = [EpochOrder(layout, seed, e, 300).rows(0, 5000) for e in range(4)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(orders[i], orders[j])
    assert np.array_equal(orders[2], EpochOrder(layout, seed, 2, 300).rows(0, 5000))
    assert not np.array_equal(orders[0], EpochOrder(layout, seed + 1, 0, 300).rows(0, 5000))


def test_the_order_mixes_beyond_a_window():
    # 20 blocks of 100 rows, window 50: the first 1000 positions draw on about half the blocks
    layout = Layout.from_shards([2000], [[100] * 20])
    rows = EpochOrder(layout, 7, 0, 50).rows(0, 1000)
    assert len(set((rows // 100).tolist())) >= 8
    assert abs(np.corrcoef(np.arange(2000), EpochOrder(layout, 7, 0, 50).rows(0, 2000))[0, 1]) < 0.5


@settings(max_examples=80, deadline=None)
@given(length=st.integers(0, 400), cut=st.integers(0, 400), streams=st.integers(1, 9),
       window=st.integers(1, 64), unit=st.integers(1, 8),
       balance=st.sampled_from([None, "drop", "pad"]))
def test_shares_are_disjoint_cover_and_balance(length, cut, streams, window, unit, balance):
    cut = min(cut, length)
    ranges = [(cut, length), (0, cut)]  # a resumed epoch's ranges need not be sorted
    shares = [Share.of(ranges, streams, k, window=window, unit=unit, balance=balance)
              for k in range(streams)]
    got = [[p for a, b in s.pieces() for p in range(a, b)] for s in shares]
    counts = [len(g) for g in got]
    assert counts == [s.count() for s in shares]
    flat = [p for g in got for p in g]
    if balance is None:
        assert sorted(flat) == list(range(length))
        assert max(counts) - min(counts) <= 2 * unit
    elif balance == "drop":
        assert len(set(flat)) == len(flat) and set(flat) <= set(range(length))
        assert len(set(counts)) == 1 and counts[0] % unit == 0 or counts[0] == length
        assert length - len(flat) < streams * unit + unit * streams
    else:
        assert set(flat) == set(range(length)) and len(set(counts)) == 1
    # whole units per stream except one: one partial batch per epoch
    if balance is None:
        assert sum(c % unit != 0 for c in counts) <= 1


@settings(max_examples=80, deadline=None)
@given(length=st.integers(0, 300), streams=st.integers(1, 6), new_streams=st.integers(1, 6),
       window=st.integers(1, 40), unit=st.integers(1, 4), data=st.data())
def test_remaining_after_a_lockstep_stop_is_read_once_by_any_new_job(
        length, streams, new_streams, window, unit, data):
    share = Share.of([(0, length)], streams, 0, window=window, unit=unit)
    consumed = [data.draw(st.integers(0, share.count(k))) for k in range(streams)]
    read = {p for k in range(streams) for a, b in share.pieces(k=k) for p in range(a, b)
            if True}
    read = set()
    for k in range(streams):
        positions = [p for a, b in share.pieces(k=k) for p in range(a, b)]
        read.update(positions[:consumed[k]])
    left = share.remaining(consumed)
    resumed = [p for k in range(new_streams)
               for a, b in Share.of(left, new_streams, k, window=window, unit=unit).pieces()
               for p in range(a, b)]
    assert len(resumed) == len(set(resumed))
    assert set(resumed) | read == set(range(length)) and not (set(resumed) & read)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 300), streams=st.integers(1, 6), window=st.integers(1, 40),
       skip=st.integers(0, 300))
def test_skipping_continues_the_same_share(length, streams, window, skip):
    for k in range(streams):
        share = Share.of([(0, length)], streams, k, window=window)
        full = [p for a, b in share.pieces() for p in range(a, b)]
        rest = [p for a, b in share.pieces(skip) for p in range(a, b)]
        assert rest == full[skip:]


@pytest.mark.parametrize("world,workers", [(1, 1), (1, 4), (2, 2), (4, 3)])
@pytest.mark.parametrize("seed,epoch", [(0, 0), (0, 1), (9, 4)])
def test_streams_orders_are_not_correlated(world, workers, seed, epoch):
    layout = Layout.from_shards([700] * 6, [[64] * 10 + [60]] * 6)
    order = EpochOrder(layout, seed, epoch, 256)
    n = world * workers
    seen = []
    for k in range(n):
        share = Share.of([(0, len(order))], n, k, window=256)
        rows = np.concatenate([order.rows(a, b) for a, b in share.pieces()])
        seen.append(rows)
    assert sorted(np.concatenate(seen).tolist()) == list(range(layout.num_rows))
    if n > 1:
        m = min(len(s) for s in seen)
        diff = seen[1][:m] - seen[0][:m]
        assert len(set(diff.tolist())) > m // 2  # not "stream 1 = stream 0 plus one"


def test_a_rank_sees_different_examples_each_epoch():
    layout = Layout.from_shards([4000], [[100] * 40])
    shares = [set(np.concatenate([EpochOrder(layout, 0, e, 500).rows(a, b) for a, b in
                                  Share.of([(0, 4000)], 2, 0, window=500).pieces()]).tolist())
              for e in range(3)]
    assert shares[0] != shares[1] != shares[2]


def test_chunk_is_a_window_when_there_are_enough():
    assert choose_chunk(100_000, 4, window=1000) == 1000
    assert choose_chunk(100_000, 4, window=1000, unit=64) == 1024
    assert choose_chunk(1000, 4, window=1000, unit=8) == 120
    assert choose_chunk(10, 4, window=1000, unit=8) == 8
