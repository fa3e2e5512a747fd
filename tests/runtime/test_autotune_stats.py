"""AUTOTUNE choices, per-stage stats and the writing epoch's progress."""

from __future__ import annotations

import time

import numpy as np
import pytest

import snapcache as sc
from snapcache.machine import available_cpus, memory_budget
from snapcache.runtime.autotune import BufferTuner, ThreadTuner
from tests.conftest import CallCounter


def test_available_cpus_is_positive_and_bounded():
    import os
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


def test_thread_tuner_starts_at_the_cpus_and_grows_for_waiting_functions():
    tuner = ThreadTuner(cpus=4, period=4)
    assert tuner.parallelism == 4 > 1
    for _ in range(16):
        tuner.observe(wall=0.005, cpu=0.0001)  # a call that mostly waits
    assert tuner.parallelism > 4  # mostly waiting: more threads than cores
    assert tuner.parallelism <= tuner.limit


def test_thread_tuner_keeps_one_thread_a_core_for_cpu_bound_functions():
    tuner = ThreadTuner(cpus=2, period=4)
    for _ in range(16):
        tuner.observe(wall=0.003, cpu=0.003)  # a call that burns CPU all along
    assert tuner.parallelism == 2


def test_thread_tuner_measures_wall_and_thread_cpu_time(monkeypatch):
    """``wrap`` reports each call's wall time and its thread's CPU time (the rule above is
    tested on exact observations, so it holds whatever else the machine is doing)."""
    tuner = ThreadTuner(cpus=2, period=4)
    seen = []
    monkeypatch.setattr(tuner, "observe", lambda wall, cpu: seen.append((wall, cpu)))
    assert tuner.wrap(lambda x: x + 1)(1) == 2
    (wall, cpu), = seen
    assert wall >= 0 and cpu >= 0


def test_autotuned_map_adapts_and_keeps_order(monkeypatch):
    seen = []
    original = ThreadTuner.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)
    monkeypatch.setattr(ThreadTuner, "__init__", spy)

    def io(x):
        time.sleep(0.002)
        return x
    out = list(sc.Dataset.range(200).map(io, num_parallel_calls=sc.AUTOTUNE))
    assert out == list(range(200))
    assert seen and seen[0].parallelism > seen[0].history[0]


def test_buffer_tuner_sizes_by_bytes():
    tuner = BufferTuner(budget=1 << 20)
    assert tuner.observe(np.zeros(1 << 16, np.uint8)) == 16
    small = BufferTuner(budget=1 << 20)
    assert small.observe(np.zeros(8, np.uint8)) == small.high


def test_autotuned_prefetch_keeps_everything():
    assert list(sc.Dataset.range(500).prefetch(sc.AUTOTUNE)) == list(range(500))


def test_memory_budget_within_bounds():
    assert 32 << 20 <= memory_budget() <= 256 << 20


def test_stats_count_every_stage_and_the_consumer_wait():
    def slow(x):
        time.sleep(0.001)
        return {"v": np.zeros(10, np.float32) + x}
    ds = sc.Dataset.range(100).map(slow).batch(10)
    assert ds.stats() is None
    for _ in ds:
        pass
    s = ds.stats()
    assert s.finished and s.examples == 10
    labels = ["range(0, 100)", f"map #1 `{slow.__qualname__}`", "batch #2 (10)"]
    assert [st.stage for st in s.stages] == labels
    stages = dict(zip(labels, s.stages))
    assert stages["range(0, 100)"].examples == 100
    assert stages[labels[1]].examples == 100
    assert stages["batch #2 (10)"].examples == 10
    assert stages["batch #2 (10)"].bytes == 100 * 40
    assert 0 < s.input_wait_seconds <= s.wall_seconds
    assert 0 < s.input_wait_fraction <= 1
    assert s.to_dict()["stages"][0]["stage"] == "range(0, 100)"
    assert "consumer waited" in str(s)


def _counts(ds) -> list[tuple[str, int]]:
    s = ds.stats()
    return [(st.stage, st.examples) for st in s.stages]


DECODED, DOUBLED = CallCounter(), CallCounter()


def decode(i):
    DECODED.hit()
    return np.full(4, i, np.int64)


def double(x):
    DOUBLED.hit()
    return x * 2


def _snapshotted(root, tail):
    """``range(200) -> map(decode) -> snapshot -> map(double)`` then ``tail``, with the call
    counters of both maps at 0."""
    DECODED.count = DOUBLED.count = 0
    return tail(sc.Dataset.range(200).map(decode).snapshot(root, progress=False).map(double)), \
        DECODED, DOUBLED


