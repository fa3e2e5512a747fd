"""Hashing many in-memory examples of one structure at numpy speed, with the same digest as
feeding them one by one.

An in-memory source (``Dataset.from_iterable``) is fingerprinted by streaming every example's
canonical encoding (:func:`snapcache.fingerprint.canonical.feed_value`) into one xxh3 hasher.
Done example by example in Python that runs at ~50 MB/s for small examples. Here the examples
are taken in chunks: the structure of the chunk's first example (dicts with str keys, tuples,
lists, with numpy arrays, numpy scalars, ints, floats, bools, None, str or bytes as leaves)
becomes a :class:`Layout`, every example of the chunk is checked against it column by column
(C-level ``map`` calls, no Python code per example; how, worked out once by :class:`_Plan`),
and the bytes are fed as a few large buffers: the large arrays' own buffers (and str and bytes
values' bytes), and one row of a kept matrix per example for everything between them (small
arrays' bytes copied in).

The bytes fed are exactly the bytes :func:`feed_value` feeds, so digests do not change: the
framing (dict and sequence headers, keys, their order) is not restated here but read off the
canonical encoder by encoding a skeleton of the first example whose leaves are unique markers;
each leaf's constant prefix (type tag, dtype, shape) is read off the encoding of the first
example's leaf and checked. Arrays that are not C-contiguous are hashed in their C order, as
:func:`feed_value` does. A chunk that does not fit (another structure, dtype or shape, an int
beyond 64 bits, a dict subclass, an object array ...) is fed one example at a time.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
import struct
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import xxhash

from snapcache.fingerprint.canonical import feed_value
from snapcache.fingerprint.tree import Unhashable, Walk

__all__ = ["hash_items"]

CHUNK_BYTES = 512 << 10
"""About this many bytes of examples per chunk."""
SMALL_ARRAY = 4096
"""Arrays up to this size are copied into one matrix with the rest of their example; larger
ones are fed as their own buffers."""

_TEXT = {"str": lambda v: v.encode("utf-8", "surrogatepass"), "bytes": lambda v: v}
"""The bytes a str or bytes leaf feeds after its tag and length (as :func:`feed_value`)."""
_MAX_LEAVES = 64
_MAX_DEPTH = 8
_MARK = b"\xffsnapcache:bulk-marker\xfe"
_NUMERIC = "biufc"


class _Recorder:
    """A stand-in for a hasher that keeps what it is fed."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, data: Any) -> None:
        self.parts.append(bytes(data))

    def value(self) -> bytes:
        return b"".join(self.parts)


def _encoding(value: Any) -> bytes:
    r = _Recorder()
    feed_value(r, value, Walk())
    return r.value()


@dataclass
class _Leaf:
    path: tuple
    kind: str            # "array", "int", "float", "bool", "scalar", "none", "str", "bytes"
    type: type
    dtype: Any = None    # arrays and numpy scalars
    shape: tuple = ()
    prefix: bytes = b""  # the constant bytes before the payload
    size: int = 0        # payload bytes (arrays: fed as their own buffer; str, bytes: the
    #                      8-byte length, their bytes fed as their own buffer)
    table: tuple = ()    # bools: (encoding of False, encoding of True)
    typical: int = 0     # str, bytes: the first example's bytes (sizes chunks)


def _payload(leaf: _Leaf, value: Any) -> bytes:
    if leaf.kind == "array":
        return np.ascontiguousarray(value).tobytes()
    if leaf.kind == "int":
        return struct.pack("<q", value)
    if leaf.kind == "float":
        return struct.pack("<d", math.nan if value != value else value)
    if leaf.kind == "scalar":
        return np.asarray(value).tobytes()
    if leaf.kind in _TEXT:
        data = _TEXT[leaf.kind](value)
        return len(data).to_bytes(8, "little") + data
    return b""


