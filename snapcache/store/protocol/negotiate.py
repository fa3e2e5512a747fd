"""Who does what when a pipeline reaches a snapshot: read it, write it, wait, or compute.

:func:`negotiate` loops until it can decide:

- a committed manifest exists -> **read**;
- this process wins the write lease of its stream -> **write** (resuming an earlier run's
  finished shards when the caller can skip examples);
- its stream is complete but others are not -> **replay** the stream's own shards;
- someone else holds it -> ``on_busy="compute"``: **compute** without writing;
  ``on_busy="wait"``: poll until the commit (then read) or until the lease expires (then take
  it over and write), or raise LeaseTimeoutError after ``wait_timeout`` seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from snapcache.errors import LeaseTimeoutError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol.lease import (
    LeaseInfo, WriteLease, held_here, live_leases, stalled)
from snapcache.store.manifest import Manifest, load_manifest
from snapcache.store.protocol.records import (
    StreamRecord, best_progress, load_marker, load_markers, missing_shards)

log = logging.getLogger(__name__)


class Poll:
    """How every waiter of the protocol polls (a stream waiting for a commit, a delta build
    waiting for a version): sleeps growing from 20 ms to 1 s, and a ``timeout`` (None: none)
    measured by this process's own monotonic clock."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.start = time.monotonic()
        self._delay = 0.02

    def check(self, what: str, storage: Storage) -> None:
        """LeaseTimeoutError once ``timeout`` seconds have passed, naming ``what`` was waited
        for and who holds the write leases of ``storage``."""
        if self.timeout is not None and time.monotonic() - self.start > self.timeout:
            raise LeaseTimeoutError(
                f"waited {self.timeout:.0f} s for {what} (being written by {writers(storage)}); "
                "raise wait_timeout, or pass on_busy='compute' to compute without writing")

    def sleep(self) -> None:
        time.sleep(self._delay)
        self._delay = min(self._delay * 1.5, 1.0)


@dataclass
class Decision:
    action: str                          # "read" | "write" | "compute" | "replay"
    manifest: Manifest | None = None     # read
    lease: WriteLease | None = None      # write
    resume: StreamRecord | None = None   # write: an earlier run's finished shards;
                                         # replay: this stream's complete record


