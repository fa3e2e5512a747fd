"""Where things live inside a snapshot root. Pure functions, no I/O.

::

    <root>/<fingerprint>/manifest.json          written last, atomically: the commit point
    <root>/<fingerprint>/<run>-<stream>-<seq>.arrow   shard files (Arrow IPC, compressed batches)
    <root>/<fingerprint>/<run>-<stream>-<seq>.arrow.pages  a raw local shard's page checksums
    <root>/<fingerprint>/<name>.<16 hex>.tmp     a file being written (local disk); never referenced
    <root>/<fingerprint>/lease-<n>-<i>-<gen>.json  write lease of stream i of n (see lease.py)
    <root>/<fingerprint>/reader-<run>.json       read lease of a process reading the snapshot
    <root>/<fingerprint>/progress-<n>-<i>-<run>.json  shards finished so far by one writer run
    <root>/<fingerprint>/progress-<n>-<i>-<run>.<k>.json  ... the k-th next 256 of them
    <root>/<fingerprint>/stream-<n>-<i>.json     stream i of n is complete (its shard list)
    <root>/<fingerprint>/last-used.json          when the snapshot was last read

A delta snapshot's lineage folder also holds ``manifest-<v>.json``, ``units-<v>-<run>.arrow``
and ``segment-<run>-<seq>.json`` (see :mod:`snapcache.store.protocol.versions`).
:func:`is_own_file` recognises every one of these names, and :func:`is_fingerprint` the
folders they live in: nothing else in a root is snapcache's.
"""

from __future__ import annotations

import re
import secrets
from typing import Iterable

MANIFEST = "manifest.json"
LAST_USED = "last-used.json"
SHARD_SUFFIX = ".arrow"
PAGES_SUFFIX = ".pages"
TMP_SUFFIX = ".tmp"

FINGERPRINT_DIGITS = 32
"""A snapshot folder's name: the xxh3-128 hex digest of its pipeline, of its ``key``, or of a
delta snapshot's lineage (``FingerprintNode.digest``), always this many lowercase digits."""
_FINGERPRINT_RE = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_DIGITS}}}$")
_OWN_FILE_RE = re.compile(
    r"^(?:manifest\.json|manifest-\d+\.json|last-used\.json"
    r"|lease-\d+-\d+-\d+\.json|reader-[0-9a-f]+\.json"
    r"|progress-\d+-\d+-[0-9a-f]+(?:\.\d+)?\.json|stream-\d+-\d+\.json"
    r"|segment-[0-9a-f]+-\d+\.json|units-\d+-[0-9a-f]+\.arrow"
    r"|[0-9a-f]+-\d+-\d+\.arrow(?:\.pages)?)"
    r"(?:(?:\.[0-9a-f]{16})?\.tmp)?$")


def new_run_id() -> str:
    """A random id that keeps concurrent writers' files apart (never part of a fingerprint)."""
    return secrets.token_hex(4)


def shard_name(run_id: str, stream: int, seq: int) -> str:
    return f"{run_id}-{stream:04d}-{seq:06d}{SHARD_SUFFIX}"


def pages_name(shard_path: str) -> str:
    """The page checksum file beside a shard (see ``ShardInfo.pages_checksum``): it lives and
    goes with its shard."""
    return shard_path + PAGES_SUFFIX


def with_pages(shard_paths: Iterable[str]) -> set[str]:
    """The names a listed shard keeps alive: itself and its page checksum file (what cleanup
    and purge keep for every shard a manifest lists)."""
    names = set(shard_paths)
    return names | {pages_name(p) for p in names}


def tmp_name(final: str) -> str:
    """The one name pattern of every temporary file snapcache writes: ``<final>.<16 hex>.tmp``
    beside its final name (``final`` may be a path). It is renamed or linked into place when
    complete and deleted on failure; one left behind by a killed process is removed by
    ``purge --incomplete`` once older than the lease ttl (see :func:`is_tmp`)."""
    return f"{final}.{secrets.token_hex(8)}{TMP_SUFFIX}"


def is_tmp(name: str) -> bool:
    """True for a temporary file of any snapcache version (all end in ``.tmp``)."""
    return name.endswith(TMP_SUFFIX)


def is_hex(text: str) -> bool:
    """True if ``text`` is lowercase hex digits only (an id prefix, a checksum digest)."""
    return all(c in "0123456789abcdef" for c in text)


def is_fingerprint(name: str) -> bool:
    """True if a folder name inside a root can be a snapshot folder: a fingerprint of
    :data:`FINGERPRINT_DIGITS` hex digits, the only names snapcache gives them (a user's
    folder named like a date or a short hash is not one)."""
    return bool(_FINGERPRINT_RE.match(name))


def is_snapshot_folder(name: str, entries: Iterable[str]) -> bool:
    """True if a folder called ``name`` holding ``entries`` is one snapshot's folder rather
    than a root (a root holds snapshot folders, not files of its own): its name is a
    fingerprint, and it holds a manifest or a writer's shards."""
    return is_fingerprint(name) and any(
        entry == MANIFEST or run_of(entry) is not None for entry in entries)


def is_own_file(name: str) -> bool:
    """True if ``name`` (a path inside a snapshot folder) is a file snapcache writes there: a
    manifest (or a delta snapshot's version), a shard or its page checksum file, a lease, a
    progress record, a stream marker, the last-use record, a delta build's segment or source
    record, or a temporary file of any of them (``<name>.<16 hex>.tmp``, older releases'
    ``<name>.tmp``). Files in subfolders never are: snapcache makes none. A folder holding any
    other file is someone else's, and ``purge`` never deletes it."""
    return "/" not in name and bool(_OWN_FILE_RE.match(name))


def is_safe_shard_path(path: str) -> bool:
    """A manifest's shard path must name a plain file inside the snapshot folder."""
    return (
        isinstance(path, str)
        and bool(path)
        and "/" not in path
        and "\\" not in path
        and ":" not in path
        and path not in (".", "..")
        and not path.startswith(".")
        and path.endswith(SHARD_SUFFIX)
    )


def progress_name(streams: int, stream: int, run_id: str, part: int = 0) -> str:
    """The file of a writer run's progress record holding its ``part``-th group of shards
    (:data:`snapcache.store.protocol.records.PROGRESS_PART`); part 0 has the name older
    releases wrote and read, a record of its own."""
    stem = f"progress-{streams:04d}-{stream:04d}-{run_id}"
    return f"{stem}.json" if part == 0 else f"{stem}.{part:06d}.json"


_PROGRESS_RE = re.compile(r"^(progress-\d+-\d+-[0-9a-f]+)(?:\.(\d+))?\.json$")


def progress_part(name: str) -> tuple[str, int] | None:
    """``(stem, part)`` of a progress record file's name (None for other names): the files
    of one writer run's record share the stem."""
    match = _PROGRESS_RE.match(name)
    return (match.group(1), int(match.group(2) or 0)) if match else None


def progress_prefix(streams: int, stream: int) -> str:
    return f"progress-{streams:04d}-{stream:04d}-"


def marker_name(streams: int, stream: int) -> str:
    return f"stream-{streams:04d}-{stream:04d}.json"


def marker_prefix(streams: int) -> str:
    return f"stream-{streams:04d}-"


def run_of(name: str) -> str | None:
    """The writer run id a shard, a shard's page checksum file, or a temporary file of
    either belongs to."""
    match = _SHARD_RE.match(name)
    return match.group(1) if match else None


_SHARD_RE = re.compile(r"^([0-9a-f]{8})-\d{4}-\d{6}\.arrow(\.pages)?(\.[0-9a-f]{16})?(\.tmp)?$")