def _leaf(path: tuple, value: Any) -> _Leaf | None:
    t = type(value)
    if t is np.ndarray:
        dt = value.dtype
        if dt.kind not in _NUMERIC or dt.byteorder == ">" or dt.fields or dt.subdtype:
            return None
        leaf = _Leaf(path, "array", t, dt, value.shape, size=value.nbytes)
    elif t is int:
        if not -(1 << 63) <= value < (1 << 63):
            return None
        leaf = _Leaf(path, "int", t, size=8)
    elif t is float:
        leaf = _Leaf(path, "float", t, size=8)
    elif t is bool:
        table = (_encoding(False), _encoding(True))
        if len(table[0]) != len(table[1]):
            return None
        return _Leaf(path, "bool", t, size=len(table[0]), table=table)
    elif t is type(None):
        leaf = _Leaf(path, "none", t)
    elif t is str or t is bytes:
        leaf = _Leaf(path, t.__name__, t, size=8, typical=len(_TEXT[t.__name__](value)))
    elif isinstance(value, np.generic) and value.dtype.kind in _NUMERIC \
            and value.dtype.byteorder != ">":
        leaf = _Leaf(path, "scalar", t, value.dtype, size=value.dtype.itemsize)
    else:
        return None
    encoded, payload = _encoding(value), _payload(leaf, value)
    if not encoded.endswith(payload):
        return None  # the canonical encoding is not prefix + payload: leave it to feed_value
    leaf.prefix = encoded[:len(encoded) - len(payload)]
    return leaf


class Layout:
    """The byte layout shared by every example of one structure.

    ``segments`` is the encoding of one example in stream order: ``bytes`` (constant) or a
    :class:`_Leaf` (prefix + payload). ``containers`` maps every container's path to its type,
    length and (dicts) keys, for checking."""

    def __init__(self, example: Any):
        self.ok = False
        self.leaves: list[_Leaf] = []
        self.containers: dict[tuple, tuple[type, int, tuple | None]] = {}
        self._plan: _Plan | None = None
        skeleton = self._skeleton(example, (), set())
        if skeleton is None or not self.leaves:
            return
        stream = _encoding(skeleton)
        found = []
        for i, leaf in enumerate(self.leaves):
            marker = _encoding(_MARK + i.to_bytes(4, "little"))
            if stream.count(marker) != 1:
                return  # the leaf's encoding is not inline (e.g. a dict with non-str keys)
            found.append((stream.index(marker), len(marker), leaf))
        found.sort(key=lambda f: f[0])
        self.segments: list[Any] = []
        at = 0
        for start, length, leaf in found:
            if start > at:
                self.segments.append(stream[at:start])
            self.segments.append(leaf)
            at = start + length
        if at < len(stream):
            self.segments.append(stream[at:])
        self.record = sum(len(s) if isinstance(s, bytes) else len(s.prefix) + s.size +
                          s.typical for s in self.segments)
        self.ok = True

    def _skeleton(self, value: Any, path: tuple, seen: set) -> Any:
        t = type(value)
        if t in (dict, tuple, list):
            if len(path) >= _MAX_DEPTH or id(value) in seen:
                return None
            if t is dict and not all(type(k) is str for k in value):
                return None
            keys = tuple(value) if t is dict else None
            self.containers[path] = (t, len(value), keys)
            seen = seen | {id(value)}
            pairs = value.items() if t is dict else enumerate(value)
            out = {}
            for k, v in pairs:
                sk = self._skeleton(v, path + (k,), seen)
                if sk is None:
                    return None
                out[k] = sk
            return out if t is dict else t(out.values())
        if len(self.leaves) >= _MAX_LEAVES:
            return None
        leaf = _leaf(path, value)
        if leaf is None:
            return None
        marker = _MARK + len(self.leaves).to_bytes(4, "little")
        self.leaves.append(leaf)
        return marker

    # -- one chunk ------------------------------------------------------------------------
    def parts(self, chunk: list) -> list | None:
        """The buffers to feed for ``chunk`` (in order), or None if an example does not fit."""
        if self._plan is None:
            self._plan = _Plan(self)
        return self._plan.parts(chunk)


