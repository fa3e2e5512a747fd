"""Leases: which process writes (or reads) a snapshot right now.

A write lease claims one *stream* of a snapshot folder (a single writer is stream 0 of 1). It is
a small JSON file ``lease-<streams>-<stream>-<generation>.json`` created exclusively (see
:meth:`Storage.create_exclusive`), so of several processes creating the same generation exactly
one wins; the generation is the lease's fencing token: whoever takes a stream over creates the
next one, and a writer commits only while its own generation is the stream's newest and its
file is still there (:meth:`WriteLease.check`). The holder rewrites the file every ``ttl / 4``
seconds (its heartbeat), counting its beats.

Liveness never trusts another machine's clock or pid. A writer deciding whether to take over
judges a lease expired when its content has not changed for ``ttl`` seconds of the observer's
own monotonic clock, or when its holder is provably a dead process of this machine (the same
host, pid namespace and boot). A one-shot observer (``ls``, ``purge``) that has not watched it
uses the file's modification time, set by the storage, not by the holder, and compares it with
the storage's clock (:func:`storage_now`), not its own. A lease file that
cannot be parsed is a *corrupt lease*: held until it ages out like any other, never an error
for the rest of the root.

A read lease (``reader-<run>.json``) tells ``purge`` that a snapshot is being read; it has the
same heartbeat and expiry, and no exclusivity.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

from snapcache import lifecycle
from snapcache.errors import LeaseLostError
from snapcache.machine import BOOT, HOST, PIDNS, pid_alive
from snapcache.store import layout
from snapcache.store.fs import Storage

log = logging.getLogger(__name__)

DEFAULT_TTL = 30.0
_WRITE_RE = re.compile(r"^lease-(\d{4})-(\d{4})-(\d{6})\.json$")
_READ_RE = re.compile(r"^reader-([0-9a-f]+)\.json$")


@dataclass(frozen=True)
class LeaseInfo:
    kind: str            # "write" or "read"
    owner: str           # the holder's run id
    host: str
    pid: int
    heartbeat_at: float  # seconds since the epoch, holder's clock (shown, never compared)
    ttl: float
    stream: int = 0
    streams: int = 1
    generation: int = 0
    name: str = ""       # file name inside the snapshot folder
    beat: int = 0        # heartbeats so far: the content changes even if clocks stand still
    pidns: str = ""      # the holder's pid namespace and boot: a pid is checked only if both
    boot: str = ""       # match this process's
    problem: str = ""    # why the file could not be parsed (a corrupt lease), else ""
    idle: float = 0.0    # a writer's seconds without writing an example, at its heartbeat

    @property
    def corrupt(self) -> bool:
        return bool(self.problem)

    def provably_dead(self) -> bool:
        """The holder is a process of this very machine and pid namespace, and it is gone."""
        return (not self.corrupt and self.host == HOST and bool(self.pidns) and
                self.pidns == PIDNS and bool(self.boot) and self.boot == BOOT and
                not pid_alive(self.pid))

    def dumps(self) -> bytes:
        doc = asdict(self)
        doc.pop("problem")
        return json.dumps(doc).encode()


_FIELDS = {"kind": str, "owner": str, "host": str, "pid": int, "heartbeat_at": (int, float),
           "ttl": (int, float), "stream": int, "streams": int, "generation": int, "beat": int,
           "pidns": str, "boot": str, "idle": (int, float)}
_REQUIRED = ("kind", "owner", "host", "pid", "heartbeat_at", "ttl")


def parse(data: bytes, name: str) -> LeaseInfo:
    """A lease file's content, as untrusted input: a wrong type, a missing field or garbage
    gives a corrupt lease (``problem`` says what), never an exception."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        fields = {}
        for key, types in _FIELDS.items():
            if key not in doc:
                if key in _REQUIRED:
                    raise ValueError(f"no {key!r}")
                continue
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, types):
                raise ValueError(f"{key!r} is {value!r}")
            fields[key] = value
        if not (fields["ttl"] > 0 and fields["ttl"] < 1e9):
            raise ValueError(f"'ttl' is {fields['ttl']!r}")
        return LeaseInfo(**fields, name=name)
    except (ValueError, TypeError, RecursionError) as e:
        kind = "read" if name.startswith("reader-") else "write"
        return LeaseInfo(kind, "?", "?", -1, 0.0, DEFAULT_TTL, name=name,
                         problem=f"corrupt lease {name}: {e}")


