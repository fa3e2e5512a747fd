"""The manifest: the one file that makes a folder of shards a snapshot.

A manifest is untrusted input (anyone with write access to the bucket can edit it), so
:func:`Manifest.from_json` validates every field it relies on and raises
:class:`~snapcache.errors.CorruptSnapshotError` with what is wrong; :func:`load_manifest` reads
a folder's committed manifest and checks that it belongs to that folder.
"""

from __future__ import annotations

import json
import socket
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from snapcache._version import __version__
from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.store import layout

if TYPE_CHECKING:
    from snapcache.store.fs import Storage

FORMAT = "snapcache-snapshot"
FORMAT_VERSION = 3
"""The newest format this version reads. Ordinary snapshots are still written as version 1
(readable by every snapcache); a delta snapshot's versioned manifests (``manifest-<v>.json``,
see :mod:`snapcache.store.protocol.versions`) are version 2, or 3 when its units are Parquet
row groups (its source record has more columns), which older readers refuse with a clear
error."""
DELTA_FORMAT_VERSION = 2
LINEAGE_MARKER_VERSION = 3
"""A delta snapshot's lineage folder also holds a ``manifest.json`` that is no snapshot
manifest but a marker (``{"lineage": {...}}``, format version 3): readers of format 1 (and 2,
which look for ``manifest-<v>.json`` first) refuse it with their "upgrade snapcache" error, so
their ``ls`` shows the folder as unreadable, never as an abandoned write that ``purge
--incomplete`` deletes (docs/format.md, "Delta by default")."""
CHECKSUM_ALGORITHM = "xxh3_64"
SHARD_COMPRESSIONS = ("zstd", "lz4", "none")
MAX_ROWS_PER_BYTE = 1 << 18
"""The most rows a byte of a shard file can hold: an example has at least one field and columns
are non-nullable, so a row costs at least one bit of a decoded buffer (a bool scalar's), and a
byte of a compressed IPC body decodes to at most 32 KiB (zstd's densest block: a 3-byte header
and one byte repeated 128 KiB times; an lz4 frame holds about 255 bytes a byte, a raw buffer
one). A shard entry claiming more than ``MAX_ROWS_PER_BYTE * bytes`` rows is corrupt: no file
of that size holds them. Readers lay a snapshot out from the manifest before any shard is open
(:mod:`snapcache.store.order`), so the claim is checked here, not at the file."""
MAX_BATCH_ROWS = 1 << 16
"""The most rows of one record batch: the writer cuts them there at most (and did so before it
recorded ``batch_rows``), so an entry of ``batch_rows`` claiming more is corrupt. Readers plan
an epoch (blocks, then pieces of a few thousand positions) before they open a shard; bounded
so, what a manifest claims costs them what a real snapshot with a manifest that long would."""
MAX_UNLISTED_ROWS = 1 << 28
"""The most rows the shards without ``batch_rows`` (written before snapcache recorded it) may
hold together. Nothing in the manifest bounds how such a count is cut up, and readers lay these
shards out in blocks of :data:`~snapcache.store.order.FALLBACK_BLOCK` rows (a few dozen bytes
each: 65,536 for this many rows) and plan the epoch's pieces before any of them is open. A
claim of more is a damaged or hostile manifest, or a snapshot so old and so large that it is
to be rebuilt (the next run records the record batches)."""
MIN_PAGE_SIZE = 4 << 10
"""The smallest page of a page checksum file (its pages are powers of two from there): so the
table beside a shard is at most 1/512 of it, whatever a manifest says."""
WAY_OUT = ("The manifest is damaged or was edited: delete the snapshot (`snapcache purge` "
           "with its id) and rerun the pipeline to rebuild it")
"""What to do about a manifest that is not valid (every such error ends with it)."""
_INT64 = (1 << 63) - 1  # what Arrow and the readers' numpy arrays count rows and bytes in


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def writer_identity(run_id: str) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id}