def test_stats_of_a_writing_epoch_then_a_read_epoch_count_each_stage_once(root):
    ds, decoded, doubled = _snapshotted(root, lambda ds: ds)
    snapshot = f"snapshot({root!r})"
    assert sum(1 for _ in ds) == 200
    s = ds.stats()
    assert s.finished and s.examples == 200 and 0 < s.input_wait_seconds <= s.wall_seconds
    assert _counts(ds) == [("range(0, 200)", 200), ("map #1 `decode`", decoded.count),
                           (snapshot, 200), ("map #2 `double`", doubled.count)]
    assert decoded.count == doubled.count == 200

    assert sum(1 for _ in ds) == 200  # read: nothing before the snapshot runs
    s = ds.stats()
    assert s.finished and s.examples == 200 and s.wall_seconds > 0
    assert s.stages[-1].examples_per_second > 0
    assert _counts(ds) == [(snapshot, 200), ("map #2 `double`", 200)]
    assert decoded.count == 200 and doubled.count == 400
    assert s.stages[0].bytes == 200 * 32  # the examples, not the (position, example) pairs


@pytest.mark.parametrize("seed", [0, None])
def test_stats_of_a_writing_epoch_with_a_shuffle_list_the_ops_after_the_snapshot(root, seed):
    """A seeded shuffle's writing epoch completes the snapshot, then reads it in the epoch's
    order: the examples it wrote are counted once, and the ops after the snapshot too."""
    ds, decoded, doubled = _snapshotted(root, lambda ds: ds.shuffle(50, seed=seed).batch(16))
    snapshot = f"snapshot({root!r})"
    assert sum(1 for _ in ds) == 13
    s = ds.stats()
    assert s.finished and s.examples == 13 and 0 < s.input_wait_seconds <= s.wall_seconds
    assert _counts(ds) == [("range(0, 200)", 200), ("map #1 `decode`", 200), (snapshot, 200),
                           ("map #2 `double`", 200), ("shuffle #3 (50)", 200),
                           ("batch #4 (16)", 13)]
    assert decoded.count == doubled.count == 200
    times = [st.seconds for st in s.stages]
    assert times == sorted(times)  # each stage's time holds those it pulls from (or waited on)

    assert sum(1 for _ in ds) == 13
    assert _counts(ds) == [(snapshot, 200), ("map #2 `double`", 200), ("shuffle #3 (50)", 200),
                           ("batch #4 (16)", 13)]
    assert decoded.count == 200 and doubled.count == 400
    assert ds.stats().finished and ds.stats().examples == 13


def test_stats_of_a_columnar_read_count_the_stages_it_does_the_work_of(root):
    """``snapshot -> shuffle -> batch`` is read as whole columns: no op runs, yet each stage
    is listed with what passed through it."""
    ds = sc.Dataset.range(200).map(lambda i: np.full(4, i)).snapshot(root, progress=False)
    list(ds)
    batched = ds.shuffle(50, seed=0).batch(16)
    assert sum(1 for _ in batched) == 13
    snapshot = f"snapshot({root!r})"
    assert _counts(batched) == [(snapshot, 200), ("shuffle #2 (50)", 200), ("batch #3 (16)", 13)]
    assert batched.stats().finished and batched.stats().examples == 13
    shuffled = ds.shuffle(50, seed=0)  # rows handed out in runs
    assert sum(1 for _ in shuffled) == 200
    assert _counts(shuffled) == [(snapshot, 200), ("shuffle #2 (50)", 200)]
    assert shuffled.stats().finished and shuffled.stats().examples == 200


def test_stats_of_an_epoch_broken_off_say_so_and_stop_the_clock(root):
    ds, decoded, doubled = _snapshotted(root, lambda ds: ds)
    list(ds)
    it = ds.iterate()
    for _ in range(50):
        next(it)
    during = ds.stats()
    assert not during.finished and during.examples == 50
    it.close()
    s = ds.stats()
    assert not s.finished and s.examples == 50 and "(epoch not finished)" in str(s)
    assert dict(_counts(ds))["map #2 `double`"] == doubled.count - 200 == 50
    time.sleep(0.01)
    assert ds.stats().wall_seconds == s.wall_seconds  # closed: the epoch's clock stopped

    rows = sc.Dataset.range(3000).snapshot(root, progress=False)
    list(rows)
    it = rows.iterate()  # rows read in runs: the consumer's count is exact all the same
    for _ in range(1500):
        next(it)
    assert rows.stats().examples == 1500
    del it  # abandoned: collected, closed
    assert not rows.stats().finished and rows.stats().examples == 1500


def test_stats_show_a_slow_consumer_is_not_input_bound():
    ds = sc.Dataset.range(20).prefetch(4)
    for _ in ds:
        time.sleep(0.005)
    assert ds.stats().input_wait_fraction < 0.5


def test_progress_reports_the_writing_epoch_only(root):
    updates = []
    ds = sc.Dataset.range(1000).map(lambda x: np.zeros(100, np.uint8) + x % 7).snapshot(
        root, progress=updates.append)
    list(ds)
    assert updates and updates[-1].done
    last = updates[-1]
    assert last.examples == 1000 and last.total == 1000 and last.bytes == 100_000
    assert "1,000/1,000 examples" in str(last)
    count = len(updates)
    list(ds)  # a read: no progress
    assert len(updates) == count


def test_default_progress_logs_when_not_a_terminal(root, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="snapcache")
    list(sc.Dataset.range(10).snapshot(root))
    assert any("wrote" in r.getMessage() and "10/10 examples" in r.getMessage()
               for r in caplog.records)
