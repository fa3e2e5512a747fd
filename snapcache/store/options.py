"""The store's options: what the writer, the reader and the coordination between processes
need, each a small frozen dataclass validated on construction and given to the object that uses
it when it is built (never set on it afterwards).

``snapcache.options.SnapshotOptions`` composes the three with what the pipeline adds (``key``,
``name``, ``progress``, ``storage_options``); ``Dataset.snapshot(...)`` builds it from keywords.
Each option is validated here, once, in the class that owns it.

>>> WriteOptions(compression="lz4").shard_size == 64 << 20
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

COMPRESSIONS = ("auto", "zstd", "lz4", "none")
ON_BUSY = ("wait", "compute")

_MiB = 1 << 20


def _positive_bytes(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive number of bytes; got {value!r}")


FIRST_RECORD_BATCH = 1 * _MiB
"""Target uncompressed bytes of a stream's first record batch (see
:func:`snapcache.store.writer.first_batch_rows`)."""


@dataclass(frozen=True)
class WriteOptions:
    """How the writer lays out a snapshot (:class:`snapcache.store.writer.SnapshotWriter`)."""

    compression: str = "auto"
    """"auto" (the default: each shard gets the codec that reads fastest from where the
    snapshot lives, see :func:`snapcache.store.compression.choose_compression`), "zstd", "lz4", or
    "none" (None means "none" too). Whatever is asked, a shard is stored raw when compressing
    it saves too little."""
    compression_level: int | None = None
    shard_size: int = 64 * _MiB
    """Target size of one shard file in bytes (a shard closes once it reaches this)."""
    record_batch_size: int = 16 * _MiB
    """Target uncompressed bytes of one Arrow record batch inside a shard. Batches hold a
    power-of-two number of rows within it, so common batch sizes are cut from one record batch
    (zero copy when uncompressed, one decompression when compressed)."""
    uploads_in_flight: int = 2
    """Remote snapshots: finished shards uploading in the background at most at once while
    the next is written (each held in memory, or a local temporary file when large, until
    stored)."""

    @property
    def batch_target(self) -> int:
        """Target bytes of one record batch: ``record_batch_size``, and at most a quarter of a
        shard (a shard holds several record batches)."""
        return min(self.record_batch_size, max(1, self.shard_size // 4))

    def __post_init__(self) -> None:
        if self.compression is None:  # as every peer spells "no compression"
            object.__setattr__(self, "compression", "none")
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {', '.join(map(repr, COMPRESSIONS))}; "
                f"got {self.compression!r}")
        if self.compression_level is not None and self.compression in ("none", "auto"):
            raise ValueError("compression_level needs compression='zstd' or 'lz4' (the default "
                             f"{self.compression!r} "
                             + ("picks the codec per shard" if self.compression == "auto"
                                else "compresses nothing") + "): pass one of them with it")
        _positive_bytes(self.shard_size, "shard_size")
        _positive_bytes(self.record_batch_size, "record_batch_size")
        if not isinstance(self.uploads_in_flight, int) or isinstance(self.uploads_in_flight, bool) \
                or self.uploads_in_flight < 1:
            raise ValueError(f"uploads_in_flight must be an int >= 1; got "
                             f"{self.uploads_in_flight!r}")


@dataclass(frozen=True)
class ReadOptions:
    """How a committed snapshot is read (:class:`snapcache.store.reader.SnapshotReader`)."""

    verify: bool = True
    """Check every shard's xxh3 checksum before yielding any of its examples."""
    prefetch_bytes: int | None = None
    """Bytes a reader holds ahead of the consumer (None: a share of the machine's memory)."""
    local_cache: str | None = None
    """A local folder keeping copies of remote shards once read (least recently used evicted)."""
    local_cache_limit: int = 50 << 30
    """Bytes the local cache may hold at most."""

    def __post_init__(self) -> None:
        if self.prefetch_bytes is not None:
            try:
                _positive_bytes(self.prefetch_bytes, "prefetch_bytes")
            except ValueError:
                raise ValueError(f"prefetch_bytes must be None or a positive number of bytes; "
                                 f"got {self.prefetch_bytes!r}") from None
        if self.local_cache is not None and not isinstance(self.local_cache, (str, os.PathLike)):
            raise ValueError(f"local_cache must be a folder path; got {self.local_cache!r}")
        if not isinstance(self.local_cache_limit, int) or self.local_cache_limit <= 0:
            raise ValueError("local_cache_limit must be a positive number of bytes; got "
                             f"{self.local_cache_limit!r}")


@dataclass(frozen=True)
class CoordinationOptions:
    """How processes share one snapshot (leases, waiting; :mod:`snapcache.store.protocol`)."""

    on_busy: str = "wait"
    """When another process is writing the snapshot: ``"wait"`` for its commit and then read,
    or ``"compute"`` the examples without writing."""
    wait_timeout: float | None = None
    """Seconds to wait for another writer's commit before LeaseTimeoutError (None: no limit)."""
    lease_ttl: float = 30.0
    """A writer that has not renewed its lease for this long is presumed dead and replaced."""

    def __post_init__(self) -> None:
        if self.on_busy not in ON_BUSY:
            raise ValueError(f"on_busy must be one of {', '.join(map(repr, ON_BUSY))}; "
                             f"got {self.on_busy!r}")
        if self.wait_timeout is not None and not (
                isinstance(self.wait_timeout, (int, float)) and self.wait_timeout >= 0):
            raise ValueError(f"wait_timeout must be None or seconds >= 0; got {self.wait_timeout!r}")
        if not isinstance(self.lease_ttl, (int, float)) or self.lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be a positive number of seconds; got {self.lease_ttl!r}")
