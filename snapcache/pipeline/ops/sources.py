"""Sources: where examples come from (in-memory collections, generators, ranges, files,
Parquet, map-style torch datasets), with their runners.

Every source honours the current stream (:mod:`snapcache.pipeline.streams`): it yields its
share of the examples, after skipping the ones a resumed snapshot already holds. A source is
``seekable`` when it can start at any example by index.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

from snapcache.errors import FingerprintError
from snapcache.fingerprint import FingerprintNode, detect_dataset_randomness, hash_value
from snapcache.fingerprint import sources as source_fp
from snapcache.pipeline import streams
from snapcache.pipeline.ops.base import Op, Traits, callable_name, runs
from snapcache.store import parquet
from snapcache.store.source_files import file_identities as bulk_identities

def file_identities(urls: Any, strict: bool, storage_options: dict) -> list[dict]:
    """What fingerprints a list of files (path, size, mtime or ETag; content if ``strict``):
    read here, in the pipeline, so that fingerprinting stays pure."""
    return bulk_identities([str(url) for url in urls], strict, storage_options)


class UnitSource:
    """What a source made of files offers delta snapshots (see ``Traits.units``): its units'
    identities, itself restricted to some units, and each unit's length when known."""

    urls: tuple[str, ...]
    storage_options: dict

    def file_identities(self) -> list[dict]:
        """Each file's identity (path, size, mtime or ETag), taken once per op object: what an
        ordinary snapshot's fingerprint counts."""
        return self.memo("file_identities", lambda: file_identities(
            self.urls, getattr(self, "strict", False), self.storage_options))

    def unit_identities(self, known: Callable[[], list[dict]] | None = None) -> list[dict]:
        """Each unit's identity, in order: here a file's. ``known()`` lists the units of the
        lineage's newest version (sources whose identities cost reads use it to skip the files
        that did not change)."""
        return self.file_identities()

    def with_units(self, units: Any) -> Op:
        """This source restricted to ``units`` (identities of some of its units, in order)."""
        return dataclasses.replace(self, urls=tuple(str(u["path"]) for u in units))

    def unit_lengths(self, units: Any) -> list[int] | None:
        """Examples each of ``units`` yields, in order (None: not known without reading)."""
        return [1] * len(units)


SEEKABLE = Traits(source=True, seekable=True, strided=True, length="rule")
"""A source that can start at any example, splits between streams by position
(:func:`streams.split`) and whose length is known up front."""


def in_order(items: Any, what: str, name: str, key: Callable[[Any], Any] | None = None
             ) -> Any:
    """A set given as a source, sorted (``key``: by the key); anything else as it is.

    A set's iteration order changes from one process to the next (str and bytes hashes are
    salted per process, ``PYTHONHASHSEED``), and a source's order is the order of the examples
    and counts in the fingerprint: as it is, every run would compute another snapshot. Sorted,
    the order is the same in every process, provided the elements (their keys) have one total
    order: str, bytes, numbers without NaN, paths, tuples of these. Any other set is refused."""
    if not isinstance(items, (set, frozenset)):
        return items
    try:
        listed = sorted(items, key=key)
        keys = listed if key is None else [key(x) for x in listed]
        # equal keys (path "a" and Path("a")) name one file: either order expands alike
        ordered = all(map(_totally_ordered, keys)) and all(
            a < b or (key is not None and a == b) for a, b in zip(keys, keys[1:]))
    except TypeError:
        ordered = False
    if not ordered:
        raise TypeError(
            f"{what} got a {type(items).__name__} whose elements have no single order (only "
            "sets of str, bytes, numbers without NaN, paths, or tuples of these are sorted); "
            "a set's order changes from one process to the next (PYTHONHASHSEED), and with "
            f"it the order of the examples and the snapshot's fingerprint. Pass {name} as a "
            f"list in the order you want, e.g. sorted({name}, key=...).")
    return listed


_TOTALLY_ORDERED = (str, bytes, int, float, pathlib.PurePath)  # bool is an int


def _totally_ordered(x: Any) -> bool:
    if isinstance(x, tuple):
        return all(map(_totally_ordered, x))
    return isinstance(x, _TOTALLY_ORDERED) and not (isinstance(x, float) and x != x)


@dataclass(frozen=True, eq=False)
class IterableSource(Op):
    items: Any = None
    kind: ClassVar[str] = "from_iterable"
    fingerprint_source: ClassVar = ("items",)

    @property
    def traits(self) -> Traits:
        return Traits(source=True, seekable=streams.indexable(self.items), strided=True,
                      length="rule")

    def describe(self) -> str:
        n = len(self.items) if hasattr(self.items, "__len__") else "?"
        return f"from_iterable({n} items)"

    def length(self, upstream: int | None) -> int | None:
        return len(self.items) if hasattr(self.items, "__len__") else None

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_iterable_source(self.items, label="items")]


@runs(IterableSource)
def run_iterable(op: IterableSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.items)


