"""AUTOTUNE choices, per-stage stats and the writing epoch's progress."""

from __future__ import annotations

import time

import numpy as np

import snapcache as sc
from snapcache.machine import available_cpus, memory_budget
from snapcache.runtime.autotune import BufferTuner, ThreadTuner


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
    stages = {st.stage.split("`")[0].strip(): st for st in s.stages}
    assert stages["range(0, 100)"].examples == 100
    assert stages["map"].examples == 100
    assert stages["batch(10)"].examples == 10
    assert stages["batch(10)"].bytes == 100 * 40
    assert 0 < s.input_wait_seconds <= s.wall_seconds
    assert 0 < s.input_wait_fraction <= 1
    assert s.to_dict()["stages"][0]["stage"] == "range(0, 100)"
    assert "consumer waited" in str(s)


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