def _load(storage: Storage, name: str) -> LeaseInfo | None:
    try:
        data = storage.read_bytes(name)
    except FileNotFoundError:
        return None
    except OSError as e:
        kind = "read" if name.startswith("reader-") else "write"
        return LeaseInfo(kind, "?", "?", -1, 0.0, DEFAULT_TTL, name=name,
                         problem=f"unreadable lease {name}: {e}")
    info = parse(data, name)
    _observe(storage, info, data)
    return info


# -- liveness by the observer's own clock -------------------------------------------------------
_seen: dict[tuple[str, str], tuple[bytes, float]] = {}   # (folder, file) -> (content, since)
_seen_lock = threading.Lock()


def _observe(storage: Storage, info: LeaseInfo, data: bytes) -> None:
    key = (storage.url, info.name)
    with _seen_lock:
        if key not in _seen or _seen[key][0] != data:
            _seen[key] = (data, time.monotonic())


def unchanged_for(storage: Storage, info: LeaseInfo) -> float | None:
    """Seconds (this process's monotonic clock) since the lease's content last changed, as
    far as this process has watched it; None if it never read it."""
    with _seen_lock:
        seen = _seen.get((storage.url, info.name))
    return None if seen is None else time.monotonic() - seen[1]


def expired(storage: Storage, info: LeaseInfo, *, one_shot: bool = False) -> bool:
    """Is ``info`` (read from ``storage``) dead? See the module docstring. ``one_shot``:
    an observer that will not look again (``ls``, ``purge``) also accepts the file's
    modification time, which the storage sets, as the time of the last heartbeat."""
    if info.provably_dead():
        return True
    watched = unchanged_for(storage, info)
    if watched is not None and watched > info.ttl:
        return True
    if one_shot:
        modified = storage.modified(info.name)
        # By this machine's clock first: a lease that looks alive is kept either way.
        return modified is not None and time.time() - modified > info.ttl and \
            storage_now(storage) - modified > info.ttl
    return False


CLOCK_CHECK_INTERVAL = 300.0
"""Seconds (monotonic) a measured offset between a storage's clock and this machine's is used."""
CLOCK_SKEW_WARNING = 5.0
_offsets: dict[str, tuple[float, float]] = {}   # root url -> (storage - local seconds, when)
_offsets_lock = threading.Lock()


def storage_now(storage: Storage) -> float:
    """The time now by the clock that sets modification times in ``storage`` (an object
    store's, an NFS server's): the modification time of a probe file written now, as an
    offset from this machine's clock measured once per root every
    :data:`CLOCK_CHECK_INTERVAL`. A machine whose clock runs ahead of the storage's would
    otherwise take every live lease for expired. This machine's clock if the probe cannot be
    written (a read-only root: nothing is deleted from it then)."""
    root = storage.url.rsplit("/", 1)[0]
    with _offsets_lock:
        known = _offsets.get(root)
    if known is None or time.monotonic() - known[1] > CLOCK_CHECK_INTERVAL:
        probe = layout.tmp_name("clock")
        try:
            before = time.time()
            storage.write_atomic(probe, b"", make_folders=False, durable=False)
            after = time.time()
            modified = storage.modified(probe)
            storage.remove(probe)
        except OSError as e:
            log.debug("cannot measure the clock of %s (%s): using this machine's", root, e)
            return time.time()
        if modified is None:
            return time.time()
        # The storage stamped the probe between before and after (by our clock); a stamp
        # outside that window is the clocks' offset.
        offset = 0.0 if before - 1.0 <= modified <= after + 1.0 else modified - (before + after) / 2
        if abs(offset) > CLOCK_SKEW_WARNING:
            log.warning("the clock of %s differs from this machine's by %+.0f s: leases there "
                        "are judged by the storage's clock; check this machine's time "
                        "synchronisation (NTP)", root, offset)
        known = (offset, time.monotonic())
        with _offsets_lock:
            _offsets[root] = known
    return time.time() + known[0]