class _Plan:
    """How a :class:`Layout`'s chunks are checked and laid out, worked out once.

    An example's stream is a row of one or more *matrices* (constant bytes filled in once,
    payloads column by column) with the large arrays between them, fed as their own buffers.
    The matrices are kept and refilled chunk after chunk (fresh memory each chunk costs a
    page fault per 4 KiB). Per chunk: one C-level pass per check and per column, no Python
    code per example, and little Python code per chunk: the steps are compiled here into flat
    lists of columns (by index), getters and expected values.

    A container column is checked in two passes: the types (exact), then its entries' keys
    (dicts) flattened into one list compared with the expected keys repeated, plus the keys'
    own types (a ``str`` subclass equal to a key is encoded otherwise) -- which settles every
    dict's length and key order at once; a tuple's or list's length by the sum of lengths once
    every index is there. Checks count matches (``list.count``: identity first, no hashing)."""

    def __init__(self, layout: Layout):
        index: dict[tuple, int] = {(): 0}
        self.containers = []  # (column, type, n, getters, keys or None, first child column)
        for path in sorted(layout.containers, key=len):
            t, n, keys = layout.containers[path]
            first, getters = len(index), []
            for key in (keys if keys is not None else range(n)):
                index[path + (key,)] = len(index)
                getters.append(operator.itemgetter(key))
            self.containers.append((index[path], t, n, getters,
                                    list(keys) if keys is not None else None, first))
        self.columns = len(index)
        self.types = [(index[leaf.path], leaf.type) for leaf in layout.leaves]
        self.slots: list[Any] = []   # per piece of an example: a matrix index or a large leaf
        self.fields: list[list] = []  # per matrix: (offset, leaf or constant bytes)
        self.widths: list[int] = []
        fields: list = []
        at = 0

        def close() -> None:
            nonlocal fields, at
            if fields:
                self.slots.append(len(self.fields))
                self.fields.append(fields)
                self.widths.append(at)
            fields, at = [], 0

        for segment in layout.segments:
            if isinstance(segment, bytes):
                fields.append((at, segment))
                at += len(segment)
                continue
            if segment.prefix:
                fields.append((at, segment.prefix))
                at += len(segment.prefix)
            if segment.kind == "array" and segment.size > SMALL_ARRAY:
                close()
                self.slots.append(segment)
            elif segment.kind in _TEXT:  # the length in the matrix, then the bytes alone
                fields.append((at, segment))
                at += segment.size
                close()
                self.slots.append(segment)
            elif segment.kind != "none":
                fields.append((at, segment))
                at += segment.size
        close()
        self.leaves = layout.leaves
        self.column_of = {id(leaf): index[leaf.path] for leaf in layout.leaves}
        # per matrix, its payload fields: (leaf, column, start, stop)
        self.fills = [[(f, self.column_of[id(f)], at, at + f.size) for at, f in fields
                       if not isinstance(f, bytes)] for fields in self.fields]
        self.matrices: list[np.ndarray] = []

    def _matrices(self, k: int) -> list[np.ndarray]:
        if not self.matrices or len(self.matrices[0]) < k:
            self.matrices = []
            for fields, width in zip(self.fields, self.widths):
                m = np.empty((k, width), np.uint8)
                for at, f in fields:
                    if isinstance(f, bytes):
                        m[:, at:at + len(f)] = np.frombuffer(f, np.uint8)
                self.matrices.append(m)
        return [m[:k] for m in self.matrices]

    def parts(self, chunk: list) -> list | None:
        k = len(chunk)
        cols: list[Any] = [None] * self.columns
        cols[0] = chunk
        for c, t, n, getters, keys, first in self.containers:
            col = cols[c]
            if list(map(type, col)).count(t) != k:
                return None
            if keys is not None:  # every dict's keys, in order, are the layout's
                flat = list(_flatten(col))
                if flat != keys * k or list(map(type, flat)).count(str) != len(flat):
                    return None
            try:
                for j, get in enumerate(getters):
                    cols[first + j] = list(map(get, col))
            except (KeyError, IndexError, TypeError):
                return None
            # every index is there (each has >= n): the sum of lengths settles the rest
            if keys is None and sum(map(len, col)) != n * k:
                return None
        for c, t in self.types:
            if list(map(type, cols[c])).count(t) != k:
                return None
        matrices = self._matrices(k)
        large = {id(leaf): _encoded(leaf, cols[self.column_of[id(leaf)]])
                 for leaf in self.leaves if leaf.kind in _TEXT}
        for m, fills in zip(matrices, self.fills):
            for leaf, c, start, stop in fills:
                payload = _lengths(large[id(leaf)], k) if leaf.kind in _TEXT else \
                    _payload_of(leaf, cols[c], k)
                if payload is None:
                    return None
                if payload.ndim == 1:  # one number per example: its bytes, as one element
                    m[:, start:stop].view(payload.dtype)[:, 0] = payload
                else:
                    m[:, start:stop] = payload
        for slot in self.slots:
            if not isinstance(slot, int) and slot.kind == "array":
                col = cols[self.column_of[id(slot)]]
                if not _arrays_fit(col, slot, k):
                    return None
                large[id(slot)] = list(map(np.ascontiguousarray, col))
        if len(self.slots) == 1:
            return [matrices[0]]  # every example is one row of one matrix: one buffer
        rows = [large[id(slot)] if not isinstance(slot, int) else
                matrices[slot].view(f"V{self.widths[slot]}").ravel().tolist()
                for slot in self.slots]
        out: list[Any] = [None] * (k * len(rows))
        for i, r in enumerate(rows):
            out[i::len(rows)] = r
        return out


