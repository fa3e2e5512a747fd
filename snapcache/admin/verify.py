"""Re-read every shard of committed snapshots and check it against the manifest."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

from snapcache.admin.inventory import SnapshotInfo, delta_versions, find_all, open_root, scan
from snapcache.errors import CorruptSnapshotError
from snapcache.store.protocol import versions
from snapcache.store.reader import SnapshotReader


@dataclass(frozen=True)
class VerifyProgress:
    """Passed to ``verify(progress=...)`` after each shard is checked."""

    snapshot: SnapshotInfo
    shard: str
    bytes_done: int     # over all snapshots being verified
    bytes_total: int


@dataclass(frozen=True)
class SnapshotCheck:
    """The outcome for one snapshot: ``problems`` is empty when every byte checked out."""

    snapshot: SnapshotInfo
    shards_checked: int
    bytes_checked: int
    problems: tuple[str, ...]

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
           storage_options: dict | None = None) -> VerifyReport:
    """Check the size, xxh3 checksum, row count and schema of every shard of the snapshots
    ``ids`` (unique id prefixes or names; default: every committed or corrupt snapshot).

    Example::

        report = snapcache.verify(root="/tmp/snaps")
        for check in report.failed:
            print(check.snapshot.short_id, *check.problems, sep="\\n  ")
    """
    if isinstance(ids, str):
        ids = [ids]
    storage = open_root(root, storage_options)
    ids = list(ids)
    if ids:
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
        problems, checked = [], 0
        for manifest, shard in pairs:
            reader = readers[id(manifest)]
            try:
                reader.check_shard(shard)
            except CorruptSnapshotError as e:
                problems.append(str(e))
            except OSError as e:  # unreadable (permissions, network): not proven sound
                problems.append(f"snapshot {snap.short_id} shard {shard.path!r} cannot be "
                                f"read: {e}")
            checked += shard.bytes
            done += shard.bytes
            if progress is not None:
                progress(VerifyProgress(snap, shard.path, done, total))
        checks.append(SnapshotCheck(snap, len(pairs), checked, tuple(problems)))
    return VerifyReport(storage.url, tuple(checks))