def write_leases(storage: Storage, names: list[str] | None = None) -> list[LeaseInfo]:
    """Every write lease file in a snapshot folder (expired and corrupt ones included);
    ``names``: the folder's listing if the caller has just made one (saves a LIST on S3)."""
    leases = []
    for name in storage.listdir() if names is None else names:
        match = _WRITE_RE.match(name)
        if match:
            info = _load(storage, name)
            if info is not None:
                streams, stream, generation = map(int, match.groups())
                leases.append(replace(info, streams=streams, stream=stream,
                                      generation=generation))
    return leases


def read_leases(storage: Storage, names: list[str] | None = None) -> list[LeaseInfo]:
    return [info for name in (storage.listdir() if names is None else names)
            if _READ_RE.match(name) for info in [_load(storage, name)] if info is not None]


def live_leases(storage: Storage, names: list[str] | None = None) -> list[LeaseInfo]:
    """The write and read leases of a snapshot folder that are not expired, judged once (see
    :func:`expired` with ``one_shot``): what ``ls`` shows and ``purge`` respects. ``names``:
    the folder's listing if the caller has just made one (one LIST for both kinds)."""
    names = storage.listdir() if names is None else names
    return [lease for lease in write_leases(storage, names) + read_leases(storage, names)
            if not expired(storage, lease, one_shot=True)]


def _heartbeat(storage: Storage, info: LeaseInfo) -> LeaseInfo:
    """Rewrite a lease file with a fresh heartbeat; return what was written. Never recreates
    the snapshot folder: if purge removed it, the next check finds the lease gone."""
    info = replace(info, heartbeat_at=time.time(), beat=info.beat + 1)
    storage.write_atomic(info.name, info.dumps(), make_folders=False,
                         durable=info.kind != "read")
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


# The write leases this process holds, by (pid, run id) so a forked child inherits none.
_held_here: dict[tuple[int, str], "WriteLease"] = {}


def held_here(lease: LeaseInfo) -> bool:
    """Is ``lease`` held by this very process?"""
    return _holder_here(lease) is not None


def _holder_here(lease: LeaseInfo) -> "WriteLease | None":
    return _held_here.get((os.getpid(), lease.owner))


