"""One row of a raw shard on local disk, read alone: only the pages that hold it.

A shard written with page checksums (its ``.pages`` file, :attr:`ShardInfo.pages_checksum
<snapcache.store.manifest.ShardInfo.pages_checksum>`, docs/format.md "Page checksums") lets a
reader of one row (``snap[i]``) verify what it reads page by page instead of a whole record
batch: the pages holding the record batch's IPC metadata, then those holding each byte range
the row is decoded from (its list offsets, values, shape, scalars). Each page is read once
(``pread``) and checked against its checksum before any byte of it is used; the metadata is
parsed only once verified, and every offset, length and shape the row reads is checked
against the buffer it lies in (the buffers against the message body) before anything is read
through it, so that no byte reaches the caller unverified and no read leaves the record
batch. Other rows' bytes are not read, so not checked: a record batch read often is read and
verified whole (:meth:`SnapshotReader.read_batch
<snapcache.store.reader.SnapshotReader.read_batch>`). A shard held in memory (:class:`Held`:
mapped, or fetched whole) is decoded from the same way, its pages checked as first used.

The row is decoded straight from the pages, without Arrow: :class:`RowDecoder` is compiled
once from the schema (which IPC field nodes and buffers hold each field, in the order Arrow
lays a record batch out) and reads the record batch message's flatbuffer metadata itself (its
field nodes and buffer locations), so a first ``snap[i]`` on a freshly opened snapshot costs a
few ``pread`` calls and little Python. Rows equal :meth:`Decoder.rows
<snapcache.store.decoder.Decoder.rows>`' (``tests/store/test_row_read.py`` checks every field
kind), as read-only arrays over the page bytes.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import threading
from typing import Any, Callable

import numpy as np
import xxhash

from snapcache.errors import CorruptSnapshotError
from snapcache.store import layout
from snapcache.store.manifest import ShardInfo
from snapcache.store.schema import Schema, storage_dtype

_CONTINUATION = b"\xff\xff\xff\xff"
_RECORD_BATCH = 3  # MessageHeader.RecordBatch in Arrow's Message.fbs
_U16, _I32, _U32, _I64 = (struct.Struct(f) for f in ("<H", "<i", "<I", "<q"))
_OFFSETS = struct.Struct("<2q")
_pread = os.pread  # (tests count the pages read)
_FIRST_READ = 4096
POPULATE_BYTES = 16 << 20
"""Local shards of at most this size are prepared whole when held (:func:`map_shard`): their
pages mapped at once (not a page fault per 64 KiB first touched) and the shard checked against
its checksum in one hash, not page by page as rows use it (together ~11 us of a ~36 us warm
row); for a shard in the page cache ~0.5 ms a 4 MiB shard, paid once, at its second row read
alone. A larger shard (or one not in the page cache, which preparing would read whole) is
faulted in and checked page by page as rows use it."""
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux


def readable_alone(shard: ShardInfo, local: bool) -> bool:
    """Whether a row of ``shard`` can be read alone, page by page: a raw shard on local disk
    whose manifest entry has page checksums and the record batch index."""
    return local and shard.pages_checksum is not None and shard.compression == "none" \
        and shard.batch_checksums is not None and shard.batch_rows is not None


def load_pages(path: str, shard: ShardInfo,
               names: Callable[[], tuple[str, str]] | None = None) -> bytes | None:
    """The page table of ``shard`` (the local file ``path``): its ``.pages`` file, checked
    against the manifest's ``pages_checksum``; None if that file is missing or does not match
    (an index, not data: the rows of such a shard are read by record batch instead).

    The shard itself is looked at first: missing, or of another size than the manifest's
    ``bytes``, it is CorruptSnapshotError (``names()``: how errors name the shard, and what to
    do), as for every read of it. The page file is read only if its own size is the one the
    shard's size implies, so no read is sized by the manifest alone."""
    def damaged(problem: str) -> CorruptSnapshotError:
        where, way_out = names() if names is not None else (f"shard {path!r}", "")
        return CorruptSnapshotError(f"{where}: {problem}. {way_out}".rstrip())

    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise damaged(f"the shard is missing ({path})") from None
    if size != shard.bytes:
        raise damaged(f"the shard has {size} bytes, the manifest says {shard.bytes}")
    try:
        fd = os.open(layout.pages_name(path), os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != 8 * shard.pages:
            return None
        table = _pread(fd, 8 * shard.pages + 1, 0)  # one more: a file grown since does not match
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(table) != 8 * shard.pages or \
            xxhash.xxh3_64(table).hexdigest() != shard.pages_checksum:
        return None
    return table


class _Damaged(Exception):
    """Raised inside a row read; reported as CorruptSnapshotError naming the record batch."""


class _Pages:
    """Pages of one shard file read on demand, each checked against its checksum: runs of
    whole pages, each one ``pread``."""

    parsed = None  # (parsed record batch metadata is kept by Held only)

    def __init__(self, fd: int, shard: ShardInfo, table: bytes | None):
        self.fd, self.shard, self.table = fd, shard, table  # no table: not verified
        self.runs: list[tuple[int, int, bytes]] = []

    def get(self, a: int, n: int) -> tuple[bytes, int]:
        """(a verified buffer, the position in it of file byte ``a``), holding ``n`` bytes."""
        for lo, hi, data in self.runs:
            if lo <= a and a + n <= hi:
                return data, a - lo
        size, total = self.shard.page_size, self.shard.bytes
        if a < 0 or a + n > total:  # (callers stay within the record batch)
            raise _Damaged("a read past the end of the shard")
        lo, hi = a - a % size, min(a + n + (-(a + n)) % size, total)
        data = _pread(self.fd, hi - lo, lo)
        if len(data) != hi - lo:
            raise _Damaged("the shard is shorter than the manifest says")
        table = self.table
        if table is not None:
            view = memoryview(data)
            for at in range(lo, hi, size):
                page = at // size
                actual = xxhash.xxh3_64(view[at - lo:at - lo + size]).digest()
                if actual != table[8 * page:8 * page + 8]:
                    raise _Damaged(
                        f"page {page} (bytes {at}-{min(at + size, total)}) has checksum "
                        f"{actual.hex()} != {table[8 * page:8 * page + 8].hex()} in its "
                        "page checksum file")
        self.runs.append((lo, hi, data))
        return data, a - lo


class Held:
    """A shard's bytes held in memory: a read-only map of the local file, or a remote shard
    fetched whole. With its page table, each page is checked against its checksum the first
    time a row uses it (then marked checked: the map is of a committed shard, which is never
    written in place, and a replaced file keeps the mapped inode; as for shards read in
    order, a byte changed in place after it was checked is not seen); without one (``table``
    None, or :attr:`checked` None) the whole shard was verified against its checksum before
    it was held, or the read is ``verify=False``. Its :meth:`get` is :class:`_Pages`' without a system call:
    the row decoder reads held shards and files the same way."""

    def __init__(self, data: Any, shard: ShardInfo, table: bytes | None):
        self.view, self.shard, self.table = memoryview(data).cast("B"), shard, table
        self.size, self.page_size = len(self.view), shard.page_size
        self.checked = bytearray(shard.pages) if table is not None else None
        self.unchecked = shard.pages
        # record batch -> (rows, body start, buffers) once its metadata was checked and parsed
        # (a few hundred bytes each: at most a shard's record batches)
        self.parsed: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        self._lock = threading.Lock()  # threads reading rows check each page once
        if self.size != shard.bytes:
            raise _Damaged(f"it has {self.size} bytes, the manifest says {shard.bytes}")

    def get(self, a: int, n: int) -> tuple[memoryview, int]:
        """(the held bytes, ``a``) once the pages holding ``[a, a + n)`` are checked."""
        if a < 0 or n < 0 or a + n > self.size:  # (callers stay within the record batch)
            raise _Damaged("a read past the end of the shard")
        checked = self.checked
        if checked is not None:
            first, last = a // self.page_size, (a + n - (n > 0)) // self.page_size
            if not checked[first] or (last > first and checked.find(0, first, last + 1) >= 0):
                self._check(first, last)
        return self.view, a

    def _check(self, first: int, last: int) -> None:
        with self._lock:
            checked, size, table = self.checked, self.page_size, self.table
            if checked is None:
                return
            for page in range(first, last + 1):
                if not checked[page]:
                    at = page * size
                    actual = xxhash.xxh3_64(self.view[at:at + size]).digest()
                    expected = table[8 * page:8 * page + 8]  # type: ignore[index]
                    if actual != expected:
                        raise _Damaged(
                            f"page {page} (bytes {at}-{min(at + size, self.size)}) has "
                            f"checksum {actual.hex()} != {expected.hex()} in its page "
                            "checksum file")
                    checked[page] = 1
                    self.unchecked -= 1
            if not self.unchecked:  # every page checked: nothing left to look up
                self.checked = None


def map_shard(path: str, shard: ShardInfo, table: bytes | None) -> Held:
    """The local shard file ``path`` mapped read-only and held (:class:`Held`, its pages
    checked against ``table`` as used); FileNotFoundError, or _Damaged if its size is not
    the manifest's. A small shard (:data:`POPULATE_BYTES`) is prepared whole: its pages
    mapped at once and, with ``table``, the whole shard checked against the manifest's
    checksum (one hash, ~0.1 ms a MiB; a row then checks nothing more). If that does not
    match, its pages are checked one by one as rows use them: rows of intact pages still
    read, and a damaged page is named by the row that uses it."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != shard.bytes:
            raise _Damaged(f"it has {os.fstat(f.fileno()).st_size} bytes, the manifest says "
                           f"{shard.bytes}")
        small = shard.bytes <= POPULATE_BYTES
        flags = mmap.MAP_SHARED | (_POPULATE if small else 0)
        held = Held(mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ), shard, table)
    if small and table is not None and \
            "xxh3_64:" + xxhash.xxh3_64(held.view).hexdigest() == shard.checksum:
        held.checked = None  # every page verified, by the shard's checksum
    return held


class _Table:
    """A flatbuffer table in ``meta`` at ``pos``: its fields' positions (None if absent)."""

    def __init__(self, meta: memoryview, pos: int):
        if pos < 0:
            raise _Damaged("the message metadata is malformed")
        vtable = pos - _I32.unpack_from(meta, pos)[0]
        if vtable < 0:
            raise _Damaged("the message metadata is malformed")
        self.meta, self.pos, self.vtable = meta, pos, vtable
        self.size = _U16.unpack_from(meta, vtable)[0]

    def field(self, i: int) -> int | None:
        at = 4 + 2 * i
        if at + 2 > self.size:
            return None
        offset = _U16.unpack_from(self.meta, self.vtable + at)[0]
        return self.pos + offset if offset else None

    def table(self, i: int) -> "_Table | None":
        at = self.field(i)
        return None if at is None else _Table(self.meta, at + _U32.unpack_from(self.meta, at)[0])

    def int64(self, i: int) -> int:
        at = self.field(i)
        return 0 if at is None else _I64.unpack_from(self.meta, at)[0]

    def pairs(self, i: int, vector: struct.Struct) -> tuple[int, ...]:
        """A vector of 16-byte structs of two int64 (FieldNode, Buffer), flattened: as many as
        ``vector`` reads (``<2nq``), or _Damaged."""
        at = self.field(i)
        if at is None:
            raise _Damaged("the message metadata is malformed")
        at += _U32.unpack_from(self.meta, at)[0]
        if _U32.unpack_from(self.meta, at)[0] * 16 != vector.size:
            raise _Damaged("the record batch does not have the snapshot's columns")
        return vector.unpack_from(self.meta, at + 4)


def _record_batch(meta: memoryview, nodes: struct.Struct, buffers: struct.Struct
                  ) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """(rows, body length, field nodes, buffers) of a record batch message's metadata."""
    root = _U32.unpack_from(meta, 0)[0]
    message = _Table(meta, root)
    kind = message.field(1)
    if kind is None or meta[kind] != _RECORD_BATCH:
        raise _Damaged("an IPC message of another type where a record batch belongs")
    header = message.table(2)
    if header is None:
        raise _Damaged("the message metadata is malformed")
    if header.field(3) is not None:
        raise _Damaged("its buffers are compressed, the manifest says the shard is not")
    return header.int64(0), message.int64(3), header.pairs(1, nodes), header.pairs(2, buffers)


class RowDecoder:
    """Decodes one row of a record batch of ``schema`` from a shard's pages (see the module
    docstring); compiled once, when a snapshot is opened."""

    def __init__(self, schema: Schema):
        self.structure, self.names = schema.structure, tuple(f.name for f in schema.fields)
        self.fields: list[tuple] = []
        self.top: list[int] = []  # the field nodes of the columns (one per row each)
        node = buffer = 0
        for spec in schema.fields:
            dtype = np.dtype(spec.dtype) if spec.dtype else None
            self.top.append(node)
            if spec.kind == "tensor":
                storage, factor = storage_dtype(dtype)
                # large_list: validity, offsets; its values: validity, data
                shape = None
                node, buffer, offsets, values = node + 2, buffer + 4, buffer + 1, buffer + 3
                if spec.ndim >= 2:  # "<name>.shape": fixed_size_list (validity); int32 values
                    self.top.append(node)
                    node, buffer, shape = node + 2, buffer + 3, buffer + 2
                dims = struct.Struct(f"<{spec.ndim}i")
                self.fields.append(("tensor", spec.name, dtype, storage, factor, spec.ndim,
                                    offsets, values, shape, dims))
            elif spec.kind == "scalar":
                storage, factor = storage_dtype(dtype)
                if factor == 1:  # a primitive (bool: a bitmap): validity, data
                    node, buffer, data = node + 1, buffer + 2, buffer + 1
                else:  # complex: fixed_size_list (validity); its values: validity, data
                    node, buffer, data = node + 2, buffer + 3, buffer + 2
                self.fields.append(("scalar", spec.name, dtype, storage, factor, spec.python,
                                    data))
            else:  # large_string / large_binary: validity, offsets, data
                self.fields.append((spec.kind, spec.name, buffer + 1, buffer + 2))
                node, buffer = node + 1, buffer + 3
        self.nodes = struct.Struct(f"<{2 * node}q")      # the field nodes: length, nulls
        self.buffers = struct.Struct(f"<{2 * buffer}q")  # the buffers: offset, length

    def read(self, path: str, shard: ShardInfo, index: int, k: int, table: bytes | None
             ) -> Any:
        """Row ``k`` of record batch ``index`` of ``shard`` (the local file ``path``), its
        pages checked against ``table`` (:func:`load_pages`; None: not checked);
        :class:`_Damaged` on any mismatch (the caller names the shard)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return self.decode(_Pages(fd, shard, table), shard, index, k)
        finally:
            os.close(fd)

    def decode(self, pages: "_Pages | Held", shard: ShardInfo, index: int, k: int) -> Any:
        """Row ``k`` of record batch ``index`` of ``shard`` from ``pages`` (read on demand, or
        :class:`Held`), each byte range checked as ``pages`` does before it is used."""
        parsed = pages.parsed.get(index) if pages.parsed is not None else None
        if parsed is None:
            parsed = self._metadata(pages, shard, index)
            if pages.parsed is not None:
                pages.parsed[index] = parsed
        rows, body, buffers = parsed
        if not 0 <= k < rows:
            raise _Damaged(f"it has {rows} rows, no row {k}")
        values = [self._field(field, pages, body, buffers, k) for field in self.fields]
        if self.structure == "single":
            return values[0]
        if self.structure == "tuple":
            return tuple(values)
        return dict(zip(self.names, values))

    def _metadata(self, pages: "_Pages | Held", shard: ShardInfo, index: int
                  ) -> tuple[int, int, tuple[int, ...]]:
        """(rows, where the body starts in the file, buffers) of record batch ``index``, its
        metadata read, checked and parsed (see :meth:`decode`)."""
        start, end = shard.batch_offsets[index], shard.batch_offsets[index + 1]  # type: ignore
        # The pages holding the metadata's first 4 KiB: most often its metadata and the
        # offsets of the first list columns too, in one pread.
        data, at = pages.get(start, min(_FIRST_READ, end - start))
        length = _I32.unpack_from(data, at + 4)[0] if end - start >= 8 else -1
        if data[at:at + 4] != _CONTINUATION or not 0 < length <= end - start - 8:
            raise _Damaged("no IPC message starts there")
        data, at = pages.get(start + 8, length)
        rows, body_length, nodes, buffers = _record_batch(
            memoryview(data)[at:at + length], self.nodes, self.buffers)
        body = start + 8 + length
        if rows != shard.batch_rows[index]:  # type: ignore[index]
            raise _Damaged(f"it has {rows} rows, the manifest says "
                           f"{shard.batch_rows[index]}")  # type: ignore[index]
        if body_length < 0 or body + body_length > end:
            raise _Damaged("its body is longer than the record batch")
        if any(nodes[2 * n] != rows for n in self.top) or any(nodes[1::2]):
            raise _Damaged("its columns' lengths or null counts are wrong")
        for b in range(0, len(buffers), 2):
            if buffers[b] < 0 or buffers[b + 1] < 0 or \
                    buffers[b] + buffers[b + 1] > body_length:
                raise _Damaged("a buffer lies outside the message body")
        return rows, body, buffers

    @staticmethod
    def _field(field: tuple, pages: _Pages, body: int, buffers: tuple[int, ...], k: int
               ) -> Any:
        kind, name = field[0], field[1]
        if kind == "scalar":
            _, _, dtype, storage, factor, python, data = field
            offset, size = buffers[2 * data], buffers[2 * data + 1]
            if dtype.kind == "b":
                if k // 8 >= size:
                    raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
                raw, at = pages.get(body + offset + k // 8, 1)
                value = bool((raw[at] >> (k % 8)) & 1)
                return value if python else np.bool_(value)
            width = storage.itemsize * factor
            if (k + 1) * width > size:
                raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
            raw, at = pages.get(body + offset + k * width, width)
            one = np.frombuffer(raw, storage, factor, at).view(dtype)
            return one.tolist()[0] if python else one[0]
        if kind == "tensor":
            _, _, dtype, storage, factor, ndim, offsets, values, shape, dims_of = field
            a, b = _bounds(name, pages, body, buffers, offsets, k)
            if (b - a) % factor:
                raise _Damaged(f"field {name!r}: a list length is not a multiple of {factor}")
            offset, size = buffers[2 * values], buffers[2 * values + 1]
            width = storage.itemsize
            if b * width > size:
                raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
            if b > a:
                raw, at = pages.get(body + offset + a * width, (b - a) * width)
                array = np.frombuffer(raw, storage, b - a, at).view(dtype)
            else:
                array = np.empty(0, storage).view(dtype)
                array.setflags(write=False)
            count = (b - a) // factor
            if ndim >= 2:
                offset, size = buffers[2 * shape], buffers[2 * shape + 1]
                if (k + 1) * ndim * 4 > size:
                    raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
                raw, at = pages.get(body + offset + k * ndim * 4, ndim * 4)
                dims = dims_of.unpack_from(raw, at)
                if min(dims) < 0 or math.prod(dims) != count:
                    raise _Damaged(f"field {name!r}: shapes disagree with list lengths")
                return array.reshape(dims)
            if ndim == 0:
                if count != 1:
                    raise _Damaged(f"field {name!r}: a 0-d array with several elements")
                return array.reshape(())
            return array
        _, _, offsets, data = field  # str, bytes
        a, b = _bounds(name, pages, body, buffers, offsets, k)
        offset, size = buffers[2 * data], buffers[2 * data + 1]
        if b > size:
            raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
        value = b""
        if b > a:
            raw, at = pages.get(body + offset + a, b - a)
            value = bytes(raw[at:at + b - a])
        if kind == "bytes":
            return value
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"field {name!r}: a string is not UTF-8") from None


def _bounds(name: str, pages: _Pages, body: int, buffers: tuple[int, ...], offsets: int,
            k: int) -> tuple[int, int]:
    """Row ``k``'s [start, end) in a list column's values, from its offsets buffer."""
    offset, size = buffers[2 * offsets], buffers[2 * offsets + 1]
    if (k + 2) * 8 > size:
        raise _Damaged(f"field {name!r}: a buffer is shorter than its array")
    raw, at = pages.get(body + offset + 8 * k, 16)
    a, b = _OFFSETS.unpack_from(raw, at)
    if a < 0 or b < a:
        raise _Damaged(f"field {name!r}: list offsets decrease or are negative")
    return a, b


def read_row(decoder: RowDecoder, path: str, shard: ShardInfo, index: int, k: int, *,
             table: bytes | None, names: Callable[[], tuple[str, str]],
             held: Callable[[], Held] | None = None) -> Any:
    """Example ``k`` of record batch ``index`` of ``shard`` (the local file ``path``), reading
    only the pages it needs, each checked against ``table`` (None: ``verify=False``);
    CorruptSnapshotError if anything is missing, damaged or inconsistent, naming the shard and
    the way out (``names()``: how errors name the shard, and what to do; asked only then).
    ``held``: what gives the shard's :class:`Held` bytes to decode from instead of reading
    the file (e.g. maps it, :func:`map_shard`; its errors are reported the same way)."""
    try:
        if held is not None:
            return decoder.decode(held(), shard, index, k)
        return decoder.read(path, shard, index, k, table)
    except FileNotFoundError:
        where, way_out = names()
        raise CorruptSnapshotError(f"{where} record batch {index}: the shard is missing "
                                   f"({path}). {way_out}") from None
    except _Damaged as e:
        where, way_out = names()
        raise CorruptSnapshotError(f"{where} is corrupt: record batch {index}: {e}. "
                                   f"{way_out}") from None
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as e:
        where, way_out = names()
        raise CorruptSnapshotError(f"{where} is corrupt: record batch {index} is damaged "
                                   f"({type(e).__name__}: {e}). {way_out}") from None