@dataclass(frozen=True, eq=False)
class GeneratorSource(Op):
    fn: Callable[..., Any] = None  # type: ignore[assignment]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_generator"
    TRAITS: ClassVar = Traits(source=True, strided=True)
    fingerprint_source: ClassVar = ("fn", "args", "kwargs")

    def describe(self) -> str:
        return f"from_generator({callable_name(self.fn)})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_generator_source(self.fn, self.args, self.kwargs)]


@runs(GeneratorSource)
def run_generator(op: GeneratorSource, epoch: int) -> Iterator[Any]:
    produced = op.fn(*op.args, **op.kwargs)
    try:
        iter(produced)
    except TypeError:
        raise TypeError(
            f"from_generator: {callable_name(op.fn)}(...) returned "
            f"{type(produced).__name__}, not an iterable; pass a generator function") from None
    return streams.split(produced)


@dataclass(frozen=True, eq=False)
class RangeSource(Op):
    start: int = 0
    stop: int = 0
    step: int = 1
    kind: ClassVar[str] = "range"
    TRAITS: ClassVar = SEEKABLE
    fingerprint_source: ClassVar = ("start", "stop", "step")

    def describe(self) -> str:
        return f"range({self.start}, {self.stop}" + (f", {self.step})" if self.step != 1 else ")")

    def length(self, upstream: int | None) -> int | None:
        return len(range(self.start, self.stop, self.step))

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_range_source(self.start, self.stop, self.step)]


@runs(RangeSource)
def run_range(op: RangeSource, epoch: int) -> Iterator[Any]:
    return iter(streams.split_range(op.start, op.stop, op.step))


@dataclass(frozen=True, eq=False)
class FilesSource(UnitSource, Op):
    urls: tuple[str, ...] = ()
    strict: bool = False
    storage_options: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_files"
    TRAITS: ClassVar = Traits(source=True, seekable=True, strided=True, length="rule",
                              units=True)
    fingerprint_source: ClassVar = ("urls", "strict")
    not_fingerprinted: ClassVar = ("storage_options",)

    def describe(self) -> str:
        return f"from_files({len(self.urls)} files)"

    def length(self, upstream: int | None) -> int | None:
        return len(self.urls)

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.file_identities(), strict=self.strict)]

    def lineage_children(self, where: str) -> list[FingerprintNode]:
        """What counts of this source in a delta snapshot's lineage: not its files."""
        return [source_fp.files_lineage_node(strict=self.strict)]


@runs(FilesSource)
def run_files(op: FilesSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.urls)


@dataclass(frozen=True, eq=False)
class ParquetSource(UnitSource, Op):
    """Rows of Parquet files, as dicts of column values; split by file or row group. In a delta
    snapshot each row group is a unit, keyed by the content of its column chunks."""
    urls: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None
    storage_options: dict = field(default_factory=dict)
    row_groups: tuple[tuple[str, int, int], ...] | None = None
    """Set only by a delta build (:meth:`with_units`): the (url, row group, rows) to read,
    instead of every row group of ``urls``. Never fingerprinted: a build's piece of the
    source, not a pipeline anyone writes."""
    kind: ClassVar[str] = "from_parquet"
    TRAITS: ClassVar = Traits(source=True, seekable=True, units=True)
    fingerprint_source: ClassVar = ("urls", "columns")
    not_fingerprinted: ClassVar = ("storage_options", "row_groups")

    def describe(self) -> str:
        return f"from_parquet({len(self.urls)} files)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.file_identities()),
                hash_value(self.columns, "argument `columns`", where=where)]

    def unit_identities(self, known: Callable[[], list[dict]] | None = None) -> list[dict]:
        """Each row group's identity: ``path``, ``row_group``, ``rows``, ``size`` (bytes
        hashed), ``xxh3_128`` (their digest) and its file's ``file_size`` and ``mtime_ns`` or
        ``etag``. A file whose (size, mtime | ETag) equals that of the newest version
        (``known()``) keeps its row groups' identities unread; the others are read and hashed
        (:func:`snapcache.store.parquet.row_group_digests`)."""
        def compute() -> list[dict]:
            files = self.file_identities()
            by_path: dict[str, dict[int, dict]] = {}  # a file listed twice: its groups once
            for unit in (known() if known is not None else ()):
                if unit.get("row_group") is not None:
                    by_path.setdefault(str(unit["path"]), {})[unit["row_group"]] = unit
            units = []
            for identity in files:
                same = _unchanged(by_path.get(str(identity["path"]), {}).values(), identity)
                if same is not None:
                    units += same
                    continue
                stamp = {k: identity[k] for k in ("mtime_ns", "etag") if k in identity}
                for group in parquet.row_group_digests(str(identity["path"]), self.columns,
                                                       self.storage_options):
                    units.append({"path": identity["path"], "row_group": group.index,
                                  "rows": group.rows, "size": group.nbytes,
                                  "xxh3_128": group.digest, "file_size": identity.get("size"),
                                  **stamp})
            return units

        return self.memo("unit_identities", compute)

    def with_units(self, units: Any) -> Op:
        units = list(units)
        return dataclasses.replace(
            self, urls=tuple(dict.fromkeys(str(u["path"]) for u in units)),
            row_groups=tuple((str(u["path"]), int(u["row_group"]), int(u["rows"]))
                             for u in units))

    def unit_lengths(self, units: Any) -> list[int] | None:
        return [int(u["rows"]) for u in units]  # from the footers read for their identities

    def lineage_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.row_groups_lineage_node(),
                hash_value(self.columns, "argument `columns`", where=where)]


