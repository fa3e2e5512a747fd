"""Read leases held for as long as a pipeline can read a snapshot again.

A training job reads its snapshot once per epoch, and between epochs ``purge`` must still see
it in use: so the first read of a snapshot in a process takes a read lease that stays, renewed
in the background, while any *holder* (the pipeline object that reads it) is alive. It is
released when the last holder is garbage-collected, when :func:`release_all` is called, or at
interpreter exit. Later epochs make no lease requests at all (one PUT per process and snapshot,
not a PUT and a DELETE per epoch).

A lease removed under us (``purge --force``) is not written again: the heartbeat stops, and the
next read takes a new one after checking that the snapshot is still committed.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import uuid
import weakref
from typing import Any

from snapcache import lifecycle
from snapcache.store.fs import Storage
from snapcache.store.protocol.lease import ReadLease

log = logging.getLogger(__name__)

_lock = threading.Lock()
_held: dict[tuple[int, str], "_Held"] = {}
# leases being released: their file is this process's name for the snapshot's lease, so a new
# lease on it is written only once the DELETE of the old one is done
_releasing: dict[tuple[int, str], threading.Event] = {}
RELEASE_WAIT = 60.0
"""Seconds a new read lease waits at most for the release of this process's previous one on the
same snapshot (a storage call, with its own time-outs) before writing it anyway."""
_run_ids: dict[int, str] = {}
_tokens = itertools.count()


def _run_id() -> str:
    """One reader id per process (a forked child gets its own)."""
    pid = os.getpid()
    return _run_ids.setdefault(pid, uuid.uuid4().hex[:16])


class _Held:
    def __init__(self, storage: Storage, ttl: float):
        self.key = (os.getpid(), storage.url)
        self.lease = ReadLease(storage, run_id=_run_id(), ttl=ttl)
        # one token per holder, never reused: an object's id is reused once it is collected, so
        # a holder collected while its drop was pending must not take a new holder's place
        self.holders: set[int] = set()
        self._finalizers: dict[int, weakref.finalize] = {}  # id(holder) -> its finalizer
        self._forget = lifecycle.at_exit(self.release)

    @property
    def alive(self) -> bool:
        return not self.lease.gone

    def add(self, holder: Any) -> None:
        """Count ``holder`` (once, however often it reads) until it is collected."""
        with _lock:
            known = self._finalizers.get(id(holder))
            if known is not None and known.alive and known.peek()[0] is holder:
                return
            token = next(_tokens)
            self.holders.add(token)
            self._finalizers[id(holder)] = weakref.finalize(holder, _drop_later, self, token)

    def drop(self, token: int) -> None:
        with _lock:
            self.holders.discard(token)
            for key in [k for k, f in self._finalizers.items() if not f.alive]:
                del self._finalizers[key]
            if self.holders:
                return
            # in the same critical section as the count: a reader from now on takes a new
            # lease (after this one's DELETE), never this one while it is being released
            done = self._retire()
        self._release(done)

    def release(self) -> None:
        if self.key[0] != os.getpid():
            return  # inherited over fork: the parent's lease, not ours to release
        with _lock:
            done = self._retire()
        self._release(done)

    def _retire(self) -> threading.Event:
        """Under ``_lock``: no reader finds this lease any more; the event is set once it is
        released."""
        if _held.get(self.key) is self:
            del _held[self.key]
        done = _releasing[self.key] = threading.Event()
        return done

    def _release(self, done: threading.Event) -> None:
        try:
            self._forget()
            self.lease.release()
        except Exception as e:  # storage gone (a server stopped): the lease expires by itself
            log.debug("could not release %s: %s",
                      self.lease.storage.url_of(self.lease.info.name), e)
        finally:
            with _lock:
                if _releasing.get(self.key) is done:
                    del _releasing[self.key]
            done.set()


def _drop_later(held: _Held, token: int) -> None:
    """A holder was collected: drop it on a thread of its own (a finalizer may run inside any
    code, even the storage client's event loop, where a storage call would deadlock)."""
    if held.key[0] != os.getpid():
        return
    # joined at exit (nothing to stop: one release request)
    lifecycle.background(lambda: held.drop(token), lambda: None, "snapcache-release-read-lease")


def hold_read(storage: Storage, *, ttl: float, holder: Any) -> bool:
    """Hold a read lease on the snapshot folder ``storage`` while ``holder`` lives. True if this
    call took a new lease (the caller then checks the snapshot is still committed: a purge may
    have removed it between reading its manifest and taking the lease); False if this process
    already held one (no request made)."""
    key = (os.getpid(), storage.url)
    with _lock:
        held = _held.get(key)
        if held is not None and not held.alive:
            del _held[key]
            held = None
        releasing = _releasing.get(key) if held is None else None
    if releasing is not None:  # the last holder was just collected: its lease is going
        releasing.wait(RELEASE_WAIT)
    fresh = held is None
    if fresh:
        held = _Held(storage, ttl)
        with _lock:
            held = _held.setdefault(key, held)
    assert held is not None
    held.add(holder)
    return fresh


def holds_read(storage: Storage) -> bool:
    """Whether a read of ``storage`` now would take no new lease: this process holds a live
    one, or was forked from one that does (:func:`held_by_parent`)."""
    with _lock:
        held = _held.get((os.getpid(), storage.url))
    return (held is not None and held.alive) or held_by_parent(storage)


def held_by_parent(storage: Storage) -> bool:
    """Whether this process was forked from one that held a read lease on ``storage`` (and
    holds it still, while the pipeline it forked us to read lives): a DataLoader worker of a
    loader whose process holds the lease needs none of its own. Its state is inherited by
    ``fork`` only; a process started otherwise takes its own."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return False
    with _lock:
        held = _held.get((parent.pid, storage.url))
    return held is not None and held.alive


def held_reads() -> list[str]:
    """The snapshot folders this process holds read leases on (urls)."""
    pid = os.getpid()
    with _lock:
        return sorted(url for (p, url), held in _held.items() if p == pid and held.alive)


def release_all() -> None:
    """Release every read lease this process holds (tests, and long-lived services that want
    ``purge`` to see a snapshot free without dropping their pipelines)."""
    pid = os.getpid()
    with _lock:
        mine = [held for (p, _), held in _held.items() if p == pid]
    for held in mine:
        held.release()
