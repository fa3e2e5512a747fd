"""The iterator lifecycle: nothing is held before the first next(); everything is given back
on exhaustion, close, garbage collection, an exception, or exit; a second iteration in the
same process never waits on the first; no thread runs library code while the interpreter
finalizes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import snapcache as sc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def example(i):
    return {"x": np.full((8,), i, np.float32), "i": i}


def leases(root):
    return sorted(f for _, _, files in os.walk(root) for f in files
                  if f.startswith(("lease-", "reader-")))


def test_nothing_is_held_before_the_first_next_and_all_is_released_after(tmp_path):
    ds = sc.Dataset.range(500).map(example).snapshot(str(tmp_path), shard_size=2000,
                                                    progress=False)
    it = iter(ds)
    assert leases(tmp_path) == [] and not os.listdir(tmp_path)
    del it
    gc.collect()
    it = iter(ds)
    next(it)
    assert [f for f in leases(tmp_path) if f.startswith("lease-")]
    it.close()
    assert leases(tmp_path) == []
    assert next(it, None) is None  # a closed iterator is exhausted


def test_a_dropped_iterator_releases_its_lease(tmp_path):
    ds = sc.Dataset.range(500).map(example).snapshot(str(tmp_path), shard_size=2000,
                                                    progress=False)
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    assert leases(tmp_path) == []


def test_an_iterator_abandoned_by_an_exception_releases_its_lease(tmp_path):
    def fails(i):
        if i == 300:
            raise ValueError("bad example")
        return example(i)

    ds = sc.Dataset.range(500).map(fails).snapshot(str(tmp_path), shard_size=2000,
                                                  progress=False)
    it = iter(ds)
    with pytest.raises(Exception, match="bad example"):
        for _ in it:
            pass
    assert leases(tmp_path) == []  # `it` is still referenced: released by the failure


SECOND_ITERATION = textwrap.dedent("""
    import sys
    import numpy as np
    import snapcache as sc

    def make(i):
        return {"x": np.full((8,), i, np.float32), "i": i}

    ds = sc.Dataset.range(400).map(make).snapshot(sys.argv[1], shard_size=2000, progress=False)
    sharing = sc.Dataset.range(400).map(make).snapshot(sys.argv[1], progress=False)
    first = iter(ds)
    next(first)
    assert sum(1 for _ in ds) == 400        # waits on nobody: the writer is this thread's own
    assert sum(1 for _ in sharing) == 400   # another pipeline object sharing the upstream
    assert sum(1 for _ in first) == 399
    assert ds.open_snapshot().state == "committed"
    assert sorted(int(e["i"]) for e in ds) == list(range(400))
    print("done", flush=True)
""")


def test_a_second_iteration_in_the_same_process_does_not_wait_on_the_first(tmp_path):
    script = tmp_path / "second.py"
    script.write_text(SECOND_ITERATION)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # a hang (waiting on itself) fails by the timeout instead of blocking the suite
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "snaps")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]


EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import snapcache as sc

    def make(i):
        return {"x": np.full((64,), i, np.float32), "i": i}

    ds = (sc.Dataset.range(20_000).map(make).snapshot(sys.argv[1], shard_size=64_000,
                                                      progress=False)
          .shuffle(1000, seed=0).batch(32).prefetch(4))
    if sys.argv[2] == "build":
        for _ in ds:
            pass
    else:
        next(iter(ds))          # one batch, then exit with everything still running
        print("one batch", flush=True)
""")


@pytest.mark.parametrize("times", [10, pytest.param(30, marks=pytest.mark.slow)])
def test_exit_right_after_one_batch_is_clean_many_times(tmp_path, times):
    script = tmp_path / "one_batch.py"
    script.write_text(EXIT_SCRIPT)
    root = str(tmp_path / "snaps")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def run(mode, where=root):
        return subprocess.run([sys.executable, str(script), where, mode], env=env,
                              capture_output=True, text=True, timeout=300)

    # runs on fresh roots write while they read one batch; the rest read the committed one
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, ["one"] * 4, [str(tmp_path / f"w{k}") for k in range(4)]))
    built = run("build")
    assert built.returncode == 0, built.stderr
    with ThreadPoolExecutor(3) as pool:
        results += list(pool.map(run, ["one"] * times))
    for r in results:
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        assert "one batch" in r.stdout
        assert "terminate called" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert leases(root) == []


@pytest.mark.parametrize("kind", ["prefetch", "interleave"])
def test_work_abandoned_while_busy_leaves_nothing_registered_once_it_ends(kind):
    """An epoch abandoned while its background thread is inside a slow function: the thread
    ends later on its own, and then nothing of it stays in the exit registry (a long
    training that breaks out of many epochs would otherwise grow it forever)."""
    import threading

    from snapcache import lifecycle

    def pipeline(release):
        def slow(i):
            if i > 0:  # the first example comes at once, the next one waits
                release.wait(60)
            return i

        if kind == "prefetch":
            return sc.Dataset.range(1000).map(slow).prefetch(2)
        return sc.Dataset.range(50).interleave(lambda i: [slow(i)], cycle_length=1,
                                               num_parallel_calls=1)

    def registered():
        with lifecycle._lock:
            return len(lifecycle._closers)

    before = registered()
    releases = []
    for _ in range(5):
        releases.append(threading.Event())
        it = iter(pipeline(releases[-1]))
        assert next(it) == 0
        it.close()  # the thread is inside slow(1): it outlives the close
    for release in releases:
        release.set()
    for thread in threading.enumerate():
        if thread.name in ("snapcache-prefetch", "snapcache-interleave"):
            thread.join(60)
    assert registered() == before
