"""What this machine offers the process: usable CPUs and memory. A leaf module (it imports
nothing from snapcache), so the store and the runtime both size themselves from it without the
store importing the runtime.

>>> available_cpus() >= 1 and memory_budget() >= 32 << 20
True
"""

from __future__ import annotations

import math
import os


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
