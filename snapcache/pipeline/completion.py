"""The snapshot an ordered epoch reads: its committed reader, or, for an epoch that needs the
global order before the snapshot exists (a seeded shuffle's writing epoch, balanced shares),
completing it first: this stream writes its share without yielding, then waits for every
stream's commit (:func:`build_then_open`)."""

from __future__ import annotations

import logging
import time

from snapcache.errors import LeaseTimeoutError
from snapcache.pipeline import ops, streams
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader

log = logging.getLogger(__name__)


def _storage(snapshot: ops.SnapshotOp) -> Storage:
    from snapcache.pipeline import plan  # plan imports this module's runner table user

    return plan.committed_snapshot(snapshot)[0]


def committed_reader(snapshot: ops.SnapshotOp) -> SnapshotReader | None:
    """A reader of ``snapshot`` if it is committed."""
    from snapcache.pipeline.snapshot_exec import open_reader

    from snapcache.pipeline import plan

    storage, manifest = plan.committed_snapshot(snapshot)
    if manifest is None:
        return None
    return open_reader(storage, manifest, snapshot.options)


def build_then_open(snapshot: ops.SnapshotOp, epoch: int, spec: streams.StreamSpec
                    ) -> SnapshotReader:
    """Complete the snapshot: write this stream's share (yielding nothing), then wait for the
    commit of every stream's share."""
    from snapcache.pipeline import plan

    source = plan.iterate(snapshot, epoch, spec)
    try:
        for _ in source:
            pass
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    timeout = snapshot.options.coordination.wait_timeout
    ttl = snapshot.options.coordination.lease_ttl
    start, delay, warned = time.monotonic(), 0.02, False
    while True:
        reader = committed_reader(snapshot)
        if reader is not None:
            return reader
        if not warned and time.monotonic() - start > ttl:
            warned = _warn_stalled(_storage(snapshot), ttl)
        if timeout is not None and time.monotonic() - start > timeout:
            raise LeaseTimeoutError(
                f"snapshot {_storage(snapshot).url}: this stream wrote its share but the other "
                f"streams did not commit within wait_timeout={timeout}s; are all workers and "
                "ranks iterating the same epoch?")
        time.sleep(delay)
        delay = min(0.5, delay * 2)


def _warn_stalled(storage: Storage, ttl: float) -> bool:
    """Warn (and return True) if writers that have stopped writing hold streams of the
    snapshot this stream waits for: the commit comes only once they go on."""
    from snapcache.store.protocol import stalled_writers

    stuck = stalled_writers(storage, ttl)
    if stuck:
        holders = ", ".join(f"stream {s.stream} of {s.streams} by {s.host} pid {s.pid} (not "
                            f"written for {s.idle:.0f} s)" for s in stuck)
        log.warning("waiting for snapshot %s to be committed, but writers have stopped writing "
                    "it: %s. If such an iteration was left unfinished (a DataLoader still "
                    "referenced after its loop stopped), drop it; wait_timeout bounds the wait",
                    storage.url, holders)
    return bool(stuck)