def negotiate(storage: Storage, *, run_id: str, stream: int = 0, streams: int = 1,
              on_busy: str = "wait", lease_ttl: float = 30.0,
              wait_timeout: float | None = None) -> Decision:
    poll = Poll(wait_timeout)
    orphaned_since: float | None = None
    confirmed: set[int] = set()  # streams whose marker was read while waiting (see below)
    while True:
        manifest = load_manifest(storage)
        if manifest is not None:
            return Decision("read", manifest=manifest)
        names = storage.listdir()
        mine_done = layout.marker_name(streams, stream) in names
        if mine_done:
            # This stream was completed (by us in an earlier epoch, or by an earlier run) and
            # others are not yet: serve this stream's own shards; no need to wait for them.
            record = load_marker(storage, streams, stream)
            if record is not None and not missing_shards(storage, record.shards):
                return Decision("replay", resume=record)
            if record is not None:
                # Its shards are gone (deleted by hand, or by a writer of an earlier release
                # that took the stream over): under the stream's lease the marker goes, and
                # the stream is written again.
                lease = WriteLease.acquire(storage, run_id=run_id, stream=stream,
                                           streams=streams, ttl=lease_ttl, names=names)
                if lease is not None:
                    log.warning("snapshot %s: stream %d of %d was recorded complete, but "
                                "shards it lists are gone: writing it again", storage.url,
                                stream, streams)
                    storage.remove(layout.marker_name(streams, stream))
                    return Decision("write", lease=lease,
                                    resume=best_progress(storage, stream, streams, names))
        if not mine_done:
            # The listing above serves the lease's and the progress records' look-ups: what
            # decides is the lease's exclusive create; a progress record written after the
            # listing is a zombie writer's, which the fence keeps from committing anyway.
            lease = WriteLease.acquire(storage, run_id=run_id, stream=stream, streams=streams,
                                       ttl=lease_ttl, names=names)
            if lease is not None:
                manifest = load_manifest(storage)  # committed while we were acquiring?
                if manifest is not None:
                    lease.release()
                    return Decision("read", manifest=manifest)
                return Decision("write", lease=lease,
                                resume=best_progress(storage, stream, streams, names))
        if on_busy == "compute":
            return Decision("compute")
        stuck = _stalled(storage, stream, streams, lease_ttl) if not mine_done else None
        if stuck is not None:
            # An unfinished iteration holds it (of this thread, or not advanced for the ttl):
            # waiting for it could wait forever.
            if held_here(stuck):
                log.info("snapshot %s is being written by an unfinished iteration of this "
                         "process: computing without writing", storage.url)
            else:
                log.warning(
                    "snapshot %s: stream %d of %d is held by %s pid %d, which has not written "
                    "for %.0f s (an iteration left unfinished there, such as a DataLoader "
                    "still referenced after its loop stopped): computing without writing. "
                    "Drop or finish that iteration, and a later epoch writes the snapshot",
                    storage.url, stuck.stream, stuck.streams, stuck.host, stuck.pid,
                    stuck.idle)
            return Decision("compute")
        now = time.monotonic()
        if mine_done:
            # Our stream is complete; the others must finish before anyone can read.
            if _pending_without_writer(storage, streams, names, confirmed):
                orphaned_since = orphaned_since or now
                if now - orphaned_since > lease_ttl:
                    missing = sorted(set(range(streams)) - set(load_markers(storage, streams)))
                    raise LeaseTimeoutError(
                        f"snapshot {storage.url}: streams {missing} of {streams} have no live "
                        "writer; run the pipeline again with the same number of streams "
                        "(workers x ranks) to complete them, or use on_busy='compute'")
            else:
                orphaned_since = None
        poll.check(f"snapshot {storage.url} to be committed", storage)
        poll.sleep()


def writers(storage: Storage) -> str:
    """Who holds write leases on ``storage`` ("host-a pid 12, ..." or "nobody")."""
    return ", ".join(f"{lease.host} pid {lease.pid}" for lease in live_leases(storage)
                     if lease.kind == "write") or "nobody"


def stalled_writers(storage: Storage, ttl: float) -> list[LeaseInfo]:
    """The live write leases of ``storage`` whose writers have stalled (:func:`stalled`)."""
    return [lease for lease in live_leases(storage)
            if lease.kind == "write" and stalled(lease, ttl)]


def _stalled(storage: Storage, stream: int, streams: int, ttl: float) -> LeaseInfo | None:
    """The stalled writer's lease that keeps stream ``stream`` of ``streams`` from being
    written, if any."""
    for lease in stalled_writers(storage, ttl):
        if (lease.streams, lease.stream) == (streams, stream) or lease.streams != streams:
            return lease
    return None


def _pending_without_writer(storage: Storage, streams: int, names: list[str],
                            confirmed: set[int]) -> bool:
    """Whether a stream of ``streams`` has neither a readable marker nor a live writer, from
    the folder's listing ``names``. A marker is read only for a stream no live writer holds,
    and once: ``confirmed`` keeps, from poll to poll, the streams whose marker was read (a
    marker removed since then is missing from the listing). It used to read every marker,
    each a full shard list, at every poll."""
    writing = {lease.stream for lease in live_leases(storage, names)
               if lease.kind == "write" and lease.streams == streams}
    present = set(names)
    marked = {i for i in range(streams) if layout.marker_name(streams, i) in present}
    confirmed &= marked
    for i in range(streams):
        if i in writing or i in confirmed:
            continue
        if i not in marked or load_marker(storage, streams, i) is None:
            return True
        confirmed.add(i)
    return False
