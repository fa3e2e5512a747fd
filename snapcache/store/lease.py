"""Leases: which process writes (or reads) a snapshot right now.

A write lease claims one *stream* of a snapshot folder (a single writer is stream 0 of 1). It is
a small JSON file ``lease-<streams>-<stream>-<generation>.json`` created exclusively (see
:meth:`Storage.create_exclusive`), so of several processes creating the same generation exactly
one wins. The holder rewrites it every ``ttl / 4`` seconds (its heartbeat). A lease whose
heartbeat is older than ``ttl``, or whose holder is a dead process on this very host, is
expired: anyone may then create the next generation and take over.

A read lease (``reader-<run>.json``) tells ``purge`` that a snapshot is being read; it has the
same heartbeat and expiry, and no exclusivity.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace

from snapcache import lifecycle
from snapcache.errors import LeaseLostError
from snapcache.store.fs import Storage

log = logging.getLogger(__name__)

DEFAULT_TTL = 30.0
_WRITE_RE = re.compile(r"^lease-(\d{4})-(\d{4})-(\d{6})\.json$")
_READ_RE = re.compile(r"^reader-([0-9a-f]+)\.json$")
HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class LeaseInfo:
    kind: str            # "write" or "read"
    owner: str           # the holder's run id
    host: str
    pid: int
    heartbeat_at: float  # seconds since the epoch, holder's clock
    ttl: float
    stream: int = 0
    streams: int = 1
    generation: int = 0
    name: str = ""       # file name inside the snapshot folder

    def expired(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if now - self.heartbeat_at > self.ttl:
            return True
        return self.host == HOST and not pid_alive(self.pid)

    def dumps(self) -> bytes:
        return json.dumps(asdict(self)).encode()


def _load(storage: Storage, name: str) -> LeaseInfo | None:
    try:
        doc = json.loads(storage.read_bytes(name))
        doc["name"] = name
        return LeaseInfo(**doc)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, OSError):
        # Unreadable: being written right now, or garbage. Treat it as held until it ages out
        # by its modification time, so a torn write never lets two writers in.
        modified = storage.modified(name) or 0.0
        return LeaseInfo("write", "?", "?", -1, modified, DEFAULT_TTL, name=name)


def write_leases(storage: Storage) -> list[LeaseInfo]:
    """Every write lease file in a snapshot folder (expired ones included)."""
    leases = []
    for name in storage.listdir():
        match = _WRITE_RE.match(name)
        if match:
            info = _load(storage, name)
            if info is not None:
                streams, stream, generation = map(int, match.groups())
                leases.append(replace(info, streams=streams, stream=stream,
                                      generation=generation))
    return leases


def read_leases(storage: Storage) -> list[LeaseInfo]:
    return [info for name in storage.listdir() if _READ_RE.match(name)
            for info in [_load(storage, name)] if info is not None]


def live_leases(storage: Storage) -> list[LeaseInfo]:
    """The unexpired write and read leases of a snapshot folder."""
    now = time.time()
    return [lease for lease in write_leases(storage) + read_leases(storage)
            if not lease.expired(now)]


def _heartbeat(storage: Storage, info: LeaseInfo) -> LeaseInfo:
    """Rewrite a lease file with a fresh heartbeat; return what was written."""
    info = replace(info, heartbeat_at=time.time())
    storage.write_atomic(info.name, info.dumps())
    return info


class _Heartbeat:
    def __init__(self, beat, interval: float, name: str):
        self._beat, self._interval = beat, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._forget = lifecycle.at_exit(self.stop)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat()
            except LeaseLostError as e:
                log.warning("%s", e)
                return
            except Exception as e:  # a transient storage error: try again next beat
                log.warning("lease heartbeat failed: %s", e)

    def stop(self) -> None:
        self._forget()
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


_held_here: set[tuple[int, str]] = set()  # (pid, run id) of the write leases this process holds


def held_by_this_process(lease: LeaseInfo) -> bool:
    """True if ``lease`` is one this very process holds (not a parent's, after a fork)."""
    return (os.getpid(), lease.owner) in _held_here


class WriteLease:
    """This process's claim on stream ``stream`` of ``streams`` of a snapshot folder.

    Example::

        lease = WriteLease.acquire(folder, run_id="ab12cd34")
        if lease is None:
            ...  # someone else is writing: wait or compute without writing
        try:
            ...  # write shards; lease.check() before committing
        finally:
            lease.release()
    """

    def __init__(self, storage: Storage, info: LeaseInfo):
        self.storage, self.info = storage, info
        self.lost = False
        _held_here.add((os.getpid(), info.owner))
        self._heartbeat = _Heartbeat(self.renew, max(0.05, info.ttl / 4), "snapcache-lease")

    @classmethod
    def acquire(cls, storage: Storage, *, run_id: str, stream: int = 0, streams: int = 1,
                ttl: float = DEFAULT_TTL) -> "WriteLease | None":
        """Take the lease if no live process holds it (or any stream of another layout)."""
        now = time.time()
        current = 0
        for lease in write_leases(storage):
            if lease.expired(now):
                if (lease.streams, lease.stream) == (streams, stream):
                    current = max(current, lease.generation)
                continue
            if (lease.streams, lease.stream) == (streams, stream) or lease.streams != streams:
                return None
        generation = current + 1
        info = LeaseInfo("write", run_id, HOST, os.getpid(), time.time(), ttl, stream, streams,
                         generation, name=f"lease-{streams:04d}-{stream:04d}-{generation:06d}.json")
        if not storage.create_exclusive(info.name, info.dumps()):
            return None
        for lease in write_leases(storage):  # the expired generations we replaced
            if (lease.streams, lease.stream) == (streams, stream) and \
                    lease.generation < generation:
                storage.remove(lease.name)
        log.debug("acquired %s", storage.url_of(info.name))
        return cls(storage, info)

    def check(self) -> None:
        """Raise LeaseLostError if a newer generation of this lease exists."""
        for lease in write_leases(self.storage):
            if (lease.streams, lease.stream) == (self.info.streams, self.info.stream) and \
                    lease.generation > self.info.generation:
                self.lost = True
                raise LeaseLostError(
                    f"lease on {self.storage.url} stream {self.info.stream} was taken over by "
                    f"{lease.host} pid {lease.pid} (this process stopped heart-beating for "
                    f"longer than {self.info.ttl:.0f} s)")

    def renew(self) -> None:
        self.check()
        self.info = _heartbeat(self.storage, self.info)

    def release(self) -> None:
        self._heartbeat.stop()
        _held_here.discard((os.getpid(), self.info.owner))
        if not self.lost:
            self.storage.remove(self.info.name)


class ReadLease:
    """Tells ``purge`` that this process is reading a snapshot. Not exclusive."""

    def __init__(self, storage: Storage, *, run_id: str, ttl: float = DEFAULT_TTL):
        self.storage = storage
        self.info = LeaseInfo("read", run_id, HOST, os.getpid(), time.time(), ttl,
                              name=f"reader-{run_id}.json")
        storage.write_atomic(self.info.name, self.info.dumps())
        self._heartbeat = _Heartbeat(self.renew, max(0.05, ttl / 4), "snapcache-read-lease")

    def renew(self) -> None:
        self.info = _heartbeat(self.storage, self.info)

    def release(self) -> None:
        self._heartbeat.stop()
        self.storage.remove(self.info.name)
