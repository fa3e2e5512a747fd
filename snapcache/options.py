"""Configuration: frozen, validated dataclasses and the one place environment variables are read.

The store's own options (:class:`WriteOptions`, :class:`ReadOptions`,
:class:`CoordinationOptions`) live in :mod:`snapcache.store.options`, where they are validated;
:class:`SnapshotOptions` composes them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from snapcache.machine import available_cpus
from snapcache.store.options import CoordinationOptions, ReadOptions, WriteOptions

AUTOTUNE = -1
"""Pass as ``num_parallel_calls`` or a buffer size to let snapcache choose from the machine."""



def default_root() -> str:
    """Where snapshots live when ``snapshot()`` gets no path: ``$SNAPCACHE_ROOT``, else the user
    cache folder (``$XDG_CACHE_HOME/snapcache``, default ``~/.cache/snapcache``). Read at call time."""
    root = os.environ.get("SNAPCACHE_ROOT")
    if root:
        return root
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "snapcache")


def default_root_from_environment() -> bool:
    """True if :func:`default_root` is ``$SNAPCACHE_ROOT`` (for messages about it)."""
    return bool(os.environ.get("SNAPCACHE_ROOT"))


def distributed_env() -> tuple[int, int]:
    """``(rank, world_size)`` from ``$RANK``/``$WORLD_SIZE`` (as ``torchrun`` sets them), else
    ``(0, 1)``. Read at call time."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"RANK and WORLD_SIZE must be integers; got RANK="
                         f"{os.environ.get('RANK')!r}, WORLD_SIZE="
                         f"{os.environ.get('WORLD_SIZE')!r}") from None
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK must be in [0, WORLD_SIZE); got RANK={rank}, "
                         f"WORLD_SIZE={world_size}")
    return rank, world_size


def resolve_parallelism(value: int | None, *, what: str) -> int:
    """Turn ``None`` / an int / ``AUTOTUNE`` into a worker count (>= 1)."""
    if value is None:
        return 1
    if value == AUTOTUNE:
        return available_cpus()
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{what} must be a positive int, None or snapcache.AUTOTUNE; got {value!r}")
    return value


def check_parallelism(value: Any, *, what: str) -> None:
    """Validate eagerly, when the pipeline is built."""
    resolve_parallelism(value, what=what)


@dataclass(frozen=True)
class SnapshotOptions:
    """How a snapshot is written, read and shared, and what the pipeline adds: the store's
    :class:`WriteOptions`, :class:`ReadOptions` and :class:`CoordinationOptions` (each
    validated where it is defined, in :mod:`snapcache.store.options`) plus ``key``, ``name``,
    ``progress`` and ``storage_options``. ``Dataset.snapshot(...)`` builds it from keywords.

    Example::

        SnapshotOptions(write=WriteOptions(compression="lz4", shard_size=256 << 20))
    """

    write: WriteOptions = field(default_factory=WriteOptions)
    read: ReadOptions = field(default_factory=ReadOptions)
    coordination: CoordinationOptions = field(default_factory=CoordinationOptions)
    key: str | None = None
    """A user-chosen version that replaces the computed upstream fingerprint."""
    name: str | None = None
    """A human name shown by ``snapcache ls``."""
    progress: Any = field(default=True, compare=False, hash=False)
    """Progress of the writing epoch: True (a bar on a terminal, log lines otherwise), False,
    or a callable receiving :class:`snapcache.runtime.progress.ProgressUpdate` objects."""
    storage_options: dict = field(default_factory=dict, compare=False, hash=False)
    delta: bool | None = None
    """Build a snapshot of files (``from_files``/``from_parquet`` then element-wise ops) by
    file, so that a grown source computes only its new and changed files (a delta snapshot,
    see docs/format.md). ``None`` (the default): whenever the pipeline allows it, unless an
    ordinary snapshot of exactly this pipeline is already committed (made by an earlier
    release); ``True``: always (an error when the pipeline does not allow it); ``False``:
    never."""
    on_corrupt: str = field(default="raise", compare=False)
    """A corrupt snapshot met while reading: ``"raise"`` CorruptSnapshotError, or
    ``"rebuild"`` it and carry on (with a warning)."""

    def __post_init__(self) -> None:
        for name, kind in (("write", WriteOptions), ("read", ReadOptions),
                           ("coordination", CoordinationOptions)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"SnapshotOptions.{name} must be a {kind.__name__}; got "
                                f"{getattr(self, name)!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key.strip()):
            raise ValueError(f"key must be a non-empty string naming your version; got {self.key!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"name must be a string; got {self.name!r}")
        if not isinstance(self.progress, bool) and not callable(self.progress):
            raise TypeError(f"progress must be True, False or a callable; got {self.progress!r}")
        if self.on_corrupt not in ("raise", "rebuild"):
            raise ValueError(f"on_corrupt must be 'raise' or 'rebuild'; got {self.on_corrupt!r}")
        if not isinstance(self.storage_options, dict):
            raise TypeError("storage_options must be a dict of fsspec options")
        if self.delta is not None and not isinstance(self.delta, bool):
            raise TypeError(f"delta must be None (whenever the pipeline allows it), True or "
                            f"False; got {self.delta!r}")

    @classmethod
    def from_keywords(cls, *, key: str | None = None, name: str | None = None,
                      progress: Any = True, storage_options: dict | None = None,
                      delta: bool | None = None, on_corrupt: str = "raise",
                      **keywords: Any) -> "SnapshotOptions":
        """Route ``Dataset.snapshot``'s flat keywords to the part that owns each one."""
        parts: dict[str, dict[str, Any]] = {"write": {}, "read": {}, "coordination": {}}
        for keyword, value in keywords.items():
            owner = _OWNER.get(keyword)
            if owner is None:
                raise TypeError(f"unknown snapshot option {keyword!r}; the options are "
                                f"{', '.join(sorted(_OWNER) + ['delta', 'key', 'name', 'on_corrupt', 'progress', 'storage_options'])}")
            parts[owner][keyword] = value
        return cls(write=WriteOptions(**parts["write"]), read=ReadOptions(**parts["read"]),
                   coordination=CoordinationOptions(**parts["coordination"]), key=key,
                   name=name, progress=progress, storage_options=dict(storage_options or {}),
                   delta=delta, on_corrupt=on_corrupt)


_OWNER = {f.name: part for part, kind in (("write", WriteOptions), ("read", ReadOptions),
                                          ("coordination", CoordinationOptions))
          for f in fields(kind)}