def _encoded(leaf: _Leaf, col: list) -> list:
    """The bytes each str (or bytes) value of ``col`` feeds after its tag and length."""
    if leaf.kind == "bytes":
        return col
    return list(map(str.encode, col, itertools.repeat("utf-8"),
                    itertools.repeat("surrogatepass")))


def _lengths(encoded: list, k: int) -> np.ndarray:
    return np.fromiter(map(len, encoded), np.dtype("<u8"), count=k).view(np.uint8).reshape(k, 8)


def _payload_of(leaf: _Leaf, col: list, k: int) -> Any:
    """The (k, size) payload matrix (or something broadcasting to it), or for a number the (k,)
    little-endian values whose bytes are the payload, of a leaf whose column ``col`` holds values
    of the leaf's type; None if one does not fit."""
    if leaf.kind == "array":
        if not _arrays_fit(col, leaf, k):
            return None
        try:  # C-contiguous buffers (nearly always): joined without a copy of each
            joined = b"".join(col)
        except (ValueError, BufferError, TypeError):
            joined = b"".join(map(np.ascontiguousarray, col))
        return np.frombuffer(joined, np.uint8).reshape(k, leaf.size)
    if leaf.kind == "bool":
        flags = np.fromiter(col, np.bool_, count=k)
        f, t = (np.frombuffer(e, np.uint8) for e in leaf.table)
        return np.where(flags[:, None], t, f)
    if leaf.kind == "int":
        try:
            values = np.fromiter(col, np.dtype("<i8"), count=k)
        except OverflowError:
            return None
    elif leaf.kind == "float":
        values = np.fromiter(col, np.dtype("<f8"), count=k)
        values[np.isnan(values)] = math.nan
    else:
        values = np.array(col)
        if values.dtype != leaf.dtype:
            return None
        values = values.astype(values.dtype.newbyteorder("<"), copy=False)
    return values


