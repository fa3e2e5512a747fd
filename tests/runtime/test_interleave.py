"""Interleave order and parallelism, shard, repeat."""

from __future__ import annotations

import threading
import time

import pytest

import snapcache as sc
from snapcache.runtime.interleave import interleave


def repeat6(x):
    return [x] * 6


# tf.data's documented example: range(1, 6).interleave(x -> [x]*6, cycle_length=2, block_length=4)
TF_ORDER = [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5,
            5, 5]


@pytest.mark.parametrize("parallelism", [1, 2, 8])
def test_order_matches_tf_data(parallelism):
    out = list(interleave(repeat6, range(1, 6), cycle_length=2, block_length=4,
                          parallelism=parallelism))
    assert out == TF_ORDER


@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("cycle", [1, 2, 5, 10])
def test_uneven_sources_block_length_one(parallelism, cycle):
    def source(n):
        return [(n, i) for i in range(n % 4)]
    items = list(range(12))
    out = list(interleave(source, items, cycle_length=cycle, parallelism=parallelism))
    serial = list(interleave(source, items, cycle_length=cycle, parallelism=1))
    assert out == serial
    assert sorted(out) == sorted(e for n in items for e in source(n))
    if cycle == 1:
        assert out == [e for n in items for e in source(n)]


def test_parallel_sources_are_read_concurrently():
    active, peak = 0, 0
    lock = threading.Lock()

    def slow_source(x):
        nonlocal active, peak
        for i in range(3):
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.02)
            with lock:
                active -= 1
            yield (x, i)

    out = list(interleave(slow_source, range(8), cycle_length=4, parallelism=4))
    assert len(out) == 24 and peak > 1


def test_nondeterministic_yields_everything():
    out = list(interleave(repeat6, range(10), cycle_length=3, parallelism=3,
                          deterministic=False))
    assert sorted(out) == sorted(x for x in range(10) for _ in range(6))


@pytest.mark.parametrize("parallelism", [1, 2])
def test_error_in_a_source_names_the_input_position(parallelism):
    def bad(x):
        if x == 3:
            raise ValueError("cannot open 3")
        return [x]
    with pytest.raises(ValueError) as info:
        list(interleave(bad, range(6), cycle_length=2, parallelism=parallelism, label="il"))
    assert any("example #3" in n for n in info.value.__notes__)


def test_abandoning_a_parallel_interleave_closes_sources():
    closed = []

    def endless(x):
        try:
            while True:
                yield x
        finally:
            closed.append(x)

    it = interleave(endless, range(4), cycle_length=2, parallelism=2)
    assert [next(it) for _ in range(4)] == [0, 1, 0, 1]
    it.close()
    assert closed  # every started source's thread stopped and closed its generator


def test_dataset_interleave_accepts_datasets_and_validates():
    ds = sc.Dataset.range(1, 6).interleave(
        lambda x: sc.Dataset.from_iterable([x] * 6), cycle_length=2, block_length=4,
        num_parallel_calls=sc.AUTOTUNE)
    assert list(ds) == TF_ORDER
    with pytest.raises(ValueError):
        sc.Dataset.range(3).interleave(repeat6, cycle_length=0)
    with pytest.raises(TypeError):
        sc.Dataset.range(3).interleave(5)


@pytest.mark.parametrize("n", [0, 1, 10, 33])
@pytest.mark.parametrize("num_shards", [1, 2, 3, 7])
def test_shards_are_disjoint_and_cover_everything(n, num_shards):
    parts = [list(sc.Dataset.range(n).shard(num_shards, i)) for i in range(num_shards)]
    flat = [x for p in parts for x in p]
    assert sorted(flat) == list(range(n))
    assert len(set(flat)) == len(flat)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_shard_validates():
    with pytest.raises(ValueError):
        sc.Dataset.range(3).shard(2, 2)
    with pytest.raises(ValueError):
        sc.Dataset.range(3).shard(0, 0)


def test_repeat():
    assert list(sc.Dataset.range(3).repeat(2)) == [0, 1, 2, 0, 1, 2]
    assert list(sc.Dataset.range(3).repeat(0)) == []
    assert list(sc.Dataset.range(3).repeat().take(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert list(sc.Dataset.range(0).repeat()) == []  # never hangs on an empty dataset


def test_repeat_reshuffles_each_repetition_reproducibly():
    ds = sc.Dataset.range(50).shuffle(50, seed=1).repeat(2)
    out = list(ds.iterate(0))
    first, second = out[:50], out[50:]
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second
    assert out == list(ds.iterate(0))
    assert first == list(sc.Dataset.range(50).shuffle(50, seed=1).iterate(0))


def test_repeat_over_a_snapshot_writes_once_then_reads(root, counter):
    def f(x):
        counter.hit()
        return x
    ds = sc.Dataset.range(20).map(f).snapshot(root, progress=False).repeat(3)
    assert list(ds) == list(range(20)) * 3
    assert counter.count == 20
