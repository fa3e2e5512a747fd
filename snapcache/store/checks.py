"""One manifest check per epoch for the processes that read the epoch together on this node.

A held pipeline checks its snapshot's manifest once per epoch (one HEAD on S3, see
:meth:`snapcache.store.fs.Storage.read_parsed`). A torch DataLoader's worker processes each
hold a copy of the pipeline, so each would check: N workers, N requests for the same answer.
Inside :func:`shared_epoch` they share one: the epoch's *token* (the same string in every
process of one epoch of one loader, and never again: see ``adapters/torch.py``) names the
check, and a small node-local record per manifest holds the last check's token, the version
found and the manifest's bytes. Under an exclusive ``flock`` on the record the first process
of the epoch checks and writes it; the others find their token and trust that check for the
epoch, parsing the bytes if they have not parsed that version themselves.

Correctness: the token changes every epoch, so a manifest replaced or withdrawn between epochs
is seen at the next epoch's check, as in a single process; within an epoch every worker reads
the version the epoch's check found, as one process reading the whole epoch would. Records are
a cache of what S3 said: one that cannot be read or written is ignored (the process checks for
itself).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import xxhash

from snapcache.machine import shared_folder

log = logging.getLogger(__name__)

_token: str | None = None
_consulted: tuple[str | None, set[str]] = (None, set())
_consulted_lock = threading.Lock()


@contextlib.contextmanager
def shared_epoch(token: str | None) -> Iterator[None]:
    """Within this block, this process shares manifest checks with the processes of this node
    that use the same ``token`` (None: no sharing). One epoch of one reader per process."""
    global _token
    previous, _token = _token, token
    try:
        yield
    finally:
        _token = previous


@contextlib.contextmanager
def for_children(token: str) -> Iterator[None]:
    """Within this block, this process makes the checks of the epoch ``token`` for the
    processes it forks next to read that epoch (a DataLoader's workers started afresh): they
    find them and make none. This process's own reads after the block are not of that epoch:
    what it consulted in the block is forgotten (a forked child inherits it otherwise, and
    would check for itself)."""
    global _consulted
    try:
        with shared_epoch(token):
            yield
    finally:
        with _consulted_lock:
            _consulted = (None, set())


def current() -> str | None:
    """The token of the epoch this process reads in, if it shares checks."""
    return _token


def directory() -> str:
    return shared_folder("checks")


@dataclass
class Record:
    """The last check of one manifest made on this node."""

    token: str | None = None
    version: tuple | None = None
    data: bytes | None = None


class SharedRecord:
    """The record of the manifest at ``key`` (a URL), locked while in use (:func:`locked`)."""

    def __init__(self, key: str):
        name = xxhash.xxh3_64_hexdigest(key.encode())
        self.key = key
        self.path = os.path.join(directory(), name + ".json")
        self._lock_path = os.path.join(directory(), name + ".lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[Record | None]:
        """The record, read under an exclusive lock held for the block (so one process of an
        epoch checks while the others wait for its answer); None if records cannot be kept
        here (the caller then checks for itself)."""
        try:
            os.makedirs(directory(), mode=0o700, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            log.debug("manifest checks not shared (%s): %s", self._lock_path, e)
            yield None
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self._read()
        finally:
            os.close(fd)  # releases the lock

    def _read(self) -> Record:
        try:
            with open(self.path, "rb") as f:
                head, _, data = f.read().partition(b"\n")
            fields = json.loads(head)
            if fields.get("key") != self.key:
                return Record()
            version = fields.get("version")
            return Record(fields.get("token"), tuple(version) if version is not None else None,
                          data if version is not None else None)
        except (OSError, ValueError):
            return Record()

    def write(self, record: Record) -> None:
        """Replace the record (call inside :meth:`locked`)."""
        head = json.dumps({"key": self.key, "token": record.token,
                           "version": list(record.version) if record.version else None})
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(head.encode() + b"\n" + (record.data or b""))
            os.replace(tmp, self.path)
        except OSError as e:
            log.debug("could not record the manifest check in %s: %s", self.path, e)
            with contextlib.suppress(OSError):
                os.remove(tmp)


def shared_parse(key: str, known: tuple | None, parse: Callable[[bytes], Any],
                 remember: Callable[[tuple, Any, bytes], None],
                 check: Callable[[tuple | None], tuple[Any, tuple | None, bytes]]) -> Any:
    """The parsed manifest at ``key`` (a URL) for this epoch: from the epoch's check if another
    process of the epoch made it, else ``check(known)`` (``known``: what this process knows,
    (version, value or None, bytes), or None), recorded for the others. A process consults
    the record once per epoch and manifest; its later reads in the epoch check for
    themselves (a manifest withdrawn and rebuilt within the epoch is seen)."""
    global _consulted
    token = _token
    with _consulted_lock:
        if _consulted[0] != token:
            _consulted = (token, set())
        first = key not in _consulted[1]
        _consulted[1].add(key)
    if not first:
        return check(known)[0]
    shared = SharedRecord(key)
    with shared.locked() as record:
        if record is None:
            return check(known)[0]
        if record.token == token and record.version is not None:
            if known is not None and known[0] == record.version and known[1] is not None:
                return known[1]
            value = parse(record.data or b"")
            remember(record.version, value, record.data or b"")
            return value
        if known is None and record.version is not None:
            known = (record.version, None, record.data or b"")
        value, version, data = check(known)  # a missing manifest is not shared: it may come
        if version is not None:
            shared.write(Record(token, version, data))
        return value
