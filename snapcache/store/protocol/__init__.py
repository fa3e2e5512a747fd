"""The snapshot protocol: the only code that writes leases, progress records, stream markers,
the manifest and the last-use record of a snapshot folder.

Every writer goes through it: the local writer (:mod:`snapcache.store.writer`), cooperating
streams of DataLoader workers and ranks (:mod:`snapcache.pipeline.snapshot_exec`), the Ray
build (through :class:`snapcache.Snapshot`), and ``purge`` when it withdraws a manifest.

The files of one snapshot folder, and who writes them::

    lease-<n>-<i>-<gen>.json     write lease of stream i of n, generation gen   (lease.py)
    reader-<run>.json            read lease, held while a pipeline can read      (reads.py)
    progress-<n>-<i>-<run>.json  shards run `run` finished for stream i          (records.py)
    stream-<n>-<i>.json          stream i complete (exclusive create, fenced)    (records.py)
    manifest.json                the commit (exclusive create, fenced)           (records.py)
    last-used.json               when a reader last opened it                    (this module)

A delta snapshot's lineage folder adds versioned manifests, their source records and segment
records (versions.py): ``manifest-<v>.json`` created exclusively, fenced by the build lease.

How it holds together (see ``docs/architecture.md`` for the guarantees):

- :func:`negotiate` decides per stream: read, write, replay or compute (negotiate.py).
- A writer holds a :class:`WriteLease` whose generation is a fencing token; before a stream
  marker or the manifest is written, :func:`fence` re-checks that the writer still holds the
  newest generation and that every shard it lists exists with its recorded size.
- Liveness is judged by the observer's own clock (a heartbeat unchanged for ``ttl``), or by a
  pid check only on the same host, pid namespace and boot; an observer that looks once (ls,
  purge) compares a lease file's modification time with the storage's clock.
- Whoever completes the last stream commits: :func:`try_commit` creates the manifest
  exclusively from all markers; exactly one commit however many finish at once.
"""

from __future__ import annotations

import json

from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest, load_manifest, now_iso
from snapcache.store.protocol.lease import (
    BOOT, DEFAULT_TTL, HOST, PIDNS, LeaseInfo, ReadLease, WriteLease, expired, live_leases,
    read_leases, stalled, write_leases)
from snapcache.store.protocol.negotiate import Decision, negotiate, stalled_writers
from snapcache.store.protocol.reads import (
    held_by_parent, held_reads, hold_read, holds_read, release_all)
from snapcache.store.protocol.records import (
    StreamRecord, assemble, best_progress, cleanup, commit_fields, discard, fence, load_markers,
    missing_shards, progress_by_task, stream_shards, try_commit, write_marker, write_progress)

__all__ = [
    "BOOT", "DEFAULT_TTL", "Decision", "HOST", "LeaseInfo", "PIDNS", "ReadLease",
    "StreamRecord", "StreamStatus", "WriteLease", "assemble", "best_progress", "cleanup",
    "commit_fields", "discard", "expired", "fence", "held_by_parent", "held_reads", "hold_read",
    "holds_read", "live_leases", "load_markers", "missing_shards", "negotiate",
    "progress_by_task", "read_leases",
    "record_last_use", "release_all", "stalled", "stalled_writers", "stream_shards",
    "stream_status",
    "try_commit", "withdraw_manifest", "write_leases", "write_marker", "write_progress"]


class StreamStatus:
    """Where a snapshot written by ``streams`` streams stands: ``committed`` (the manifest, or
    None) and ``complete`` (the streams whose marker is there)."""

    __slots__ = ("committed", "complete", "streams")

    def __init__(self, committed: Manifest | None, complete: frozenset[int], streams: int):
        self.committed, self.complete, self.streams = committed, complete, streams

    @property
    def missing(self) -> list[int]:
        return sorted(set(range(self.streams)) - self.complete)


def stream_status(storage: Storage, streams: int) -> StreamStatus:
    manifest = load_manifest(storage)
    complete = frozenset() if manifest is not None else frozenset(load_markers(storage, streams))
    return StreamStatus(manifest, complete, streams)


def record_last_use(storage: Storage) -> None:
    """Record that the snapshot was opened for reading now (``snapcache ls`` shows it). Not
    fsynced: a torn record reads as absent (the commit time is shown instead)."""
    storage.write_atomic(layout.LAST_USED, json.dumps({"at": now_iso()}).encode(),
                         durable=False)


def withdraw_manifest(storage: Storage, in_use, expected: bytes | None = None,
                      name: str = layout.MANIFEST) -> str:
    """Take the commit back before deleting a snapshot: remove the manifest (so no new reader
    opens it), then ask ``in_use()`` again; if a reader came meanwhile, put the manifest back
    exactly as it was and return ``in_use()``'s description. "" once withdrawn (or absent).
    With ``expected`` (the manifest's bytes as the caller read them), a manifest that is not
    that one is left alone: "replaced" is returned (another process committed a new one).
    ``name``: the manifest's file (a delta snapshot's version: ``manifest-<v>.json``)."""
    try:
        manifest = storage.read_bytes(name)
    except FileNotFoundError:
        return ""
    if expected is not None and manifest != expected:
        return "replaced"
    storage.remove(name)
    busy = in_use()
    if busy:
        storage.create_exclusive(name, manifest)
    return busy
