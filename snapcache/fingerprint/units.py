"""Source units of delta snapshots: keys, the digest of a unit set, and what changed.

A *unit* is the smallest part of a file source that is computed on its own: a file, or a
Parquet row group. A file's key is the xxh3-128 of its identity (path, size, mtime or ETag,
content hash in strict mode), so a file that is rewritten, touched or renamed gets a new key. A
row group's key is its file's path and the xxh3-128 of its bytes (``row_group`` in its
identity): a rewritten file whose row group holds the same content keeps that unit. The upstream code is not part of a
unit key: units live in a lineage folder that the code fingerprint names, so a change of code
is a different lineage and recomputes everything.

Pure: identities come from the caller (see ``store/source_files.file_identities``).

>>> a = {"path": "a.jpg", "size": 3, "mtime_ns": 1}
>>> unit_key(a) == unit_key(dict(a))
True
>>> d = diff_units({"a.jpg": unit_key(a)}, [("a.jpg", unit_key({**a, "size": 4})),
...                                           ("b.jpg", "ff" * 16)])
>>> (d.added, d.changed, d.removed)
(['b.jpg'], ['a.jpg'], [])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import xxhash

__all__ = ["unit_text", "unit_key", "occurrence_keys", "unit_label", "units_digest", "UnitDiff",
           "diff_units", "describe_delta"]

def unit_text(identity: Mapping[str, Any]) -> str:
    """The canonical text of one file's identity: its path and the identity fields, separated
    by NUL (which no path contains), always the same number of them."""
    get = identity.get
    return (f"{identity['path']}\x00size={_text(get('size'))}\x00mtime_ns="
            f"{_text(get('mtime_ns'))}\x00etag={_text(get('etag'))}\x00xxh3_128="
            f"{_text(get('xxh3_128'))}")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def unit_key(identity: Mapping[str, Any]) -> str:
    """The 32-hex-digit key of one unit, from its identity mapping: a file's whole identity;
    a row group's path and content digest (not its file's size or mtime, nor its index).

    >>> g = {"path": "a.parquet", "row_group": 0, "xxh3_128": "ab" * 16, "mtime_ns": 1}
    >>> unit_key(g) == unit_key({**g, "row_group": 3, "mtime_ns": 2, "file_size": 9})
    True
    """
    if identity.get("row_group") is not None:
        text = f"{identity['path']}\x00row_group\x00xxh3_128={identity['xxh3_128']}"
    else:
        text = unit_text(identity)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def occurrence_keys(keys: Sequence[str]) -> list[str]:
    """``keys`` with each repeat made a unit of its own: a file listed twice (oversampling,
    ``from_files(common + rare + rare)``) is two units whose rows the version holds twice. The
    first of equal keys stays as it is, the n-th repeat gets ``n`` mixed in. Which of equal
    units gets which number does not matter (they compute the same rows): numbered in the order
    given, a version's record and a source agree on how many there are.

    >>> k = occurrence_keys(["aa", "bb", "aa", "aa"])
    >>> k[:2] == ["aa", "bb"] and len(set(k)) == 4
    True
    """
    seen: dict[str, int] = {}
    out = []
    for key in keys:
        n = seen.get(key, 0)
        seen[key] = n + 1
        text = f"{key}\x00occurrence={n}".encode()
        out.append(xxhash.xxh3_128_hexdigest(text) if n else key)
    return out


def unit_label(identity: Mapping[str, Any]) -> str:
    """How ``explain`` names a unit: its path, and ``#<index>`` for a row group."""
    group = identity.get("row_group")
    return identity["path"] if group is None else f"{identity['path']}#{group}"


def units_digest(identities: Sequence[Mapping[str, Any]]) -> str:
    """The digest of a source as its ordered list of file identities: what a version was built
    from. Hashed column by column (paths, sizes, mtimes, ETags, content hashes), so a million
    files take a fraction of a second; any change of any identity or of the order changes it.

    >>> a = [{"path": "a", "size": 1, "mtime_ns": 5}, {"path": "b", "size": 2, "mtime_ns": 6}]
    >>> units_digest(a) == units_digest(a[::-1])
    False
    """
    h = xxhash.xxh3_128(b"snapcache.units\x00")
    h.update(len(identities).to_bytes(8, "little"))
    h.update("\x00".join([str(i["path"]) for i in identities]).encode("utf-8", "surrogatepass"))
    numbers = ("size", "mtime_ns")
    if any(i.get("row_group") is not None for i in identities):  # row groups: their index too
        numbers += ("row_group", "file_size")
    for name in numbers:
        values = [i.get(name) for i in identities]
        h.update(np.array([v is None for v in values], dtype=np.bool_).tobytes())
        h.update(np.array([0 if v is None else v for v in values], dtype=np.int64).tobytes())
    for name in ("etag", "xxh3_128"):
        values = [i.get(name) for i in identities]
        h.update(np.array([v is None for v in values], dtype=np.bool_).tobytes())
        h.update("\x00".join(["" if v is None else str(v) for v in values]).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class UnitDiff:
    """How a source's units differ from those of a committed version (by path)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.changed or self.removed)


def diff_units(old: Mapping[str, str] | Sequence[tuple[str, str]],
               new: Sequence[tuple[str, str]]) -> UnitDiff:
    """``old`` lists (path, unit key) of a committed version (or maps path -> key); ``new``
    lists (path, key) of the current source. A renamed file is one removed and one added (its
    path may matter to the pipeline's code). A path listed more than once is compared copy by
    copy: a copy more is one added, a copy fewer one removed."""
    before: dict[str, list[str]] = {}
    for path, key in (old.items() if isinstance(old, Mapping) else old):
        before.setdefault(path, []).append(key)
    added, changed, kept = [], [], []
    seen: dict[str, int] = {}
    for path, key in new:
        n = seen[path] = seen.get(path, 0) + 1
        keys = before.get(path, ())
        if n > len(keys):
            added.append(path)
        elif key in keys:
            kept.append(path)
        else:
            changed.append(path)
    removed = [path for path, keys in before.items() for _ in range(len(keys) - seen.get(path, 0))]
    return UnitDiff(added, changed, removed, kept)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def describe_delta(diff: UnitDiff, *, computing: int, total: int, reusing: int,
                   reused_share: float, noun: str = "file") -> str:
    """The sentence ``explain`` prints (``noun``: what a unit is, "file" or "row group")::

        source: 3 files added, 1 changed, 2 removed; computing 4 of 1,203 units, reusing 1,199
        (98.1% of examples)
    """
    parts = [f"{_count(len(diff.added), noun)} added" if diff.added else "",
             f"{len(diff.changed):,} changed" if diff.changed else "",
             f"{len(diff.removed):,} removed" if diff.removed else ""]
    what = ", ".join(p for p in parts if p) or f"no {noun} added, changed or removed"
    if not diff.added and (diff.changed or diff.removed):
        first, _, rest = what.partition(" ")
        what = f"{first} {noun if int(first.replace(',', '')) == 1 else noun + 's'} {rest}"
    return (f"source: {what}; computing {computing:,} of {_count(total, 'unit')}, reusing "
            f"{reusing:,} ({reused_share:.1%} of examples)")
