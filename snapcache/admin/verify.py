"""Re-read every shard of committed snapshots and check it against the manifest."""

from __future__ import annotations

import collections
import os
from concurrent.futures import ThreadPoolExecutor
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
    ``repaired``: those rewritten from their verified shard (``verify(repair_index=True)``).
    ``skipped``: why nothing of it was checked, when nothing could be (it is being written,
    abandoned, or written by a newer snapcache): not a failure, nothing is wrong with it.
    ``advice``: what to do about the problems (the way out for this snapshot), when any."""

    snapshot: SnapshotInfo
    shards_checked: int
    bytes_checked: int
    problems: tuple[str, ...]
    index_problems: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    skipped: str = ""
    advice: str = ""

    @property
    def ok(self) -> bool:
        """No problem found (also when it was ``skipped``: see :attr:`checked`)."""
        return not self.problems

    @property
    def checked(self) -> bool:
        return not self.skipped


@dataclass(frozen=True)
class VerifyReport:
    root: str
    checks: tuple[SnapshotCheck, ...]

    @property
    def ok(self) -> bool:
        """Nothing failed (snapshots that could not be checked are in :attr:`skipped`)."""
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> tuple[SnapshotCheck, ...]:
        return tuple(check for check in self.checks if not check.ok)

    @property
    def skipped(self) -> tuple[SnapshotCheck, ...]:
        return tuple(check for check in self.checks if check.skipped)


def verify(root: str | os.PathLike | None = None, ids: Iterable[str] = (), *,
           progress: Callable[[VerifyProgress], None] | None = None,
           storage_options: dict | None = None, repair_index: bool = False) -> VerifyReport:
    """Check the size, xxh3 checksum, row count and schema of every shard of the snapshots
    ``ids`` (unique id prefixes or names; default: every committed or corrupt snapshot), and
    each sound shard's page checksum file against the shard and the manifest (an index:
    ``SnapshotCheck.index_problems``; ``repair_index=True`` rewrites a missing or damaged one
    from the verified shard, its content pinned by the manifest's ``pages_checksum``). Of a
    delta snapshot, every version: its manifest, its source record (against the manifest's
    ``record_checksum``: the next build of a changed source needs the newest one) and its
    shards. A snapshot that cannot be checked (being written, abandoned, written by a newer
    snapcache) is reported as ``skipped``, not failed. A snapshot's own folder given as
    ``root`` checks that snapshot.

    Example::

        report = snapcache.verify(root="/tmp/snaps")
        for check in report.failed:
            print(check.snapshot.short_id, *check.problems, check.advice, sep="\\n  ")
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
    # A delta snapshot: the versions that can be read (the others are its problems).
    readable = {s.id: delta_versions(s, storage.storage_options)[::-1] or [s.manifest]
                for s in chosen if s.manifest is not None}
    total = sum(versions.shard_bytes(manifests)[0] for manifests in readable.values())
    done, checks = 0, []
    for snap in chosen:
        if snap.manifest is None:
            skipped = _not_checked(snap, storage.url)
            if skipped:
                checks.append(SnapshotCheck(snap, 0, 0, (), skipped=skipped))
            else:  # an unreadable manifest
                checks.append(SnapshotCheck(snap, 0, 0, (snap.problem,),
                                            advice=_advice(snap, storage.url, {"damage"})))
            continue
        # A delta snapshot: the shards of every version, each checked once against the
        # manifest of the newest version listing it.
        manifests = readable[snap.id]
        seen: set[str] = set()
        pairs = [(m, shard) for m in manifests for shard in m.shards
                 if not (shard.path in seen or seen.add(shard.path))]
        readers = {id(m): SnapshotReader(storage.child(snap.id), m, verify=True)
                   for m in manifests}
        problems, index_problems, repaired, checked = [], [], [], 0
        kinds: set[str] = set()

        def check(pair: tuple) -> tuple[str | None, str | None]:
            """(damage, index problem) of one shard."""
            manifest, shard = pair
            reader = readers[id(manifest)]
            try:
                reader.check_shard(shard)
                return None, _check_pages(reader.storage, shard, repair_index)
            except CorruptSnapshotError as e:
                return str(e), None
            except OSError as e:  # unreadable (permissions, network): not proven sound
                return (f"snapshot {snap.short_id} shard {shard.path!r} cannot be read: "
                        f"{e}"), None

        for (manifest, shard), (damage, problem) in zip(pairs, _in_order(check, pairs,
                                                                          storage.local)):
            if damage is not None:
                problems.append(damage)
                kinds.add("damage")
            elif problem is not None:
                (repaired if repair_index else index_problems).append(
                    f"shard {shard.path!r}: {problem}")
            checked += shard.bytes
            done += shard.bytes
            if progress is not None:
                progress(VerifyProgress(snap, shard.path, done, total))
        if snap.versions:
            newest = snap.versions[-1]
            for old in snap.unreadable_versions:  # the newest reads: these are old ones
                problems.append(old.problem)
                kinds.add("newer" if old.newer else "old")
            folder = storage.child(snap.id)
            for manifest in manifests:  # each version's source record
                try:
                    versions.read_units(folder, manifest)
                except CorruptSnapshotError as e:
                    problems.append(str(e))
                    kinds.add("record" if manifest.version == newest else "old")
                except OSError as e:
                    problems.append(f"snapshot {snap.short_id}: the source record of version "
                                    f"{manifest.version} cannot be read: {e}")
                    kinds.add("damage")
        checks.append(SnapshotCheck(snap, len(pairs), checked, tuple(problems),
                                    tuple(index_problems), tuple(repaired),
                                    advice=_advice(snap, storage.url, kinds) if problems
                                    else ""))
    return VerifyReport(storage.url, tuple(checks))


