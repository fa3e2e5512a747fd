"""Configuration: frozen, validated dataclasses and the one place environment variables are read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

AUTOTUNE = -1
"""Pass as ``num_parallel_calls`` or a buffer size to let snapcache choose from the machine."""

COMPRESSIONS = ("zstd", "lz4", "none")
ON_BUSY = ("wait", "compute")

_MiB = 1 << 20


def default_root() -> str:
    """Where snapshots live when ``snapshot()`` gets no path: ``$SNAPCACHE_ROOT``, else the user
    cache folder (``$XDG_CACHE_HOME/snapcache``, default ``~/.cache/snapcache``). Read at call time."""
    root = os.environ.get("SNAPCACHE_ROOT")
    if root:
        return root
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "snapcache")


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
        return max(1, os.cpu_count() or 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{what} must be a positive int, None or snapcache.AUTOTUNE; got {value!r}")
    return value


def check_parallelism(value: Any, *, what: str) -> None:
    """Validate eagerly, when the pipeline is built."""
    resolve_parallelism(value, what=what)


@dataclass(frozen=True)
class SnapshotOptions:
    """How a snapshot is written and read.

    Example::

        ds.snapshot("s3://bucket/snaps", compression="lz4", shard_size=256 << 20)
    """

    compression: str = "zstd"
    compression_level: int | None = None
    shard_size: int = 64 * _MiB
    """Target size of one shard file in bytes (a shard closes once it reaches this)."""
    record_batch_size: int = 16 * _MiB
    """Target uncompressed bytes of one Arrow record batch inside a shard. Batches hold a
    power-of-two number of rows within it, so common batch sizes are cut from one record batch
    (zero copy when uncompressed, one decompression when compressed)."""
    verify: bool = True
    """Check every shard's xxh3 checksum before yielding any of its examples."""
    key: str | None = None
    """A user-chosen version that replaces the computed upstream fingerprint."""
    name: str | None = None
    """A human name shown by ``snapcache ls``."""
    on_busy: str = "wait"
    """When another process is writing the snapshot: ``"wait"`` for its commit and then read,
    or ``"compute"`` the examples without writing."""
    wait_timeout: float | None = None
    """Seconds to wait for another writer's commit before LeaseTimeoutError (None: no limit)."""
    lease_ttl: float = 30.0
    """A writer that has not renewed its lease for this long is presumed dead and replaced."""
    prefetch_bytes: int | None = None
    """Bytes a reader holds ahead of the consumer (None: a share of the machine's memory)."""
    progress: Any = field(default=True, compare=False, hash=False)
    """Progress of the writing epoch: True (a bar on a terminal, log lines otherwise), False,
    or a callable receiving :class:`snapcache.runtime.progress.ProgressUpdate` objects."""
    local_cache: str | None = None
    """A local folder keeping copies of remote shards once read (least recently used evicted)."""
    local_cache_limit: int = 50 << 30
    """Bytes the local cache may hold at most."""
    storage_options: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {', '.join(map(repr, COMPRESSIONS))}; "
                f"got {self.compression!r}")
        if self.compression_level is not None and self.compression == "none":
            raise ValueError("compression_level needs compression='zstd' or 'lz4'")
        for name in ("shard_size", "record_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive number of bytes; got {value!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key.strip()):
            raise ValueError(f"key must be a non-empty string naming your version; got {self.key!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"name must be a string; got {self.name!r}")
        if self.on_busy not in ON_BUSY:
            raise ValueError(f"on_busy must be one of {', '.join(map(repr, ON_BUSY))}; "
                             f"got {self.on_busy!r}")
        if self.wait_timeout is not None and not (
                isinstance(self.wait_timeout, (int, float)) and self.wait_timeout >= 0):
            raise ValueError(f"wait_timeout must be None or seconds >= 0; got {self.wait_timeout!r}")
        if not isinstance(self.lease_ttl, (int, float)) or self.lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be a positive number of seconds; got {self.lease_ttl!r}")
        if self.prefetch_bytes is not None and (
                not isinstance(self.prefetch_bytes, int) or isinstance(self.prefetch_bytes, bool)
                or self.prefetch_bytes <= 0):
            raise ValueError(f"prefetch_bytes must be None or a positive number of bytes; "
                             f"got {self.prefetch_bytes!r}")
        if not isinstance(self.progress, bool) and not callable(self.progress):
            raise TypeError(f"progress must be True, False or a callable; got {self.progress!r}")
        if self.local_cache is not None and not isinstance(self.local_cache, (str, os.PathLike)):
            raise ValueError(f"local_cache must be a folder path; got {self.local_cache!r}")
        if not isinstance(self.local_cache_limit, int) or self.local_cache_limit <= 0:
            raise ValueError("local_cache_limit must be a positive number of bytes; got "
                             f"{self.local_cache_limit!r}")
        if not isinstance(self.storage_options, dict):
            raise TypeError("storage_options must be a dict of fsspec options")
