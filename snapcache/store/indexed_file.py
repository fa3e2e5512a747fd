"""An Arrow IPC file written through a hashing sink: the checksum of the whole file and the
record batch index of :class:`~snapcache.store.manifest.ShardInfo` (where each record batch's
message lies and the xxh3 of its bytes, ``batch_offsets`` / ``batch_checksums``), taken from
the bytes as they are written (docs/format.md, "Record batch index").

Example::

    sink = HashingSink(open(path, "wb"))
    writer = IndexedFileWriter(sink, schema, codec=None)
    writer.write_batch(batch)
    writer.close(); sink.close()
    sink.hash.hexdigest(), writer.offsets, writer.checksums, sink.pages()

With a ``page_size`` the sink also checksums the file page by page (the table of
``ShardInfo.pages_checksum``, docs/format.md "Page checksums"): what lets a reader of one row
verify only the bytes it reads.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import xxhash

from snapcache.errors import StoreError
from snapcache.store import layout
from snapcache.store.manifest import MIN_PAGE_SIZE

_HEADER_PREFIX = 16  # an IPC file's magic (8 bytes), then the schema message's marker and length
PAGES_PER_BATCH = 64  # page checksums a record batch (of the writer's target size), at most


def page_size_for(batch_bytes: int) -> int:
    """The page size of a shard whose record batches hold about ``batch_bytes``: a power of two,
    :data:`PAGES_PER_BATCH` pages a record batch (at least 4 KiB), so that a row read alone
    reads a few pages instead of its record batch, and the page table (8 bytes a page, beside
    the shard) is about 0.05% of the shard."""
    size = MIN_PAGE_SIZE
    while size * PAGES_PER_BATCH < batch_bytes:
        size *= 2
    return size


class HashingSink:
    """A write-only file wrapper that checksums and counts what passes through it: as a whole
    (:attr:`hash`), and, past the Arrow IPC file's header (its magic and schema message), piece
    by piece (:meth:`piece`, one record batch each); with a ``page_size``, also page by page
    (:meth:`pages`)."""

    def __init__(self, raw: Any, page_size: int | None = None):
        self._raw = raw
        self.page_size = page_size
        self._page = xxhash.xxh3_64()
        self._pages: list[bytes] = []
        self.hash = xxhash.xxh3_64()
        self._piece = xxhash.xxh3_64()
        self.size = 0
        self.header_end: int | None = None
        self._head = bytearray()
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        if self.header_end is None:
            self._read_header(view)
        skip = max(0, min(view.nbytes, (self.header_end or 1 << 62) - self.size))
        if skip < view.nbytes:
            self._piece.update(view[skip:])
        if self.page_size:
            self._hash_pages(view)
        self._raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def _read_header(self, view: memoryview) -> None:
        """Learn where the file's header ends: 8 bytes of magic, then the schema message
        (continuation marker, int32 length, that many bytes of metadata, no body)."""
        self._head += view[:max(0, _HEADER_PREFIX - len(self._head))]
        if len(self._head) < _HEADER_PREFIX:
            return
        if bytes(self._head[8:12]) != b"\xff\xff\xff\xff":
            raise StoreError("pyarrow wrote an Arrow IPC file without the continuation "
                             "marker; upgrade pyarrow (snapcache needs the 0.15+ IPC format)")
        self.header_end = _HEADER_PREFIX + int.from_bytes(self._head[12:16], "little")

    def _hash_pages(self, view: memoryview) -> None:
        size, done = self.page_size, 0
        while done < view.nbytes:
            room = size - (self.size + done) % size  # bytes left in the current page
            part = view[done:done + room]
            self._page.update(part)
            done += part.nbytes
            if part.nbytes == room:
                self._pages.append(self._page.digest())
                self._page.reset()

    def pages(self) -> bytes | None:
        """The page table: the xxh3_64 digest (8 bytes, big-endian) of each ``page_size`` bytes
        of what was written (the last page may be shorter), concatenated; None without a page
        size."""
        if not self.page_size:
            return None
        tail = [self._page.digest()] if self.size % self.page_size else []
        return b"".join(self._pages + tail)

    def piece(self) -> str:
        """The xxh3_64 of what was written past the header since the last call."""
        digest = self._piece.hexdigest()
        self._piece.reset()
        return digest

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self._raw.fileno()

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._raw.close()

    def abandon(self) -> None:
        """Close without caring what becomes of the bytes (the file is about to be removed):
        a :class:`~snapcache.store.background_write.BackgroundFile` drops what it has not
        written yet, and no error of the file is raised."""
        if not self.closed:
            self.closed = True
            try:
                getattr(self._raw, "abandon", self._raw.close)()
            except OSError:
                pass


def page_table(data: Any, page_size: int) -> bytes:
    """The page table of ``data`` (a shard's bytes) as :meth:`HashingSink.pages` makes it while
    the shard is written: the xxh3_64 digest of each ``page_size`` bytes, concatenated."""
    view = memoryview(data).cast("B")
    return b"".join(xxhash.xxh3_64(view[at:at + page_size]).digest()
                    for at in range(0, view.nbytes, page_size))


def store_page_table(storage: Any, shard_path: str, table: bytes) -> None:
    """Write the page checksum file beside the shard ``shard_path`` of ``storage`` (local) with
    :meth:`Storage.write_atomic <snapcache.store.fs.Storage.write_atomic>`: a crash leaves the
    old file or none, never a part. Not fsynced (an index: a lost or torn one costs rows read
    alone, never data; docs/format.md "Page checksums")."""
    storage.write_atomic(layout.pages_name(shard_path), table, durable=False)


class IndexedFileWriter:
    """An Arrow IPC file writer that notes where each record batch's message starts and ends
    in the file and the xxh3 of its bytes (:attr:`ShardInfo.batch_offsets`,
    :attr:`ShardInfo.batch_checksums`), from the bytes passing through ``sink``."""

    def __init__(self, sink: HashingSink, schema: pa.Schema, codec: pa.Codec | None):
        self._sink = sink
        self._writer = pa.ipc.new_file(pa.PythonFile(sink, mode="w"), schema,
                                       options=pa.ipc.IpcWriteOptions(compression=codec))
        self.offsets: list[int] = []
        self.checksums: list[str] = []

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)  # the first also writes the header
        if not self.offsets:
            self.offsets.append(self._sink.header_end)
        self.offsets.append(self._sink.size)
        self.checksums.append(self._sink.piece())

    def close(self) -> None:
        self._writer.close()
