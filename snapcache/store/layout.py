"""Where things live inside a snapshot root. Pure functions, no I/O.

::

    <root>/<fingerprint>/manifest.json          written last, atomically: the commit point
    <root>/<fingerprint>/<run>-<stream>-<seq>.arrow   shard files (Arrow IPC, compressed batches)
    <root>/<fingerprint>/*.tmp                   files being written; never referenced by a manifest
"""

from __future__ import annotations

import re
import secrets

MANIFEST = "manifest.json"
SHARD_SUFFIX = ".arrow"
TMP_SUFFIX = ".tmp"

_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{8,64}$")


def new_run_id() -> str:
    """A random id that keeps concurrent writers' files apart (never part of a fingerprint)."""
    return secrets.token_hex(4)


def shard_name(run_id: str, stream: int, seq: int) -> str:
    return f"{run_id}-{stream:04d}-{seq:06d}{SHARD_SUFFIX}"


def tmp_name(final: str) -> str:
    return final + TMP_SUFFIX


def is_fingerprint(name: str) -> bool:
    """True if a folder name inside a root can be a snapshot folder."""
    return bool(_FINGERPRINT_RE.match(name))


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
