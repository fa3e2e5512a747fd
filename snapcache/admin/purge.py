"""Reclaim space: delete snapshots by age, by a size budget, abandoned writes, or by id.

Safety rules (see docs/cli.md):

- A snapshot with a live read or write lease is never deleted unless ``force=True``. Leases are
  checked when the plan is made and again just before each deletion.
- ``manifest.json`` is deleted first, then the rest of the folder, so an interrupted purge never
  leaves something that reads as a valid snapshot. If a lease appears right after the manifest
  went, the manifest is put back and the snapshot kept.
- A reader that opened the snapshot before it was deleted either finishes from the shards it
  already has open (local disk keeps deleted files readable while they are mapped) or fails
  with :class:`~snapcache.errors.CorruptSnapshotError` naming the missing shard; it never
  yields wrong data, because every shard is checked against the manifest before use.
- Committed snapshots that stay lose their leftover bookkeeping (progress records, stream
  markers, shards no manifest lists, expired leases) as ``docs/format.md`` describes.
- Nothing outside the root is ever deleted: a snapshot folder that is a symbolic link is
  reported with its target and only the link is removed (its bytes are not counted as freed);
  a linked snapshot's files are never tidied.
- Nothing but snapcache's is ever deleted: only folders named by a fingerprint and holding a
  file snapcache writes are snapshot folders (:mod:`~snapcache.admin.inventory`), one that
  also holds any other file is kept with those files named (checked again just before it
  would go), and tidying removes only files snapcache writes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

from snapcache.admin.inventory import SnapshotInfo, find_all, locate, not_a_root, scan
from snapcache.store import layout
from snapcache.store.protocol import versions
from snapcache.store.fs import Storage
from snapcache.store.protocol import LeaseInfo, live_leases, withdraw_manifest
from snapcache.store.options import CoordinationOptions
from snapcache.units import format_age, format_names, format_size, parse_duration, parse_size


@dataclass(frozen=True)
class PurgeItem:
    """A snapshot purge selected, and why it was (or would be) deleted, or kept."""

    snapshot: SnapshotInfo
    reason: str


@dataclass(frozen=True)
class OldVersions:
    """The old versions of one delta snapshot that ``purge(old_versions=True)`` removed (on a
    dry run: would remove), and the files that went with them: their manifests and records,
    and the shards no remaining version lists."""

    snapshot: SnapshotInfo
    versions: tuple[int, ...]          # the version numbers removed, oldest first
    newest: int                        # the version that stays
    files: tuple[str, ...]             # names inside the snapshot folder
    bytes: int


@dataclass(frozen=True)
class PurgeReport:
    """What ``purge`` deleted (on a dry run: would delete) and what it kept."""

    root: str
    dry_run: bool
    deleted: tuple[PurgeItem, ...]
    kept: tuple[PurgeItem, ...]        # selected, but in use (or failed to delete): reason says
    tidied: tuple[str, ...]            # "<id>/<file>" removed from snapshots that stay:
                                       # leftovers, and the files of old_versions
    tidied_bytes: int
    size_before: int                   # every snapshot folder in the root
    max_size: int | None = None
    aborted_uploads: tuple[str, ...] = ()   # S3: abandoned multipart uploads, "<key> (...)"
    old_versions: tuple[OldVersions, ...] = ()  # delta snapshots' versions removed

    @property
    def freed_bytes(self) -> int:
        return sum(item.snapshot.size_bytes for item in self.deleted) + self.tidied_bytes

    @property
    def size_after(self) -> int:
        return self.size_before - self.freed_bytes

    @property
    def budget_met(self) -> bool | None:
        return None if self.max_size is None else self.size_after <= self.max_size


def purge(root: str | os.PathLike | None = None, *, ids: Iterable[str] = (),
          older_than: str | float | timedelta | None = None, max_size: str | int | None = None,
          incomplete: bool = False, old_versions: bool = False, dry_run: bool = False,
          force: bool = False, storage_options: dict | None = None,
          lease_ttl: float | str | timedelta | None = None, plan: PurgeReport | None = None
          ) -> PurgeReport:
    """Delete the snapshots selected by any of:

    - ``ids``: unique id prefixes or names;
    - ``older_than``: not used for this long (``"7d"``, seconds or a ``timedelta``);
    - ``max_size``: least recently used first, until the root holds at most this many bytes
      (``"200GB"`` or an int); abandoned writes go before committed snapshots;
    - ``incomplete=True``: abandoned writes (no manifest, no live lease); also removes
      temporary files (``*.tmp``) and, on S3, aborts multipart uploads under the root, that are
      older than ``lease_ttl`` (seconds, a ``timedelta`` or ``"5m"``; default: the default
      lease ttl) in folders without a live lease;
    - ``old_versions=True``: every version but the newest of delta snapshots that stay (a
      shard the newest version still lists stays: shards are reference-counted); skipped
      while the snapshot has a live read or write lease. ``PurgeReport.old_versions`` says
      which versions of which snapshot went, with their files.

    Snapshots with a live lease are kept unless ``force=True``. ``dry_run=True`` deletes nothing
    and reports what would go. One snapshot's own folder given as ``root`` is refused
    (ValueError): purge it by id from its root.

    ``plan``: the report of a dry run of the same selection, to carry out exactly (what a user
    was shown and confirmed): the same selection is made again and only what ``plan`` lists
    goes -- its snapshots that are still selected (their leases checked again), its files,
    uploads and old versions. A planned snapshot no longer selected, and one selected only
    since the plan was made, are kept and reported with why: never more than the plan.

    Example::

        report = snapcache.purge("/tmp/snaps", older_than="7d", dry_run=True)
        print(len(report.deleted), report.freed_bytes)
    """
    age = parse_duration(older_than) if older_than is not None else None
    budget = parse_size(max_size) if max_size is not None else None
    ids = [ids] if isinstance(ids, str) else list(ids)
    if not ids and age is None and budget is None and not incomplete and not old_versions:
        raise ValueError("nothing selected: give snapshot ids, older_than, max_size, "
                         "incomplete=True or old_versions=True")
    storage, own = locate(root, storage_options)
    if own is not None:  # refused: "purge this folder" and "tidy this root" are both guesses
        raise not_a_root(storage, own, "purge it by id from its root "
                                       f"(`snapcache purge {storage.url} {own[:12]}`)")
    wanted = {info.id for info in find_all(storage, ids)}
    snapshots = scan(storage)
    chosen, kept = _select(snapshots, wanted, age, budget, incomplete, force)
    if plan is not None:
        chosen, kept = _within_plan(plan, chosen, kept, snapshots)
    others = [s for s in snapshots if s.state == "committed" and s.link_target is None and
              s.id not in {item.snapshot.id for item in chosen}]
    leftovers = [(s, name, size) for s in others
                 for name, size in _leftovers(s, storage.child(s.id))]
    uploads = []
    if incomplete:
        ttl = (CoordinationOptions() if lease_ttl is None
               else CoordinationOptions(lease_ttl=lease_ttl)).lease_ttl
        gone = {item.snapshot.id for item in chosen}
        seen = {(s.id, name) for s, name, _ in leftovers}
        leftovers += [(s, name, size) for s, name, size in _stale_tmp(snapshots, gone, ttl)
                      if (s.id, name) not in seen]
        uploads = _stale_uploads(storage, snapshots, ttl)
    within: dict[str, OldVersions] | None = None
    if plan is not None:  # what the plan named, and nothing that turned up since
        planned = set(plan.tidied)
        leftovers = [(s, name, size) for s, name, size in leftovers
                     if f"{s.id}/{name}" in planned]
        uploads = [(upload, text) for upload, text in uploads
                   if any(p.startswith(_upload_url(storage, upload)) for p in
                          plan.aborted_uploads)]
        within = {old.snapshot.id: old for old in plan.old_versions}
    dropped = _old_versions(storage, others, force, dry_run, kept, within) \
        if old_versions else []
    versions_gone = []
    for old in dropped:
        sizes = _file_sizes(old.snapshot)
        versions_gone += [(old.snapshot, name, sizes.get(name, 0)) for name in old.files]
    if dry_run:
        leftovers += versions_gone
        return PurgeReport(storage.url, True, tuple(chosen), tuple(kept),
                           tuple(f"{s.id}/{name}" for s, name, _ in leftovers),
                           sum(size for *_, size in leftovers),
                           sum(s.size_bytes for s in snapshots), budget,
                           tuple(text for _, text in uploads), tuple(dropped))
    deleted = []
    for item in chosen:
        why_not = _delete(storage.child(item.snapshot.id), force,
                          linked=item.snapshot.link_target is not None,
                          state=item.snapshot.state)
        if why_not:
            kept.append(PurgeItem(item.snapshot, why_not))
        else:
            deleted.append(item)
    tidied = [f"{snap.id}/{name}" for snap, name, _ in versions_gone]  # already removed
    tidied_bytes = sum(size for *_, size in versions_gone)
    for snap, name, size in leftovers:
        storage.child(snap.id).remove(name)
        tidied.append(f"{snap.id}/{name}")
        tidied_bytes += size
    aborted = []
    for upload, text in uploads:
        storage.abort_upload(upload)
        aborted.append(text)
    return PurgeReport(storage.url, False, tuple(deleted), tuple(kept), tuple(tidied),
                       tidied_bytes, sum(s.size_bytes for s in snapshots), budget,
                       tuple(aborted), tuple(dropped))


def _stale_tmp(snapshots: list[SnapshotInfo], gone: set[str], ttl: float
               ) -> list[tuple[SnapshotInfo, str, int]]:
    """Temporary files older than ``ttl`` in folders that stay and have no live lease (a
    live lease may be writing them)."""
    now = time.time()
    return [(s, f.path, f.size) for s in snapshots
            if s.id not in gone and s.link_target is None and not s.live_leases
            for f in s.files
            if layout.is_tmp(f.path) and "/" not in f.path and f.mtime is not None
            and now - f.mtime > ttl]


def _stale_uploads(storage: Storage, snapshots: list[SnapshotInfo], ttl: float
                   ) -> list[tuple[Any, str]]:
    """Multipart uploads under the root (S3) started more than ``ttl`` ago whose snapshot
    folder has no live write lease: a writer killed mid-upload left them, billed and invisible
    to listings."""
    now = time.time()
    writing = {s.id for s in snapshots if any(l.kind == "write" for l in s.live_leases)}
    found = []
    for upload in storage.incomplete_uploads():
        if upload.path.split("/", 1)[0] in writing or now - upload.initiated <= ttl:
            continue
        found.append((upload, f"{_upload_url(storage, upload)}multipart upload started "
                              f"{format_age(now - upload.initiated)})"))
    return found


def _upload_url(storage: Storage, upload: Any) -> str:
    """How a report names an upload, up to its age: ``"<url> ("``."""
    return f"{storage.url_of(upload.path)} ("


def _select(snapshots: list[SnapshotInfo], wanted: set[str], age: float | None,
            budget: int | None, incomplete: bool, force: bool
            ) -> tuple[list[PurgeItem], list[PurgeItem]]:
    """Which snapshots go (with why), and which were selected but stay because they are in use."""
    now = time.time()
    chosen: list[PurgeItem] = []
    kept: list[PurgeItem] = []

    def take(snap: SnapshotInfo, reason: str) -> None:
        if snap.link_target is None and snap.foreign_files:
            kept.append(PurgeItem(snap, _foreign(snap.foreign_files, snap.state)))
        elif snap.leased and not force:
            kept.append(PurgeItem(snap, f"in use: {describe_leases(snap.live_leases)} "
                                        "(pass --force to delete anyway)"))
        elif snap.link_target is not None:
            chosen.append(PurgeItem(snap, f"{reason}; a symbolic link to {snap.link_target}, "
                                          "outside the root: only the link is removed, the "
                                          "folder it points to is left as it is"))
        else:
            chosen.append(PurgeItem(snap, reason))

    for snap in snapshots:
        used = snap.last_used.timestamp() if snap.last_used else None
        if snap.id in wanted:
            take(snap, "asked for by id")
        elif incomplete and snap.state == "abandoned":
            take(snap, "abandoned write (no manifest, its lease expired)")
        elif age is not None and snap.state != "writing" and used is not None \
                and now - used > age:
            take(snap, f"last used {format_age(now - used)}")
    if budget is not None:
        gone = {item.snapshot.id for item in chosen + kept}
        size = sum(s.size_bytes for s in snapshots) - \
            sum(item.snapshot.size_bytes for item in chosen)
        candidates = sorted((s for s in snapshots if s.id not in gone and s.state != "writing"),
                            key=lambda s: (s.state != "abandoned",
                                           s.last_used.timestamp() if s.last_used else 0.0))
        for snap in candidates:
            if size <= budget:
                break
            before = len(chosen)
            first = "abandoned write" if snap.state == "abandoned" else "least recently used"
            take(snap, f"{first}, over the {format_size(budget)} budget")
            if len(chosen) > before:
                size -= snap.size_bytes
    return chosen, kept


def _within_plan(plan: PurgeReport, chosen: list[PurgeItem], kept: list[PurgeItem],
                 snapshots: list[SnapshotInfo]) -> tuple[list[PurgeItem], list[PurgeItem]]:
    """Of the snapshots selected now, those ``plan`` deletes; the others selected now are kept
    (selected only since the plan was made), and so are the planned ones no longer selected."""
    planned = {item.snapshot.id for item in plan.deleted}
    now = {item.snapshot.id for item in chosen + kept}
    kept = kept + [PurgeItem(item.snapshot, f"not in the plan: {item.reason}, only since it "
                                            "was made; run purge again to delete it")
                   for item in chosen if item.snapshot.id not in planned]
    by_id = {snap.id: snap for snap in snapshots}
    kept += [PurgeItem(by_id[fid], f"no longer selected ({by_id[fid].state} now): not deleted")
             for fid in sorted(planned - now) if fid in by_id]  # (one gone already is gone)
    return [item for item in chosen if item.snapshot.id in planned], kept


def _foreign(names: Sequence[str], state: str) -> str:
    """Why a folder (in ``state``) holding files snapcache does not write is kept."""
    what = "not a snapshot" if state not in ("committed", "corrupt") else "not only a snapshot"
    return (f"{what}, left alone: it holds files snapcache does not write "
            f"({format_names(names)}); move them out of the folder to let purge delete it")


def describe_leases(leases: Iterable[LeaseInfo]) -> str:
    """``"read lease of pid 123 on host-a"``, joined with commas."""
    now = time.time()
    return ", ".join(lease.problem if lease.corrupt else
                     f"{lease.kind} lease of pid {lease.pid} on {lease.host} "
                     f"(heartbeat {max(0, now - lease.heartbeat_at):.0f} s ago)"
                     for lease in leases)


def _delete(folder: Storage, force: bool, linked: bool = False, state: str = "") -> str:
    """Delete one snapshot folder (in ``state``), manifest first; return why it was kept
    instead, or "". A ``linked`` folder (a symbolic link) loses only the link; a folder
    holding a file snapcache does not write is kept."""
    try:
        if not force and (leases := live_leases(folder)):
            return f"in use: {describe_leases(leases)} (a process started using it just now)"
        if linked or folder.link_target() is not None:
            folder.remove_link()
            return ""
        foreign = [f.path for f in folder.walk() if not layout.is_own_file(f.path)]
        if foreign:  # put there since the plan was made
            return _foreign(foreign, state)

        def in_use() -> str:  # a reader that came while the manifest was being withdrawn
            leases = [] if force else live_leases(folder)
            return f"in use: {describe_leases(leases)} (a process started using it just " \
                   "now)" if leases else ""

        busy = withdraw_manifest(folder, in_use)
        if busy:
            return busy
        for version in versions.versions(folder):  # a delta snapshot: its versions first
            folder.remove(versions.manifest_name(version))
        folder.remove("", recursive=True)
    except OSError as e:
        return f"could not delete {folder.url}: {e}"
    return ""


def _old_versions(storage: Storage, snapshots: Iterable[SnapshotInfo], force: bool,
                  dry_run: bool, kept: list[PurgeItem],
                  within: dict[str, OldVersions] | None = None) -> list[OldVersions]:
    """Delta snapshots' old versions (deleted unless ``dry_run``): their manifests first, then
    the files no remaining version refers to. ``within``: only the versions and files a plan
    named, per snapshot id."""
    removed = []
    for snap in snapshots:
        if len(snap.versions) < 2 or (within is not None and snap.id not in within):
            continue
        folder = storage.child(snap.id)
        newer = [str(u.version) for u in snap.unreadable_versions if u.newer]
        if newer:  # not damaged: another release's versions
            kept.append(PurgeItem(snap, f"old versions kept: version {', '.join(newer)} was "
                                        "written by a newer snapcache (upgrade snapcache to "
                                        "purge its old versions)"))
            continue
        if not force and (leases := live_leases(folder)):
            kept.append(PurgeItem(snap, f"old versions kept: in use: {describe_leases(leases)}"))
            continue
        drop, only = snap.versions[:-1], None
        if within is not None:
            drop = tuple(v for v in drop if v in within[snap.id].versions)
            only = set(within[snap.id].files)
            if not drop:
                continue
        names = versions.delete_versions(folder, drop, dry_run=dry_run, only=only)
        sizes = _file_sizes(snap)
        removed.append(OldVersions(snap, tuple(drop), snap.versions[-1],
                                   tuple(names), sum(sizes.get(name, 0) for name in names)))
    return removed


def _file_sizes(snap: SnapshotInfo) -> dict[str, int]:
    """The size of each file of ``snap`` when it was listed."""
    return {f.path: f.size for f in snap.files}


def _leftovers(snap: SnapshotInfo, folder: Storage) -> list[tuple[str, int]]:
    """Files of a committed snapshot that nothing needs: the rule of ``streams.cleanup`` plus
    expired leases."""
    assert snap.manifest is not None
    # A delta snapshot's shards are shared by its versions: a file stays while any version
    # lists it (reference counting), whatever the newest version lists.
    listed = set(snap.referenced) if snap.referenced is not None else \
        layout.with_pages(shard.path for shard in snap.manifest.shards)
    live_runs = {lease.owner for lease in snap.live_leases if lease.kind == "write"}
    live_files = {lease.name for lease in snap.live_leases}
    delta = snap.referenced is not None
    if delta and live_runs:  # a live build of its next version: its records, and what they list
        listed |= versions.held_by(folder, [f.path for f in snap.files], live_runs)
    result = []
    for f in snap.files:
        if f.path in listed or not layout.is_own_file(f.path):
            continue
        owner = versions.owner_of(f.path)
        stale_shard = owner is not None and owner not in live_runs
        # a temporary file may be written right now: only _stale_tmp judges those
        bookkeeping = f.path.startswith(("progress-", "stream-")) and not layout.is_tmp(f.path) \
            and not (delta and owner in live_runs)
        expired_lease = f.path.startswith(("lease-", "reader-")) and f.path.endswith(".json") \
            and f.path not in live_files
        if stale_shard or bookkeeping or expired_lease:
            result.append((f.path, f.size))
    return result

