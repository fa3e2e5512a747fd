"""Re-read every shard of committed snapshots and check it against the manifest."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

from snapcache.admin.inventory import (
    SnapshotInfo, delta_versions, describe, find_all, locate, not_a_root, scan)
import xxhash

from snapcache.errors import CorruptSnapshotError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.indexed_file import page_table, store_page_table
from snapcache.store.manifest import ShardInfo
from snapcache.store.protocol import versions
from snapcache.store.reader import SnapshotReader
from snapcache.store.row_read import load_pages


@dataclass(frozen=True)
class VerifyProgress:
    """Passed to ``verify(progress=...)`` after each shard is checked."""

    snapshot: SnapshotInfo
    shard: str
    bytes_done: int     # over all snapshots being verified
    bytes_total: int


@dataclass(frozen=True)
class SnapshotCheck:
    """The outcome for one snapshot: ``problems`` is empty when every byte checked out.

    ``index_problems``: page checksum files (``<shard>.pages``, docs/format.md "Page
    checksums") missing or damaged beside sound shards. They are an index, not data: the
    snapshot reads back right, but rows read alone go through their whole record batch.
    ``repaired``: those rewritten from their verified shard (``verify(repair_index=True)``)."""

    snapshot: SnapshotInfo
    shards_checked: int
    bytes_checked: int
    problems: tuple[str, ...]
    index_problems: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class VerifyReport:
    root: str
    checks: tuple[SnapshotCheck, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> tuple[SnapshotCheck, ...]:
        return tuple(check for check in self.checks if not check.ok)


def verify(root: str | os.PathLike | None = None, ids: Iterable[str] = (), *,
           progress: Callable[[VerifyProgress], None] | None = None,
           storage_options: dict | None = None, repair_index: bool = False) -> VerifyReport:
    """Check the size, xxh3 checksum, row count and schema of every shard of the snapshots
    ``ids`` (unique id prefixes or names; default: every committed or corrupt snapshot), and
    each sound shard's page checksum file against the shard and the manifest (an index:
    ``SnapshotCheck.index_problems``; ``repair_index=True`` rewrites a missing or damaged one
    from the verified shard, its content pinned by the manifest's ``pages_checksum``). A
    snapshot's own folder given as ``root`` checks that snapshot.

    Example::

        report = snapcache.verify(root="/tmp/snaps")
        for check in report.failed:
            print(check.snapshot.short_id, *check.problems, sep="\\n  ")
    """
    if isinstance(ids, str):
        ids = [ids]
    storage, own = locate(root, storage_options)
    ids = list(ids)
    if own is not None:  # a snapshot's own folder: that snapshot
        if ids:
            raise not_a_root(storage, own, "give the folder alone, or its root and the ids "
                                           f"(`snapcache verify {storage.url} {ids[0]}`)")
        chosen = [describe(storage.child(own), own)]
    elif ids:
        chosen = find_all(storage, ids)
    else:
        chosen = [s for s in scan(storage) if s.state in ("committed", "corrupt")]
    total = sum(versions.shard_bytes(delta_versions(s, storage.storage_options))[0]
                if s.versions else s.manifest.total_bytes
                for s in chosen if s.manifest is not None)
    done, checks = 0, []
    for snap in chosen:
        if snap.manifest is None:
            why = snap.problem or f"snapshot {snap.short_id} is {snap.state}, not committed: " \
                                  "there is nothing to verify yet"
            checks.append(SnapshotCheck(snap, 0, 0, (why,)))
            continue
        # A delta snapshot: the shards of every version, each checked once against the
        # manifest of the newest version listing it.
        manifests = delta_versions(snap, storage.storage_options)[::-1] or [snap.manifest]
        seen: set[str] = set()
        pairs = [(m, shard) for m in manifests for shard in m.shards
                 if not (shard.path in seen or seen.add(shard.path))]
        readers = {id(m): SnapshotReader(storage.child(snap.id), m, verify=True)
                   for m in manifests}
        problems, index_problems, repaired, checked = [], [], [], 0
        for manifest, shard in pairs:
            reader = readers[id(manifest)]
            try:
                reader.check_shard(shard)
                problem = _check_pages(reader.storage, shard, repair_index)
            except CorruptSnapshotError as e:
                problems.append(str(e))
            except OSError as e:  # unreadable (permissions, network): not proven sound
                problems.append(f"snapshot {snap.short_id} shard {shard.path!r} cannot be "
                                f"read: {e}")
            else:
                if problem is not None:
                    (repaired if repair_index else index_problems).append(
                        f"shard {shard.path!r}: {problem}")
            checked += shard.bytes
            done += shard.bytes
            if progress is not None:
                progress(VerifyProgress(snap, shard.path, done, total))
        checks.append(SnapshotCheck(snap, len(pairs), checked, tuple(problems),
                                    tuple(index_problems), tuple(repaired)))
    return VerifyReport(storage.url, tuple(checks))


def _check_pages(storage: Storage, shard: ShardInfo, repair: bool) -> str | None:
    """What is wrong with the page checksum file of ``shard`` (just verified sound), or None;
    with ``repair``, a missing or damaged one is rewritten from the shard first."""
    if shard.pages_checksum is None or not storage.local:
        return None
    path = storage.full(shard.path)
    if load_pages(path, shard) is not None:
        return None
    data, mapped = storage.map_file(shard.path, shard.bytes)
    try:
        table = page_table(data, shard.page_size)
    finally:
        del data
        if mapped is not None:
            mapped.close()
    if xxhash.xxh3_64(table).hexdigest() != shard.pages_checksum:
        # The shard matched its checksum, so the manifest's page entry is what disagrees.
        raise CorruptSnapshotError(
            f"shard {shard.path!r}: its pages do not match the manifest's pages_checksum "
            f"{shard.pages_checksum} although the shard matches its checksum: the manifest "
            "is inconsistent; purge the snapshot and the next run rebuilds it")
    missing = not os.path.exists(layout.pages_name(path))
    what = "page checksum file missing" if missing else "page checksum file damaged"
    if repair:
        store_page_table(storage, shard.path, table)
        return f"{what}: rewritten from the verified shard"
    return (f"{what} (the data is sound; rows read alone read their whole record batch): "
            "`snapcache verify --repair-index` rewrites it from the verified shard")