_DTYPE = operator.attrgetter("dtype")
_NDIM = operator.attrgetter("ndim")
_SIZE = operator.attrgetter("size")
_SHAPE = operator.attrgetter("shape")
_flatten = itertools.chain.from_iterable


def _arrays_fit(col: list, leaf: _Leaf, k: int) -> bool:
    """Has every array of ``col`` (all ``np.ndarray``, checked) the leaf's dtype and shape?
    (ndim and len settle 1-d shapes, and with size 2-d ones, more cheaply than comparing shape
    tuples; counting matches compares identical objects first and hashes nothing.)"""
    shape = leaf.shape
    if list(map(_DTYPE, col)).count(leaf.dtype) != k:
        return False
    if len(shape) == 0 or len(shape) > 2:
        return list(map(_SHAPE, col)).count(shape) == k
    if list(map(_NDIM, col)).count(len(shape)) != k or list(map(len, col)).count(shape[0]) != k:
        return False
    return len(shape) == 1 or list(map(_SIZE, col)).count(shape[0] * shape[1]) == k


class _Chunks:
    """``items`` in consecutive lists, each as long as ``size`` says when it is taken."""

    def __init__(self, items: Iterable[Any]):
        self.items, self.size, self.at = items, 1, 0
        self.it = None if type(items) in (list, tuple) else iter(items)

    def __iter__(self) -> Iterator[list]:
        while True:
            if self.it is None:  # a slice of a list is a new list; of a tuple, made one
                chunk = self.items[self.at:self.at + self.size]
                chunk = chunk if type(chunk) is list else list(chunk)
            else:
                chunk = list(itertools.islice(self.it, self.size))
            if not chunk:
                return
            self.at += len(chunk)
            yield chunk


def _rows_parts(items: np.ndarray, start: int, stop: int, prefix: bytes) -> list:
    """A C-contiguous chunk of an array's rows (each example is a row)."""
    rows = np.ascontiguousarray(items[start:stop])
    k = len(rows)
    matrix = np.empty((k, len(prefix) + rows[0].nbytes if k else 0), np.uint8)
    matrix[:, :len(prefix)] = np.frombuffer(prefix, np.uint8)
    matrix[:, len(prefix):] = rows.reshape(k, -1).view(np.uint8)
    return [matrix]


def hash_items(items: Iterable[Any]) -> tuple[bytes, int]:
    """The xxh3-128 digest of the canonical encodings of ``items``, in order, and their count.

    Raises :class:`Unhashable` (with ``item #i`` in its path) for an item that cannot be
    encoded."""
    h = xxhash.xxh3_128()
    count = 0
    if type(items) is np.ndarray and items.ndim >= 1 and len(items):
        leaf = _leaf((), items[0]) if sys.byteorder == "little" else None
        if leaf is not None:
            per = max(1, CHUNK_BYTES // max(1, leaf.size + len(leaf.prefix)))
            for start in range(0, len(items), per):
                for part in _rows_parts(items, start, start + per, leaf.prefix):
                    h.update(part)
            return h.digest(), len(items)
    walk = Walk()
    layout: Layout | None = None
    chunks = _Chunks(items)
    for chunk in chunks:  # the first chunk is one item: it sizes the others
        parts = None
        if sys.byteorder == "little":
            if layout is None or not layout.ok or (parts := layout.parts(chunk)) is None:
                layout = Layout(chunk[0])
                parts = layout.parts(chunk) if layout.ok else None
        if parts is not None:  # buffers of ours or contiguous arrays: updates cannot fail
            collections.deque(map(h.update, parts), maxlen=0)
        else:
            for i, item in enumerate(chunk):
                try:
                    feed_value(h, item, walk)
                except Unhashable as e:
                    e.path.append(f"item #{count + i}")
                    raise
        count += len(chunk)
        record = layout.record if layout is not None and layout.ok else 4096
        chunks.size = max(16, min(65536, CHUNK_BYTES // max(1, record)))
    return h.digest(), count