@dataclass(frozen=True)
class ShardInfo:
    path: str          # file name inside the snapshot folder
    rows: int
    bytes: int         # size of the file
    checksum: str      # "xxh3_64:<16 hex>" over the whole file
    raw_bytes: int = 0 # uncompressed payload, for the compression ratio
    batch_rows: tuple[int, ...] | None = None
    """Rows of each record batch in the file, in order (None in snapshots written before it was
    recorded): what lets a reader find a row's record batch without opening the shard."""
    compression: str | None = None
    """The codec this shard's buffers are compressed with ("zstd", "lz4" or "none": the writer
    stores a shard raw when compression saves too little); None in snapshots written before it
    was recorded, whose shards all use the manifest's ``compression``. Arrow IPC records it in
    the file too, so readers of any version decode the shard either way."""
    batch_offsets: tuple[int, ...] | None = None
    """Where each record batch's IPC message starts in the file, and where the last one ends
    (one more entry than record batches); None in snapshots written before it was recorded.
    Record batch ``j`` is the bytes ``[batch_offsets[j], batch_offsets[j + 1])``."""
    batch_checksums: tuple[str, ...] | None = None
    """The xxh3_64 (16 hex digits) of each record batch's bytes: what lets a reader of one row
    (``snap[i]``) fetch and verify one record batch instead of the whole shard."""
    page_size: int | None = None
    pages_checksum: str | None = None
    """The xxh3_64 (16 hex digits) of the shard's page checksum file ``<path>.pages`` (the
    8-byte xxh3_64 digest of each ``page_size`` bytes of the shard, the last page may be
    shorter): what lets a reader of one row on local disk read and verify only the pages
    holding that row and its record batch's metadata. The table lives beside the shard, not in
    the manifest, so the manifest stays a few dozen bytes per record batch however large the
    snapshot (docs/format.md, "Page checksums"). None in compressed shards, shards on remote
    storage and snapshots written before they were recorded."""

    def __post_init__(self) -> None:
        for name in ("batch_rows", "batch_offsets", "batch_checksums"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @property
    def batch_index(self) -> bool:
        """Whether single record batches of this shard can be read and verified alone."""
        return self.batch_checksums is not None and self.batch_rows is not None

    def to_json(self) -> dict:
        d = asdict(self)
        for name in ("batch_offsets", "batch_checksums", "page_size", "pages_checksum"):
            if d[name] is None:  # snapshots of older writers: keep their manifests as they were
                d.pop(name)
        return d

    @property
    def pages(self) -> int:
        """How many pages the shard has (0 without page checksums)."""
        return -(-self.bytes // self.page_size) if self.page_size else 0


@dataclass(frozen=True)
class Manifest:
    fingerprint: str
    schema: dict | None                  # snapcache.store.codec.Schema.to_json(); None if empty
    shards: tuple[ShardInfo, ...]
    compression: str
    created_at: str
    committed_at: str
    writer: dict
    fingerprint_tree: dict | None = None
    pipeline: str = ""
    key: str | None = None
    name: str | None = None
    library_version: str = __version__
    format_version: int = 1
    extra: dict = field(default_factory=dict)
    version: int | None = None
    """Delta snapshots: the version number of this manifest in its lineage folder."""
    source: dict | None = None
    """Delta snapshots: ``{kind, units, bytes, digest, record, record_bytes, record_checksum}``,
    the file source this version was built from (the files themselves are listed in the side
    record ``record``)."""
    segments: tuple[dict, ...] | None = None
    """Delta snapshots: ``[{shards, units, rows}]`` in order; segment ``i`` owns the next
    ``shards`` shards of ``shards``."""

    @property
    def snapshot_id(self) -> str:
        """What iterator states name this snapshot by: the fingerprint, and for a delta
        snapshot's version also the digest of the files it was built from."""
        if self.version is None or not self.source:
            return self.fingerprint
        return f"{self.fingerprint}:{self.source.get('digest')}"

    @property
    def num_examples(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def raw_bytes(self) -> int:
        return sum(s.raw_bytes for s in self.shards)

    # -- serialisation -------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        if self.version is None:  # an ordinary snapshot: the format-1 fields only
            for name in ("version", "source", "segments"):
                d.pop(name)
        else:
            d["segments"] = list(self.segments or ())
        d["shards"] = [s.to_json() for s in self.shards]
        d["num_examples"] = self.num_examples
        d["total_bytes"] = self.total_bytes
        d["raw_bytes"] = self.raw_bytes
        return {"format": FORMAT, **d}

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=False).encode()

    @classmethod
    def loads(cls, data: bytes, *, where: str) -> "Manifest":
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptSnapshotError(f"{where}: manifest is not valid JSON ({e}). {WAY_OUT}"
                                       ) from None
        return cls.from_json(doc, where=where)

    @classmethod
    def from_json(cls, doc: Any, *, where: str) -> "Manifest":
        def bad(msg: str) -> CorruptSnapshotError:
            return CorruptSnapshotError(f"{where}: invalid manifest: {msg}. {WAY_OUT}")

        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise bad(f"not a {FORMAT} manifest")
        version = doc.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise bad(f"format_version must be an int, got {version!r}")
        if version == LINEAGE_MARKER_VERSION and isinstance(doc.get("lineage"), dict):
            raise CorruptSnapshotError(
                f"{where}: the marker of a delta snapshot's lineage, whose versions "
                "(manifest-<v>.json) are missing: its first build stopped before committing; "
                "run the pipeline again, or delete it with `snapcache purge <id>`")
        if version < 1:  # no release wrote it: damage (a flipped bit), not a newer format
            raise bad(f"format_version {version} was never written by any snapcache")
        if version > FORMAT_VERSION:
            raise UnknownFormatVersionError(
                f"{where}: format version {version} is not readable by snapcache {__version__} "
                f"(reads up to {FORMAT_VERSION}); upgrade snapcache to read this snapshot")
        fingerprint = _typed(doc, "fingerprint", str, bad)
        if not layout.is_fingerprint(fingerprint):
            raise bad(f"fingerprint {fingerprint!r} is not a hex digest")
        shards_doc = _typed(doc, "shards", list, bad)
        shards = tuple(_shard(s, i, bad) for i, s in enumerate(shards_doc))
        if len({s.path for s in shards}) != len(shards):
            raise bad("a shard path is listed twice")
        schema = doc.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise bad("schema must be an object")
        if shards and schema is None:
            raise bad("shards without a schema")
        totals = {"num_examples": sum(s.rows for s in shards),
                  "total_bytes": sum(s.bytes for s in shards)}
        for name, value in totals.items():
            if name in doc and doc[name] != value:
                raise bad(f"{name} {doc[name]!r} disagrees with the shard list ({value})")
            if value > _INT64:
                raise bad(f"the shards' {name} add up to {value}, more than a 64-bit count")
        unlisted = sum(s.rows for s in shards if s.batch_rows is None)
        if unlisted > MAX_UNLISTED_ROWS:
            raise bad(f"its shards without batch_rows claim {unlisted} rows, more than the "
                      f"{MAX_UNLISTED_ROWS} readers lay out without a record batch list (a "
                      "damaged manifest, or a snapshot from before snapcache recorded "
                      "batch_rows too large to be read that way)")
        tree = doc.get("fingerprint_tree")
        delta = _delta_fields(doc, version, shards, bad)
        return cls(
            fingerprint=fingerprint,
            schema=schema,
            shards=shards,
            compression=_typed(doc, "compression", str, bad),
            created_at=str(doc.get("created_at", "")),
            committed_at=str(doc.get("committed_at", "")),
            writer=doc.get("writer") if isinstance(doc.get("writer"), dict) else {},
            fingerprint_tree=tree if isinstance(tree, dict) else None,
            pipeline=str(doc.get("pipeline", "")),
            key=doc.get("key") if isinstance(doc.get("key"), str) else None,
            name=doc.get("name") if isinstance(doc.get("name"), str) else None,
            library_version=str(doc.get("library_version", "")),
            format_version=version,
            extra=doc.get("extra") if isinstance(doc.get("extra"), dict) else {},
            **delta,
        )


def load_manifest(storage: Storage) -> Manifest | None:
    """The committed manifest of the snapshot folder ``storage``, or None if not committed.
    An unchanged manifest read before in this process is not read and parsed again (one HEAD
    on S3, see :meth:`Storage.read_parsed`).

    The manifest's fingerprint must be the folder's name: a snapshot folder copied or renamed
    under another pipeline's fingerprint would otherwise hand that pipeline foreign data."""
    try:
        manifest = storage.read_parsed(layout.MANIFEST,
                                       lambda data: Manifest.loads(data, where=storage.url))
    except FileNotFoundError:
        return None
    root, _, folder = storage.url.rpartition("/")
    if manifest.fingerprint != folder:
        raise CorruptSnapshotError(
            f"{storage.url}: the manifest's fingerprint {manifest.fingerprint} does not match "
            f"its folder name {folder}: the folder was copied or renamed from another snapshot "
            f"and holds another pipeline's data. Move it back to {root}/{manifest.fingerprint} "
            f"if that is what it is, or delete {storage.url} and rerun the pipeline to rebuild "
            "it")
    return manifest


def _delta_fields(doc: dict, version: int, shards: tuple, bad) -> dict:
    """The fields of a delta snapshot's versioned manifest (format version 2), validated."""
    if version < DELTA_FORMAT_VERSION or "version" not in doc:
        return {}
    number = doc.get("version")
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise bad(f"version must be a positive int, got {number!r}")
    source = doc.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("digest"), str):
        raise bad("source must be an object with a digest")
    segments = doc.get("segments")
    if not isinstance(segments, list) or not all(
            isinstance(s, dict) and all(isinstance(s.get(k), int) and not isinstance(
                s.get(k), bool) and s.get(k) >= 0 for k in ("shards", "units", "rows"))
            for s in segments):
        raise bad("segments must be a list of {shards, units, rows} counts")
    if sum(s["shards"] for s in segments) != len(shards):
        raise bad("segments do not account for every shard")
    start = 0
    for i, segment in enumerate(segments):
        rows = sum(s.rows for s in shards[start:start + segment["shards"]])
        if rows != segment["rows"]:
            raise bad(f"segment {i} holds {rows} rows, not {segment['rows']}")
        start += segment["shards"]
    return {"version": number, "source": source, "segments": tuple(segments)}


def _typed(doc: dict, key: str, type_: type, bad) -> Any:
    value = doc.get(key)
    if not isinstance(value, type_) or isinstance(value, bool):
        raise bad(f"{key!r} must be a {type_.__name__}, got {type(value).__name__}")
    return value


def _shard(doc: Any, index: int, bad) -> ShardInfo:
    if not isinstance(doc, dict):
        raise bad(f"shard #{index} is not an object")
    path = doc.get("path")
    if not layout.is_safe_shard_path(path):
        raise bad(f"shard #{index} path {path!r} is not a file inside the snapshot folder")
    for key in ("rows", "bytes"):
        v = doc.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad(f"shard {path!r}: {key} must be a non-negative int, got {v!r}")
    if doc["rows"] > MAX_ROWS_PER_BYTE * doc["bytes"]:
        raise bad(f"shard {path!r}: {doc['rows']} rows cannot fit in {doc['bytes']} bytes "
                  f"(a byte of a shard holds at most {MAX_ROWS_PER_BYTE} rows)")
    checksum = doc.get("checksum")
    algo, _, digest = str(checksum).partition(":")
    if algo != CHECKSUM_ALGORITHM or len(digest) != 16:
        raise bad(f"shard {path!r}: checksum {checksum!r} is not '{CHECKSUM_ALGORITHM}:<16 hex>'")
    raw = doc.get("raw_bytes", 0)
    batch_rows = doc.get("batch_rows")
    if batch_rows is not None and not (isinstance(batch_rows, list) and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in batch_rows)):
        raise bad(f"shard {path!r}: batch_rows must be a list of row counts")
    if batch_rows is not None and any(r > MAX_BATCH_ROWS for r in batch_rows):
        raise bad(f"shard {path!r}: batch_rows lists a record batch of {max(batch_rows)} "
                  f"rows, more than the {MAX_BATCH_ROWS} a record batch holds")
    if batch_rows is not None and sum(batch_rows) != doc["rows"]:
        raise bad(f"shard {path!r}: batch_rows add up to {sum(batch_rows)} rows, the shard "
                  f"has {doc['rows']}")
    compression = doc.get("compression")
    if compression is not None and compression not in SHARD_COMPRESSIONS:
        raise bad(f"shard {path!r}: compression {compression!r} is not one of "
                  f"{', '.join(SHARD_COMPRESSIONS)}")
    offsets, checksums = _batch_index(doc, path, batch_rows, bad)
    page_size, pages = _pages(doc, path, bad) if offsets is not None else (None, None)
    return ShardInfo(path=path, rows=doc["rows"], bytes=doc["bytes"], checksum=checksum,
                     raw_bytes=raw if isinstance(raw, int) and raw >= 0 else 0,
                     batch_rows=tuple(batch_rows) if batch_rows is not None else None,
                     compression=compression, batch_offsets=offsets,
                     batch_checksums=checksums, page_size=page_size, pages_checksum=pages)


