"""The store's options: what the writer, the reader and the coordination between processes
need, each a small frozen dataclass validated on construction and given to the object that uses
it when it is built (never set on it afterwards).

``snapcache.options.SnapshotOptions`` composes the three with what the pipeline adds (``key``,
``name``, ``progress``, ``storage_options``); ``Dataset.snapshot(...)`` builds it from keywords.
Each option is validated here, once, in the class that owns it; sizes and durations may be
given as people type them, and are kept as bytes and seconds.

>>> WriteOptions(compression="lz4").shard_size == 64 << 20
True
>>> WriteOptions(shard_size="256MiB").shard_size, CoordinationOptions(lease_ttl="2m").lease_ttl
(268435456, 120.0)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from snapcache.units import parse_duration, parse_size

COMPRESSIONS = ("auto", "zstd", "lz4", "none")
ON_BUSY = ("wait", "compute")

_MiB = 1 << 20


def _normalize(options: Any, name: str, parse: Callable[[Any], float], *, optional: bool,
               zero: bool, expected: str) -> None:
    """Option ``name`` of ``options`` replaced, in place, by ``parse`` of it: a positive number
    (``zero``: or 0), else a ValueError saying what is ``expected``; None kept if
    ``optional``."""
    value = getattr(options, name)
    if optional and value is None:
        return
    try:
        parsed = parse(value)
    except (TypeError, ValueError):
        parsed = -1
    if not parsed >= 0 or (parsed == 0 and not zero):  # NaN too
        raise ValueError(f"{name} must be {'None or ' if optional else ''}{expected}; "
                         f"got {value!r}")
    object.__setattr__(options, name, parsed)


def _bytes(options: Any, name: str, *, optional: bool = False) -> None:
    """Option ``name`` as a positive int of bytes: given as one, or as a size as people type
    it ("64MB", "1.5GiB": :func:`snapcache.units.parse_size`)."""
    _normalize(options, name, parse_size, optional=optional, zero=False,
               expected="a positive number of bytes or a size such as '64MB' or '1GiB'")


def _seconds(options: Any, name: str, *, optional: bool = False, zero: bool = False) -> None:
    """Option ``name`` as a float of seconds: given as a number, a ``timedelta`` or a duration
    as people type it ("90s", "5m", "2h": :func:`snapcache.units.parse_duration`); positive
    (``zero``: or 0)."""
    _normalize(options, name, parse_duration, optional=optional, zero=zero,
               expected=f"{'seconds >= 0' if zero else 'a positive number of seconds'}, a "
                        "timedelta or a duration such as '90s' or '5m'")


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
        _bytes(self, "shard_size")
        _bytes(self, "record_batch_size")
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
        _bytes(self, "prefetch_bytes", optional=True)
        if self.local_cache is not None and not isinstance(self.local_cache, (str, os.PathLike)):
            raise ValueError(f"local_cache must be a folder path; got {self.local_cache!r}")
        _bytes(self, "local_cache_limit")


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
        _seconds(self, "wait_timeout", optional=True, zero=True)
        _seconds(self, "lease_ttl")