def _unchanged(known: Any, file: dict) -> list[dict] | None:
    """The row groups ``known`` of a file (from the newest version) if they are all of it, as
    it is now: every one stamped with the file's current size and mtime | ETag, indices
    0..n-1. None otherwise (the file is read and hashed again)."""
    stamp = (file.get("size"), file.get("mtime_ns"), file.get("etag"))
    groups = sorted(known, key=lambda u: u["row_group"])
    if not groups or [u["row_group"] for u in groups] != list(range(len(groups))) or any(
            (u.get("file_size"), u.get("mtime_ns"), u.get("etag")) != stamp for u in groups):
        return None
    return groups


@runs(ParquetSource)
def run_parquet(op: ParquetSource, epoch: int) -> Iterator[Any]:
    spec = streams.current()
    if op.row_groups is not None:  # a delta build's units: these row groups, in this order
        pieces = [parquet.Piece(url, (group,), rows) for url, group, rows in op.row_groups]
        pieces = pieces[spec.index::spec.count]
    else:
        # The pieces are listed now, in the caller's context (streams travel in a context
        # variable).
        pieces = parquet.stream_pieces(op.urls, spec.index, spec.count, op.storage_options)
    return parquet.read_pieces(pieces, op.columns, skip=spec.skip,
                               storage_options=op.storage_options)


@dataclass(frozen=True, eq=False)
class TorchSource(Op):
    """A map-style dataset (``__getitem__`` and ``__len__``), read by index."""
    dataset: Any = None
    kind: ClassVar[str] = "from_torch"
    TRAITS: ClassVar = Traits(source=True, seekable=True, strided=True)
    fingerprint_source: ClassVar = ("dataset",)

    def describe(self) -> str:
        return f"from_torch({type(self.dataset).__name__}, {len(self.dataset)} items)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        try:
            children = [hash_value(self.dataset, f"dataset `{type(self.dataset).__name__}`",
                                   where=where)]
        except FingerprintError as e:
            raise FingerprintError(
                f"from_torch: the dataset cannot be fingerprinted: {e}. Name the version "
                "yourself with .snapshot(path, key='my-data-v1'), or teach snapcache the type "
                "with snapcache.fingerprint.register(type, fn)") from e
        files = named_files(self.dataset)
        if files:  # what __getitem__ reads: a file rewritten under its name is new data
            children.append(source_fp.named_files_node(files))
        return children

    def randomness_problems(self) -> list[str]:
        # What ``dataset[i]`` draws at random: a random ``transform`` inside the dataset is the
        # torchvision way of augmenting, and upstream of a snapshot it is frozen.
        return [f"from_torch {problem}" for problem in detect_dataset_randomness(self.dataset)]


def named_files(dataset: Any) -> list[tuple[str, int, int]]:
    """The local files a map-style dataset's attributes name, in order, each as ``(path,
    size, mtime_ns)`` (one ``stat``): a ``str`` or ``os.PathLike`` attribute, or one in a list
    or tuple attribute (also one tuple deep: torchvision's ``samples``, ``(path, class)``
    pairs), that is an existing regular file. Such a dataset reads them in ``__getitem__``;
    they count as ``from_files`` counts its files (path, size, mtime)."""
    def names(value: Any, depth: int) -> Iterator[Any]:
        if isinstance(value, (str, os.PathLike)):
            yield value
        elif depth < 2 and isinstance(value, (list, tuple)):
            for item in value:
                yield from names(item, depth + 1)

    found = []
    for value in getattr(dataset, "__dict__", {}).values():
        for name in names(value, 0):
            path = os.fspath(name)
            if not isinstance(path, str) or "://" in path or "\n" in path or len(path) > 4096:
                continue
            try:
                st = os.stat(path)
            except (OSError, ValueError):  # not a file's name
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((path, st.st_size, st.st_mtime_ns))
    return found


@runs(TorchSource)
def run_torch(op: TorchSource, epoch: int) -> Iterator[Any]:
    from snapcache.adapters.torch import numpy_example  # imports no torch itself

    spec = streams.current()
    dataset = op.dataset
    # By index, always: iter() of a map-style dataset would call __getitem__ until IndexError.
    indices = range(spec.index + spec.count * spec.skip, len(dataset), spec.count)
    return (numpy_example(dataset[i]) for i in indices)