def _pages(doc: dict, path: str, bad) -> tuple[int | None, str | None]:
    """A shard's page size and the checksum of its page checksum file, validated: both or
    neither (they are used with the record batch index only)."""
    size, pages = doc.get("page_size"), doc.get("pages_checksum")
    if size is None and pages is None:
        return None, None
    if not (isinstance(size, int) and not isinstance(size, bool) and size > 0
            and isinstance(pages, str)):
        raise bad(f"shard {path!r}: page_size and pages_checksum must both be given, a "
                  "positive int and a string")
    if size < MIN_PAGE_SIZE or size & (size - 1):
        raise bad(f"shard {path!r}: page_size {size} is not a power of two of at least "
                  f"{MIN_PAGE_SIZE} bytes")
    if len(pages) != 16 or not layout.is_hex(pages):
        raise bad(f"shard {path!r}: pages_checksum must be one {CHECKSUM_ALGORITHM} digest "
                  "(16 hex digits)")
    return size, pages


_MAGIC_BYTES = 8  # an Arrow IPC file starts with "ARROW1" and padding


def _batch_index(doc: dict, path: str, batch_rows: list | None, bad
                 ) -> tuple[tuple[int, ...] | None, tuple[str, ...] | None]:
    """A shard's record batch offsets and checksums, validated: both or neither, one checksum
    per record batch, offsets increasing inside the file."""
    offsets, checksums = doc.get("batch_offsets"), doc.get("batch_checksums")
    if (offsets is None and checksums is None) or batch_rows is None:
        return None, None  # without usable batch_rows a shard is only read whole
    where = f"shard {path!r}: batch_offsets and batch_checksums"
    if not (isinstance(offsets, list) and isinstance(checksums, list)):
        raise bad(f"{where} must both be lists")
    if len(checksums) != len(batch_rows) or \
            len(offsets) != len(checksums) + 1:
        raise bad(f"shard {path!r}: batch_rows lists {len(batch_rows)} record batches, "
                  f"batch_checksums {len(checksums)} and batch_offsets {len(offsets)} (one "
                  "more, for the end of the last)")
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or \
            (offsets and offsets[0] < _MAGIC_BYTES) or \
            any(b <= a for a, b in zip(offsets, offsets[1:])) or \
            (offsets and offsets[-1] > doc["bytes"]):
        raise bad(f"shard {path!r}: batch_offsets must increase from the end of the file's "
                  f"magic to at most its {doc['bytes']} bytes")
    if not all(isinstance(c, str) and len(c) == 16 and layout.is_hex(c) for c in checksums):
        raise bad(f"shard {path!r}: batch_checksums must be {CHECKSUM_ALGORITHM} digests "
                  "(16 hex digits each)")
    return tuple(offsets), tuple(checksums)
