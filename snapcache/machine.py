"""What this machine offers the process: usable CPUs and memory, who the process is on it
(host, pid namespace, boot, whether a pid is alive), and the node-local folders where this
user's processes share small records (:func:`shared_folder`). A leaf module (it imports
nothing from snapcache), so the store and the runtime both size themselves from it without
the store importing the runtime.

>>> available_cpus() >= 1 and memory_budget() >= 32 << 20
True
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
import time


def available_cpus() -> int:
    """CPUs this process can actually use: affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def total_memory() -> int:
    """Physical memory in bytes (8 GiB when the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def memory_budget(fraction: float = 1 / 64, low: int = 32 << 20, high: int = 256 << 20) -> int:
    """Bytes one prefetch buffer may hold by default: a small share of RAM, within bounds."""
    return int(min(high, max(low, total_memory() * fraction)))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this pid namespace exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


HOST = socket.gethostname()
PIDNS = _pid_namespace()
"""This process's pid namespace ("" where the platform does not say): a pid recorded by another
process means the same process here only if both were in the same namespace (and boot)."""
BOOT = _read_text("/proc/sys/kernel/random/boot_id")
"""This boot of the machine ("" where the platform does not say)."""


STALE_SECONDS = 24 * 3600.0
"""A node-local record untouched this long was left by a process that is gone."""

_pruned: set[str] = set()


def shared_folder(kind: str) -> str:
    """``<tmp>/snapcache-<kind>-<uid>``: where this user's processes on this machine share
    small records (manifest checks, progress ticks). The first time a process asks for it,
    the entries untouched for :data:`STALE_SECONDS` are removed: records of killed runs would
    otherwise pile up for ever (records are caches; one removed while in use is made again)."""
    getuid = getattr(os, "getuid", None)
    path = os.path.join(tempfile.gettempdir(),
                        f"snapcache-{kind}-{getuid() if getuid is not None else 'user'}")
    if path not in _pruned:
        _pruned.add(path)
        _prune(path, time.time() - STALE_SECONDS)
    return path


def _prune(path: str, before: float) -> None:
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= before:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
