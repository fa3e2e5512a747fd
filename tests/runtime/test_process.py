"""Process-pool map: order, errors with position, shared memory, and cleanup."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

import snapcache as sc
from snapcache.runtime.process import SHM_THRESHOLD, ChunkSizer, process_map


def square(x):
    return x * x


def pid_and_value(x):
    return (os.getpid(), x)


def big_array(x):
    return {"a": np.full((SHM_THRESHOLD // 8 + 10,), x, np.float64), "small": np.int64(x),
            "t": (np.arange(3), "s")}


def fails_at_13(x):
    if x == 13:
        raise KeyError("thirteen")
    return x


def slow_big(x):
    import time
    time.sleep(0.01)
    return np.full((64, 1024), x, np.uint8)


def numpy_draw(x):
    return int(x), float(np.random.rand())


def torch_draw(x):
    import torch
    return int(x), float(torch.rand(()))


@pytest.mark.parametrize("draw", [numpy_draw, pytest.param(torch_draw, marks=pytest.mark.slow)])
def test_process_workers_draw_their_own_random_numbers_every_epoch(tmp_path, draw):
    """A random augmentation after the snapshot, in worker processes: numpy's and torch's
    draws differ between workers and epochs (workers forked from one fork server drew the
    same numpy numbers in every worker and every epoch)."""
    ds = (sc.Dataset.range(60).snapshot(str(tmp_path), progress=False)
          .map(draw, num_parallel_calls=2, executor="process"))
    epochs = [sorted(ds) for _ in range(2)]
    assert [[e[0] for e in epoch] for epoch in epochs] == [list(range(60))] * 2
    draws = [e[1] for epoch in epochs for e in epoch]
    assert len(set(draws)) == len(draws) == 120


def _my_segments():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("snapcache_")}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leftovers():
    before = _my_segments()
    yield
    assert _my_segments() - before == set(), "shared-memory segments left behind"
    assert multiprocessing.active_children() == [], "worker processes left behind"


@pytest.mark.parametrize("chunk_size", [None, 1, 7])
def test_order_is_preserved(chunk_size):
    out = list(process_map(square, range(200), workers=2, chunk_size=chunk_size))
    assert out == [x * x for x in range(200)]


def test_work_runs_in_other_processes():
    pids = {pid for pid, _ in process_map(pid_and_value, range(50), workers=2, chunk_size=1)}
    assert os.getpid() not in pids


def test_nondeterministic_yields_everything_once():
    out = list(process_map(square, range(300), workers=2, deterministic=False))
    assert sorted(out) == [x * x for x in range(300)]


def test_large_arrays_come_back_through_shared_memory_intact():
    out = list(process_map(big_array, range(20), workers=2))
    for i, o in enumerate(out):
        assert o["a"].shape == (SHM_THRESHOLD // 8 + 10,) and (o["a"] == i).all()
        assert o["a"].flags.writeable
        assert o["small"] == i and o["t"][1] == "s"
        assert np.array_equal(o["t"][0], np.arange(3))


def test_worker_error_keeps_type_traceback_and_position():
    with pytest.raises(KeyError) as info:
        list(process_map(fails_at_13, range(100), workers=2, label="map `fails_at_13`"))
    assert any("example #13" in note for note in info.value.__notes__)
    assert "fails_at_13" in str(info.value.__cause__)  # the worker's traceback


def test_abandoned_iterator_cleans_up_processes_and_segments():
    it = process_map(slow_big, range(1000), workers=2)
    assert next(it).shape == (64, 1024)
    it.close()


def test_error_cleans_up_while_large_results_are_in_flight():
    def source():
        for i in range(100):
            if i == 30:
                raise RuntimeError("upstream broke")
            yield i
    with pytest.raises(RuntimeError, match="upstream broke"):
        list(process_map(slow_big, source(), workers=2))


def test_chunk_size_adapts_to_the_cost_of_a_call():
    sizer = ChunkSizer()
    sizer.observe(10, 10 * 1e-6)  # 1 us a call: big chunks
    assert sizer.size > 100
    sizer = ChunkSizer()
    sizer.observe(2, 2 * 0.05)   # 50 ms a call: one at a time
    assert sizer.size == 1


def test_dataset_map_with_processes():
    ds = sc.Dataset.range(100).map(square, num_parallel_calls=2, executor="process")
    assert list(ds) == [x * x for x in range(100)]
    auto = sc.Dataset.range(10).map(square, num_parallel_calls=sc.AUTOTUNE, executor="process")
    assert list(auto) == [x * x for x in range(10)]


def test_dataset_map_error_with_processes_names_the_position():
    ds = sc.Dataset.range(50).map(fails_at_13, num_parallel_calls=2, executor="process")
    with pytest.raises(KeyError) as info:
        list(ds)
    assert any("example #13" in note for note in info.value.__notes__)


def test_unpicklable_functions_are_refused_when_the_pipeline_is_built():
    with pytest.raises(TypeError, match="module level"):
        sc.Dataset.range(3).map(lambda x: x, num_parallel_calls=2, executor="process")
    offset = 3

    def closure(x):
        return x + offset
    with pytest.raises(TypeError, match="executor='thread'"):
        sc.Dataset.range(3).map(closure, executor="process")
    with pytest.raises(ValueError, match="executor"):
        sc.Dataset.range(3).map(square, executor="fiber")