def _not_checked(snap: SnapshotInfo, root: str) -> str:
    """Why a snapshot without a readable manifest cannot be checked, when it is not damaged
    ("" when it is: its manifest is unreadable)."""
    if snap.state == "writing":
        writers = [lease for lease in snap.live_leases if lease.kind == "write"]
        who = ", ".join(f"pid {lease.pid} on {lease.host}" for lease in writers) or \
            "a live writer"
        return (f"being written by {who} (no manifest yet: nothing to verify): wait for its "
                "commit, then verify it")
    if snap.state == "abandoned":
        return ("abandoned by its writer (no manifest and no live lease: nothing to verify): "
                "the next run of its pipeline resumes it; `snapcache purge "
                f"{root} --incomplete` deletes it")
    if snap.newer_format:
        return (f"written by a newer snapcache, so not checked: {snap.problem}. It is not "
                "damaged: purging or rebuilding it would destroy the newer release's snapshot")
    return ""


def _advice(snap: SnapshotInfo, root: str, kinds: set[str]) -> str:
    """The way out of the problems of ``kinds`` found in ``snap``: ``damage`` (a shard or the
    manifest), ``record`` (the newest version's source record), ``old`` (an old version of a
    delta snapshot), ``newer`` (an old version written by a newer snapcache)."""
    whole = f"`snapcache purge {root} {snap.short_id}`"
    ways = []
    if "damage" in kinds:
        ways.append(f"purge it ({whole}) and the next run rebuilds it, or iterate with "
                    "snapshot(..., on_corrupt=\"rebuild\")")
    elif "record" in kinds:
        newest = snap.versions[-1]
        ways.append(f"version {newest} reads back sound, but the next build of a changed "
                    "source needs its source record: run that build with snapshot(..., "
                    f"on_corrupt=\"rebuild\"), which withdraws version {newest} and "
                    f"computes again what only it held, or purge the whole snapshot ({whole})")
    if "old" in kinds:
        ways.append(f"`snapcache purge {root} --old-versions` removes the damaged old versions "
                    f"(the newest, version {snap.versions[-1]}, stays; it also removes the "
                    "old versions of the root's other delta snapshots: add --dry-run to see "
                    "them)")
    if "newer" in kinds:
        ways.append("a version written by a newer snapcache is not damaged: upgrade snapcache "
                    "to read it")
    return "; ".join(ways)


VERIFY_THREADS = 4
"""Shards of a snapshot on remote storage checked at once: each is one download (a whole shard
in memory, so at most this many) and then CPU (hash, decode), which overlap; one at a time,
a snapshot of 64 MB shards on S3 verified at the speed of one connection."""


def _in_order(check: Callable, pairs: list, local: bool) -> Iterable:
    """``check`` of each pair, in order: on remote storage :data:`VERIFY_THREADS` at a time,
    never more than that many ahead of the one being reported (each holds a shard)."""
    if local or len(pairs) < 2:
        yield from map(check, pairs)
        return
    with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="snapcache-verify") as pool:
        pending: collections.deque = collections.deque()
        for pair in pairs:
            pending.append(pool.submit(check, pair))
            if len(pending) >= VERIFY_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


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
