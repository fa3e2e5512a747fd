"""Process-map failures: the right example, what happened, nothing left behind -- even when
the parent is SIGKILLed or the script has no main guard."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import snapcache as sc
from snapcache.errors import UserFunctionError
from snapcache.runtime.process import process_map

HERE = pathlib.Path(__file__).parent
REPO = HERE.parent.parent


class NeedsTwo(Exception):
    """Pickles, but cannot be rebuilt from its args: unpickling fails."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class HoldsLock(Exception):
    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


def fails_at_37(x):
    if x == 37:
        raise KeyError("k37")
    return x


def unpicklable_at_37(x):
    if x == 37:
        raise NeedsTwo(1, 2)
    return x


def cannot_pickle_at_37(x):
    if x == 37:
        raise HoldsLock()
    return x


def killed_at_37(x):
    if x == 37:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def killed_at_0(x):
    if x == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _segments():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("snapcache_")}
    except FileNotFoundError:
        return set()


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 16])
def test_failure_names_the_right_example_after_yielding_the_ones_before(chunk_size):
    seen = []
    with pytest.raises(KeyError) as info:
        for x in process_map(fails_at_37, range(100), workers=2, chunk_size=chunk_size,
                             label="map `fails_at_37`"):
            seen.append(x)
    assert info.value.__notes__ == [
        "snapcache: raised by map `fails_at_37` on example #37 of this epoch"]
    assert "fails_at_37" in str(info.value.__cause__)       # the worker's traceback
    assert seen == list(range(37))


def test_failure_in_a_dataset_names_the_example():
    ds = sc.Dataset.range(100).map(fails_at_37, num_parallel_calls=2, executor="process")
    with pytest.raises(KeyError) as info:
        list(ds)
    assert any("example #37" in note for note in info.value.__notes__)


@pytest.mark.parametrize("fn,why", [(unpicklable_at_37, "cannot be unpickled"),
                                    (cannot_pickle_at_37, "cannot be pickled")])
def test_exceptions_that_cannot_travel_are_described(fn, why):
    with pytest.raises(UserFunctionError) as info:
        list(process_map(fn, range(100), workers=2, label=f"map `{fn.__name__}`"))
    message = str(info.value)
    assert f"map `{fn.__name__}` raised" in message and "example #37" in message, message
    assert ("NeedsTwo: 1/2" in message or "HoldsLock: holds a lock" in message), message
    assert why in message and "executor='thread'" in message, message
    assert fn.__name__ in str(info.value.__cause__)         # the worker's traceback


def test_a_worker_killed_by_a_signal_is_reported_with_its_example():
    before = _segments()  # other jobs on the machine may have maps running: only ours count
    with pytest.raises(UserFunctionError, match=r"worker died: signal 9 \(SIGKILL\) while "
                                                r"computing example #37"):
        list(process_map(killed_at_37, range(100), workers=2, chunk_size=4,
                         label="map `killed_at_37`"))
    assert not [n for n in _segments() - before if "status" in n]


def test_a_worker_death_seen_when_submitting_is_reported_with_its_example(monkeypatch):
    """The pool can break between two submissions, and the next submit then raises
    BrokenProcessPool: that must give the same report as a death seen by a chunk's result."""
    from concurrent.futures import ProcessPoolExecutor

    original = ProcessPoolExecutor.submit
    calls = []

    def submit(self, fn, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:                    # wait until the pool has seen the worker die
            deadline = time.monotonic() + 60
            while not self._broken and time.monotonic() < deadline:
                time.sleep(0.01)
            assert self._broken
        return original(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", submit)
    with pytest.raises(UserFunctionError, match=r"worker died: signal 9 \(SIGKILL\) while "
                                                r"computing example #0"):
        list(process_map(killed_at_0, range(10), workers=1, chunk_size=1,
                         label="map `killed_at_0`"))
    assert len(calls) == 2


PARENT = """
import json, os, sys
import numpy as np
from snapcache.runtime.process import process_map

def big(x):
    import time
    time.sleep(0.05)
    return np.full((1 << 17,), x, np.uint8)      # through shared memory

if __name__ == "__main__":
    it = process_map(big, range(100000), workers=2, chunk_size=1)
    next(it)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    sys.stdin.read()                             # wait to be killed
"""


def _children():
    """pid -> (parent pid, state) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), fields[0])
    return table


def _descendants(pid):
    table = _children()
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _) in table.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pids):
    table = _children()
    return {p for p in pids if p in table and table[p][1] != "Z"}


def test_workers_fork_server_tracker_and_segments_die_with_a_sigkilled_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    before = _segments()
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        line = proc.stdout.readline()
        assert json.loads(line)["pid"] == proc.pid
        family = _descendants(proc.pid)
        assert len(family) >= 3          # fork server, 2 workers (and the resource tracker)
        assert _segments() - before      # results are parked in shared memory
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120   # generous: the assertion is that they go at all
        while (_running(family) or _segments() - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(family) == set(), "processes of the map outlived their parent"
        assert _segments() - before == set(), "shared-memory segments outlived the parent"
    finally:
        proc.kill()
        proc.wait()


UNGUARDED = """
import numpy as np
import snapcache as sc

def square(x):
    return x * x

print("body runs", flush=True)
print(list(sc.Dataset.range(5).map(square, num_parallel_calls=2, executor="process")))
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr and "line 9" in proc.stderr, proc.stderr
    assert "bootstrapping" not in proc.stderr
    assert proc.stdout.count("body runs") == 1


def test_a_guarded_script_runs(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(UNGUARDED.replace('print("body', 'if __name__ == "__main__":\n'
                                        '    print("body').replace("\nprint(list", "\n    print(list"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["body runs", "[0, 1, 4, 9, 16]"]
    assert "resource_tracker" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
