"""Shared fixtures."""

from __future__ import annotations

import os
import threading

import pytest

# The processes tests start (killed writers, CLI runs, DataLoader workers) import this
# checkout's snapcache, like the test process does, whatever an installed copy points at.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_CHECKOUT, os.environ.get("PYTHONPATH")) if p)


class CallCounter:
    """Wraps a function and counts calls (thread-safe)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            self.count += 1


@pytest.fixture
def counter() -> CallCounter:
    return CallCounter()


@pytest.fixture
def root(tmp_path):
    """A fresh snapshot root on local disk."""
    path = tmp_path / "snaps"
    return str(path)


# A call counter is bookkeeping, not part of what a map computes: tell the fingerprint so
# (this is the documented escape hatch for user types).
import snapcache.fingerprint  # noqa: E402

snapcache.fingerprint.register(CallCounter, lambda counter: "CallCounter")

# S3 over HTTP: a moto server subprocess (session) and a fresh bucket per test; see s3server.py.
from s3server import s3_root, s3_server  # noqa: E402,F401
# A fault-injecting proxy in front of it (resets, lost answers, refusals); see faultproxy.py.
from faultproxy import fault_proxy  # noqa: E402,F401


# A test that hangs is stopped by pytest-timeout, which prints this process's stacks. The
# processes it forked (DataLoader workers, concurrent readers) print theirs too, so that a hang
# in one of them can be diagnosed: faulthandler on SIGUSR1 is installed here and survives fork,
# and 15 s before the timeout every live forked descendant is sent SIGUSR1. Processes that
# exec'd another program (the moto server) are left alone: SIGUSR1 would kill them.
import faulthandler  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

faulthandler.register(signal.SIGUSR1, all_threads=True)


def _forked_descendants() -> list[int]:
    def cmdline(pid) -> bytes | None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return None

    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    ours, found, todo = cmdline(os.getpid()), [], [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), ()):
            todo.append(child)
            if cmdline(child) == ours:
                found.append(child)
    return found


def _dump_forked_stacks() -> None:
    pids = _forked_descendants()
    if pids:
        print(f"\nconftest: about to time out; stacks of forked processes {pids}:",
              file=sys.__stderr__, flush=True)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass


@pytest.fixture(autouse=True)
def _stacks_of_forked_processes_before_a_timeout(request):
    if not os.path.isdir("/proc"):
        yield
        return
    marker = request.node.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else \
        float(request.config.getini("timeout") or 0)
    if timeout <= 30:
        yield
        return
    timer = threading.Timer(timeout - 15, _dump_forked_stacks)
    timer.name, timer.daemon = "conftest-stacks-before-timeout", True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# Libraries whose tests leave threads in the pytest process run last. Ray (ray.init: gRPC)
# and TensorFlow (its thread pools) keep threads that hold abseil mutexes; a process forked
# after that (a DataLoader worker of a later test) can abort in abseil ("Mutex::Fer while
# waiting on Condition", seen in tests/adapters/test_torch.py right after test_tf.py) or hang.
# A user's process that runs TensorFlow or Ray and then forks DataLoader workers meets the
# same: the guide says to use a forkserver or spawn context there.
_THREADS_LEFT_BEHIND = ("tests/adapters/test_ray.py", "tests/adapters/test_tf.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.startswith(_THREADS_LEFT_BEHIND))  # stable