def stalled(lease: LeaseInfo, ttl: float) -> bool:
    """True if waiting for ``lease``'s writer could never end. Held by this very process: it
    was taken by the calling thread (an unfinished iterator of this thread), or its writer has
    not written for ``ttl`` seconds (an iterator left unadvanced); another thread of this
    process that is writing is waited for like any other writer. Held by another process:
    its heartbeat says it has not written for ``ttl`` seconds, by its own clock (an iteration
    left unadvanced there: the workers of a DataLoader whose loop stopped but which is still
    referenced live on, holding their streams)."""
    holder = _holder_here(lease)
    if holder is None:
        return not lease.corrupt and lease.idle > ttl
    return holder.thread == threading.get_ident() or \
        time.monotonic() - holder.active_at > ttl


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
        self.lost: str | None = None   # why this process no longer holds it, once it does not
        self.thread = threading.get_ident()
        self.active_at = time.monotonic()
        _held_here[(os.getpid(), info.owner)] = self
        self._heartbeat = _Heartbeat(self.renew, max(0.05, info.ttl / 4), "snapcache-lease")

    @classmethod
    def acquire(cls, storage: Storage, *, run_id: str, stream: int = 0, streams: int = 1,
                ttl: float = DEFAULT_TTL, names: list[str] | None = None
                ) -> "WriteLease | None":
        """Take the lease if no live process holds it (or any stream of another layout).
        A corrupt lease file counts as held until it has not changed for ``ttl``. ``names``:
        the folder's listing if the caller has just made one (a snapshot in time either way:
        the exclusive create of the next generation is what decides)."""
        current = 0
        replaced = []
        for lease in write_leases(storage, names):
            judged = replace(lease, ttl=ttl) if lease.corrupt else lease
            if expired(storage, judged):
                if (lease.streams, lease.stream) == (streams, stream):
                    current = max(current, lease.generation)
                    replaced.append(lease.name)
                continue
            if (lease.streams, lease.stream) == (streams, stream) or lease.streams != streams:
                return None
        generation = current + 1
        info = LeaseInfo("write", run_id, HOST, os.getpid(), time.time(), ttl, stream, streams,
                         generation, name=f"lease-{streams:04d}-{stream:04d}-{generation:06d}.json",
                         pidns=PIDNS, boot=BOOT)
        if not storage.create_exclusive(info.name, info.dumps()):
            return None
        for name in replaced:  # the expired generations we replaced
            storage.remove(name)
        log.debug("acquired %s", storage.url_of(info.name))
        return cls(storage, info)

    def check(self, names: list[str] | None = None) -> None:
        """The fence: raise LeaseLostError unless this lease is still the stream's newest
        generation and its file is still ours (not taken over, not purged). ``names``: the
        folder's listing if the caller has just made one."""
        if self.lost is not None:
            raise LeaseLostError(self.lost)
        mine = None
        for lease in write_leases(self.storage, names):
            if (lease.streams, lease.stream) != (self.info.streams, self.info.stream):
                continue
            if lease.generation > self.info.generation:
                when = datetime.fromtimestamp(lease.heartbeat_at, timezone.utc) \
                    .isoformat(timespec="seconds") if not lease.corrupt else "an unknown time"
                holder = f"{lease.host} pid {lease.pid}" if not lease.corrupt else "a writer"
                self._lose(f"snapshot {self._id}: taken over by {holder} at {when} "
                           f"(generation {lease.generation}; this writer held generation "
                           f"{self.info.generation} and stopped heart-beating for longer than "
                           f"{self.info.ttl:g} s): it commits nothing")
            if lease.name == self.info.name:
                mine = lease
        if (mine is None or mine.owner != self.info.owner) and \
                self.storage.is_file("manifest.json"):
            self._lose(f"snapshot {self._id}: taken over by another writer, which has committed "
                       f"it (this writer held generation {self.info.generation} and stopped "
                       f"heart-beating for longer than {self.info.ttl:g} s): it commits nothing")
        if mine is None or mine.owner != self.info.owner:
            self._lose(f"snapshot {self._id}: this writer's lease {self.info.name} is gone "
                       "(the snapshot folder was purged or the lease removed while this "
                       "process was not heart-beating): it commits nothing")

    @property
    def _id(self) -> str:
        return self.storage.url.rstrip("/").rsplit("/", 1)[-1][:12]

    def _lose(self, why: str) -> None:
        self.lost = why
        raise LeaseLostError(why)

    def touch(self) -> None:
        """The writer made progress (see :func:`stalled`)."""
        self.active_at = time.monotonic()

    def renew(self) -> None:
        self.check()
        idle = round(time.monotonic() - self.active_at, 1)
        self.info = _heartbeat(self.storage, replace(self.info, idle=idle))

    def release(self) -> None:
        self._heartbeat.stop()
        _held_here.pop((os.getpid(), self.info.owner), None)
        if self.lost is None:
            self.storage.remove(self.info.name)
            return
        # Lost: the file of this generation is ours alone (generations are created exclusively),
        # so one a heartbeat rewrote while resuming from a stop is ours to remove; it would
        # otherwise lie in the folder until purge judged it expired.
        mine = _load(self.storage, self.info.name)
        if mine is not None and mine.owner == self.info.owner:
            self.storage.remove(self.info.name)


class ReadLease:
    """Tells ``purge`` that this process is reading a snapshot. Not exclusive."""

    def __init__(self, storage: Storage, *, run_id: str, ttl: float = DEFAULT_TTL):
        self.storage = storage
        self.info = LeaseInfo("read", run_id, HOST, os.getpid(), time.time(), ttl,
                              name=f"reader-{run_id}.json", pidns=PIDNS, boot=BOOT)
        # Not fsynced: a read lease means nothing once its process is gone, and a file torn
        # by a power loss is a corrupt lease that ages out; an fsync (2-40 ms on a busy disk)
        # would delay every fresh process's first batch.
        storage.write_atomic(self.info.name, self.info.dumps(), durable=False)
        self.gone = False  # removed under us (purge --force): never written again
        self._heartbeat = _Heartbeat(self.renew, max(0.05, ttl / 4), "snapcache-read-lease")

    def renew(self) -> None:
        if not self.storage.exists(self.info.name):
            self.gone = True
            raise LeaseLostError(f"read lease {self.storage.url_of(self.info.name)} was "
                                 "removed (the snapshot was purged with --force, or its folder "
                                 "deleted)")
        self.info = _heartbeat(self.storage, self.info)

    def release(self) -> None:
        self._heartbeat.stop()
        if not self.gone:
            self.gone = True
            self.storage.remove(self.info.name)
