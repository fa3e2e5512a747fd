"""What a snapshot root holds: the committed snapshots and the folders that are not (yet)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from snapcache.errors import CorruptSnapshotError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest
from snapcache.store.reader import load_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One snapshot folder in a root."""

    fingerprint: str
    url: str
    manifest: Manifest | None   # None: not committed (being written, or abandoned)
    problem: str = ""           # why the manifest could not be read, if it could not

    @property
    def state(self) -> str:
        if self.problem:
            return "corrupt"
        return "committed" if self.manifest is not None else "incomplete"


def scan(root: Storage) -> list[Entry]:
    """Every snapshot folder directly inside ``root``, sorted by fingerprint."""
    entries = []
    for name in root.listdir():
        if not layout.is_fingerprint(name):
            continue
        folder = root.child(name)
        try:
            manifest = load_manifest(folder)
        except CorruptSnapshotError as e:
            entries.append(Entry(name, folder.url, None, problem=str(e)))
            continue
        entries.append(Entry(name, folder.url, manifest))
    return entries


def committed(root: Storage) -> list[Manifest]:
    return [e.manifest for e in scan(root) if e.manifest is not None]
