"""What a snapshot root holds: the committed snapshots and the folders that are not (yet).

One set of state words, used by the handle (``Snapshot.state``), ``snapcache ls`` and
``explain``: :data:`STATES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.store import layout
from snapcache.store.protocol import versions
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest, load_manifest
from snapcache.store.protocol import live_leases

STATES = ("committed", "writing", "abandoned", "absent", "corrupt")
"""``committed``: a manifest, readable; ``writing``: no manifest, a live write lease;
``abandoned``: no manifest, no live writer (the next run resumes it); ``absent``: nothing
of snapcache's there (no folder, or one holding none of the files snapcache writes: another's
files are never a snapshot); ``corrupt``: a manifest that cannot be read (``Entry.newer``: by
this release only, a newer one wrote it; it is not damaged)."""


@dataclass(frozen=True)
class Entry:
    """One snapshot folder in a root."""

    fingerprint: str
    url: str
    manifest: Manifest | None   # None: not committed (being written, or abandoned)
    problem: str = ""           # why the manifest could not be read, if it could not
    newer: bool = False         # ... because a newer snapcache wrote it: not damaged (upgrade)
    writing: bool = False       # not committed and a writer holds a live lease
    own_files: bool = True      # the folder holds a file snapcache writes (layout.is_own_file)
    versions: tuple[int, ...] = ()
    """A delta snapshot's committed versions (``manifest`` is the newest)."""
    referenced: frozenset[str] | None = None
    """A delta snapshot: every file some version needs (what purge must keep)."""
    unreadable: tuple[versions.Unreadable, ...] = ()
    """A delta snapshot: its versions that cannot be read (the newest one can)."""

    @property
    def state(self) -> str:
        """One of :data:`STATES`."""
        if self.problem:
            return "corrupt"
        if self.manifest is not None:
            return "committed"
        if self.writing:
            return "writing"
        return "abandoned" if self.own_files else "absent"


def read_entry(folder: Storage, fingerprint: str) -> Entry:
    """One snapshot folder: its manifest, or why it could not be read."""
    try:
        names = folder.listdir()
        if versions.is_lineage(names):
            numbers = tuple(versions.versions(folder, names))
            newest = versions.newest(folder, names)
            needed, unreadable = versions.survey(folder, names)
            return Entry(fingerprint, folder.url, newest, versions=numbers,
                         referenced=frozenset(needed), unreadable=unreadable)
        manifest = load_manifest(folder)
    except CorruptSnapshotError as e:
        return Entry(fingerprint, folder.url, None, problem=str(e))
    except UnknownFormatVersionError as e:  # unreadable here, not damaged: state "corrupt"
        return Entry(fingerprint, folder.url, None, problem=str(e), newer=True)
    return Entry(fingerprint, folder.url, manifest, writing=manifest is None and any(
        lease.kind == "write" for lease in live_leases(folder)),
        own_files=any(map(layout.is_own_file, names)))


def holds_snapshot(folder: Storage) -> bool:
    """Whether a folder named like a snapshot (``layout.is_fingerprint``) is one by its
    contents: it holds a file snapcache writes. A user's folder named in hex is not."""
    return any(map(layout.is_own_file, folder.listdir()))


def scan(root: Storage) -> list[Entry]:
    """Every snapshot folder directly inside ``root``, sorted by fingerprint."""
    return [read_entry(root.child(name), name) for name in root.listdir()
            if layout.is_fingerprint(name)]
