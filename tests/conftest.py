"""Shared fixtures."""

from __future__ import annotations

import threading

import pytest


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
