"""Local files written safely: made with their folder, removed quietly, flushed to the disk.

The primitives :class:`snapcache.store.fs.Storage` builds its local writes on (atomic writes,
exclusive creates, output files) and the writer's recorder flushes shards with
(:mod:`snapcache.store.recorder`).
"""

from __future__ import annotations

import os
from typing import IO, Any, Callable


def open_binary(path: str) -> IO[bytes]:
    return open(path, "wb")


def create(path: str, opener: Callable[[str], Any] = open_binary) -> Any:
    """A new local file (``opener(path)``), its folder made first; made again if an
    empty-folder cleanup (:meth:`Storage.remove_if_empty
    <snapcache.store.fs.Storage.remove_if_empty>` in another process) removed it in between."""
    for attempt in range(3):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            return opener(path)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def silent_remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def flush_to_disk(fd: int) -> None:
    """Flush the bytes written to the file open as ``fd`` to the disk (``fdatasync`` where
    there is one): a power loss after this leaves them."""
    getattr(os, "fdatasync", os.fsync)(fd)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
