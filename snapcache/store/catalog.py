"""What a snapshot root holds: the committed snapshots and the folders that are not (yet)."""

from __future__ import annotations

from dataclasses import dataclass

from snapcache.errors import CorruptSnapshotError
from snapcache.store import layout
from snapcache.store.protocol import versions
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest
from snapcache.store.reader import load_manifest


@dataclass(frozen=True)
class Entry:
    """One snapshot folder in a root."""

    fingerprint: str
    url: str
    manifest: Manifest | None   # None: not committed (being written, or abandoned)
    problem: str = ""           # why the manifest could not be read, if it could not
    versions: tuple[int, ...] = ()
    """A delta snapshot's committed versions (``manifest`` is the newest)."""
    referenced: frozenset[str] | None = None
    """A delta snapshot: every file some version needs (what purge must keep)."""

    @property
    def state(self) -> str:
        if self.problem:
            return "corrupt"
        return "committed" if self.manifest is not None else "incomplete"


def read_entry(folder: Storage, fingerprint: str) -> Entry:
    """One snapshot folder: its manifest, or why it could not be read."""
    try:
        names = folder.listdir()
        if versions.is_lineage(names):
            numbers = tuple(versions.versions(folder, names))
            return Entry(fingerprint, folder.url, versions.newest(folder, names),
                         versions=numbers,
                         referenced=frozenset(versions.referenced(folder, names)))
        return Entry(fingerprint, folder.url, load_manifest(folder))
    except CorruptSnapshotError as e:
        return Entry(fingerprint, folder.url, None, problem=str(e))


def scan(root: Storage) -> list[Entry]:
    """Every snapshot folder directly inside ``root``, sorted by fingerprint."""
    return [read_entry(root.child(name), name) for name in root.listdir()
            if layout.is_fingerprint(name)]
