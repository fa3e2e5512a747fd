"""What a snapshot stores for each field of an example, and the Arrow columns that hold it.

An example is a ``dict`` of ``str`` keys, a ``tuple``, or a single value. Each value becomes
one :class:`FieldSpec`:

=========  ==============================================  ===================================
kind       Python value                                    Arrow column(s)
=========  ==============================================  ===================================
tensor     ``np.ndarray`` (any shape, fixed ndim)          ``large_list<storage>`` of the flat
                                                           C-order elements, plus
                                                           ``"<name>.shape"``
                                                           (``fixed_size_list<int32>[ndim]``)
                                                           when ndim >= 2
scalar     numpy scalar, or Python ``bool``/``int``/       primitive column (``bool``,
           ``float`` (``python=True``: int64/float64/bool)  ``int*``, ``uint*``, ``float*``)
str        ``str``                                         ``large_string``
bytes      ``bytes``                                       ``large_binary``
=========  ==============================================  ===================================

Storage types: numeric dtypes map to the Arrow type of the same width; ``bool`` tensors are
stored as ``uint8`` (Arrow booleans are bit-packed and cannot be viewed without a copy);
complex numbers as pairs of float32/float64 (two storage elements per element); datetime64 and
timedelta64 as ``int64`` with the unit kept in :attr:`FieldSpec.dtype`. Complex scalars are a
``fixed_size_list<float*>[2]``. Arbitrary Python objects are refused, never pickled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from snapcache.errors import CorruptSnapshotError, SchemaMismatchError, UnsupportedValueError

__all__ = ["FieldSpec", "Schema", "infer_schema", "merge_schemas", "split_example", "classify", "storage_dtype"]

STRUCTURES = ("dict", "tuple", "single")
KINDS = ("tensor", "scalar", "str", "bytes")
SINGLE_NAME = "value"
SHAPE_SUFFIX = ".shape"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_PYTHON_DTYPES = {bool: "bool", int: "int64", float: "float64"}
_PYTHON_NAMES = {"bool": "bool", "int64": "int", "float64": "float"}
_SUPPORTED = (
    "supported values are numpy arrays and numpy scalars of bool, int, uint, float, complex, "
    "datetime64 or timedelta64 dtype, Python bool/int/float, str and bytes "
    "(snapcache never pickles)"
)
_HINTS = {
    list: ("; to store several values return a tuple or a dict (return (image, label)); a "
           "list of numbers becomes a numpy array with np.asarray (pad ragged lists to one "
           "length first, or store each as its own array)"),
    dict: "; flatten nested dicts into top-level keys such as 'a/b'",
    tuple: "; nested tuples are not supported, store each element under its own key",
    type(None): ("; store a placeholder value instead, or leave such examples out with "
                 ".filter(...) before .snapshot()"),
}


def _supported_dtype(dtype: np.dtype) -> bool:
    kind, size = dtype.kind, dtype.itemsize
    return (
        kind in "biumM"
        or (kind == "f" and size in (2, 4, 8))
        or (kind == "c" and size in (8, 16))
    )


def storage_dtype(dtype: np.dtype) -> tuple[np.dtype, int]:
    """Return the numpy dtype of the stored elements and how many of them one element takes."""
    if dtype.kind == "b":
        return np.dtype(np.uint8), 1
    if dtype.kind == "c":
        return np.dtype(f"float{dtype.itemsize * 4}"), 2
    if dtype.kind in "mM":
        return np.dtype(np.int64), 1
    return dtype.newbyteorder("="), 1


_DTYPE_NAMES: dict[np.dtype, str] = {}


def classify(value: Any, where: str) -> tuple[str, str, int, bool]:
    """Return ``(kind, dtype, ndim, python)`` of one value, or raise UnsupportedValueError.

    ``where`` names the value in messages, e.g. ``"key 'image'"`` or ``"tuple element 1"``.
    """
    cls = type(value)
    if cls is np.ndarray:
        name = _DTYPE_NAMES.get(value.dtype)  # dtype.name is slow: this runs per example
        if name is not None:
            return "tensor", name, value.ndim, False
        if _supported_dtype(value.dtype):
            _DTYPE_NAMES[value.dtype] = value.dtype.name
            return "tensor", value.dtype.name, value.ndim, False
        raise UnsupportedValueError(
            f"{where}: numpy array of dtype {value.dtype} is not supported; {_SUPPORTED}"
        )
    if isinstance(value, np.generic):
        name = _DTYPE_NAMES.get(value.dtype)
        if name is not None:
            return "scalar", name, 0, False
        if _supported_dtype(value.dtype):
            _DTYPE_NAMES[value.dtype] = value.dtype.name
            return "scalar", value.dtype.name, 0, False
        raise UnsupportedValueError(
            f"{where}: numpy scalar of type {cls.__name__} is not supported; {_SUPPORTED}"
        )
    if cls in _PYTHON_DTYPES:
        if cls is int and not _INT64_MIN <= value <= _INT64_MAX:
            raise UnsupportedValueError(
                f"{where}: Python int {value} does not fit in int64; store it as a str"
            )
        return "scalar", _PYTHON_DTYPES[cls], 0, True
    if cls is str or cls is bytes:
        if cls is str and not value.isascii():
            _check_utf8(value, where)
        return cls.__name__, "", 0, False
    raise UnsupportedValueError(
        f"{where}: value of type {cls.__module__}.{cls.__qualname__} is not supported; "
        f"{_SUPPORTED}{_HINTS.get(cls, '')}"
    )


def _check_utf8(text: str, where: str) -> None:
    """Refuse a str UTF-8 cannot hold: one with a lone surrogate, as ``os.fsdecode`` makes of
    a file name that is not UTF-8 (``b"caf\\xe9"`` -> ``"caf\\udce9"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UnsupportedValueError(
            f"{where}: the str {text[:60]!r} holds a lone surrogate {text[e.start]!r} at "
            f"position {e.start}, which UTF-8 cannot store (a file name that is not UTF-8, "
            "decoded with os.fsdecode?); store the raw bytes instead (os.fsencode(name)), or "
            "decode them with the right codec") from None


def split_example(example: Any) -> tuple[str, list[tuple[str, str, Any]]]:
    """Return the structure of an example and its ``(name, where, value)`` items."""
    if isinstance(example, dict):
        for key in example:
            if type(key) is not str:
                raise UnsupportedValueError(
                    f"dict keys must be str, got key {key!r} of type {type(key).__name__}"
                )
            if not key.isascii():
                _check_utf8(key, f"key {key!r}")
        items = [(key, f"key {key!r}", value) for key, value in example.items()]
        structure = "dict"
    elif isinstance(example, tuple):
        if type(example) is not tuple:
            raise UnsupportedValueError(
                f"the example is a {type(example).__name__}, a tuple subclass that would come "
                "back as a plain tuple; pass a dict (for a namedtuple: example._asdict())"
            )
        items = [(str(i), f"tuple element {i}", value) for i, value in enumerate(example)]
        structure = "tuple"
    else:
        return "single", [(SINGLE_NAME, "the example", example)]
    if not items:
        raise UnsupportedValueError(f"the example is an empty {structure}; store at least a value")
    return structure, items


@dataclass(frozen=True)
class FieldSpec:
    """One field of an example: its column name, kind, dtype and rank.

    ``shape`` is the shape observed over all rows written, with ``None`` for each dimension
    that varied; it is informative only (filled by ``Encoder.observed_schema()``).
    """

    name: str
    kind: str
    dtype: str = ""
    ndim: int = 0
    python: bool = False
    shape: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise ValueError(f"field name must be a str, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"field {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if type(self.ndim) is not int or not 0 <= self.ndim <= 64:
            raise ValueError(f"field {self.name!r}: ndim must be in [0, 64], not {self.ndim!r}")
        if type(self.python) is not bool:
            raise ValueError(f"field {self.name!r}: python must be a bool, got {self.python!r}")
        if self.kind in ("str", "bytes"):
            if self.dtype or self.ndim or self.python:
                raise ValueError(f"field {self.name!r}: {self.kind} takes no dtype, ndim or python")
        else:
            try:
                dtype = np.dtype(self.dtype)
            except TypeError:
                dtype = None
            if dtype is None or dtype.name != self.dtype or not _supported_dtype(dtype):
                raise ValueError(f"field {self.name!r}: unsupported dtype {self.dtype!r}")
            if self.kind == "scalar" and self.ndim:
                raise ValueError(f"field {self.name!r}: a scalar has ndim 0")
            if self.python and (self.kind != "scalar" or self.dtype not in _PYTHON_NAMES):
                raise ValueError(f"field {self.name!r}: python=True needs a bool, int64 or float64")
        if self.shape is not None:
            if (
                self.kind != "tensor"
                or type(self.shape) is not tuple
                or len(self.shape) != self.ndim
                or not all(d is None or (type(d) is int and d >= 0) for d in self.shape)
            ):
                raise ValueError(f"field {self.name!r}: bad shape {self.shape!r}")

    @property
    def varies(self) -> bool:
        """A tensor field whose shape is not the same in every row written."""
        return self.kind == "tensor" and (self.shape is None or None in self.shape)

    def arrow_fields(self) -> list[pa.Field]:
        """The Arrow column(s) this field is stored in."""
        if self.kind == "str":
            return [pa.field(self.name, pa.large_string(), nullable=False)]
        if self.kind == "bytes":
            return [pa.field(self.name, pa.large_binary(), nullable=False)]
        dtype = np.dtype(self.dtype)
        storage = pa.from_numpy_dtype(storage_dtype(dtype)[0])
        if self.kind == "tensor":
            fields = [pa.field(self.name, pa.large_list(storage), nullable=False)]
            if self.ndim >= 2:
                shape_type = pa.list_(pa.int32(), self.ndim)
                fields.append(pa.field(self.name + SHAPE_SUFFIX, shape_type, nullable=False))
            return fields
        if dtype.kind == "b":
            storage = pa.bool_()
        elif dtype.kind == "c":
            storage = pa.list_(storage, 2)
        return [pa.field(self.name, storage, nullable=False)]

    def describe(self) -> str:
        """One human line, e.g. ``"image: uint8[128, 128, 3]"`` or ``"label: int (python)"``."""
        if self.kind == "tensor":
            dims = self.shape if self.shape is not None else ("?",) * self.ndim
            return f"{self.name}: {self.dtype}[{', '.join(str(d) for d in dims)}]"
        if self.kind == "scalar":
            if self.python:
                return f"{self.name}: {_PYTHON_NAMES[self.dtype]} (python)"
            return f"{self.name}: {self.dtype} (numpy scalar)"
        return f"{self.name}: {self.kind}"


@dataclass(frozen=True)
class Schema:
    """The structure of an example (``"dict"``, ``"tuple"`` or ``"single"``) and its fields.

    >>> schema = infer_schema({"label": 3})
    >>> schema.describe()
    ['label: int (python)']
    """

    structure: str
    fields: tuple[FieldSpec, ...]

    def __post_init__(self) -> None:
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {self.structure!r}")
        if type(self.fields) is not tuple or not self.fields:
            raise ValueError("fields must be a non-empty tuple of FieldSpec")
        if not all(isinstance(f, FieldSpec) for f in self.fields):
            raise ValueError("fields must be a non-empty tuple of FieldSpec")
        names = [f.name for f in self.fields]
        if self.structure == "tuple" and names != [str(i) for i in range(len(names))]:
            raise ValueError(f"tuple fields must be named '0', '1', ...; got {names}")
        if self.structure == "single" and names != [SINGLE_NAME]:
            raise ValueError(f"a single value is one field named {SINGLE_NAME!r}; got {names}")
        columns = [field.name for field in self.arrow_schema()]
        duplicates = sorted({c for c in columns if columns.count(c) > 1})
        if duplicates:
            raise ValueError(f"column names collide: {duplicates} (a key ends in {SHAPE_SUFFIX!r})")

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of record batches holding examples of this schema."""
        return pa.schema([col for field in self.fields for col in field.arrow_fields()])

    def describe(self) -> list[str]:
        """Human lines, one a field."""
        return [field.describe() for field in self.fields]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict for the snapshot manifest; :meth:`from_json` reads it back."""
        fields = []
        for field in self.fields:
            d = asdict(field)
            d["shape"] = None if field.shape is None else list(field.shape)
            fields.append(d)
        return {"structure": self.structure, "fields": fields}

    @classmethod
    def from_json(cls, d: Any) -> Schema:
        """Read :meth:`to_json` output back; malformed input raises CorruptSnapshotError."""
        try:
            if not isinstance(d, dict) or set(d) != {"structure", "fields"}:
                raise ValueError("expected an object with keys 'structure' and 'fields'")
            if not isinstance(d["fields"], list):
                raise ValueError("'fields' must be a list")
            fields = []
            for f in d["fields"]:
                if not isinstance(f, dict) or not {"name", "kind"} <= set(f) <= _FIELD_KEYS:
                    raise ValueError(f"bad field entry {f!r}")
                shape = f.get("shape")
                if isinstance(shape, list):
                    f = {**f, "shape": tuple(shape)}
                fields.append(FieldSpec(**f))
            return cls(d["structure"], tuple(fields))
        except (ValueError, TypeError) as exc:
            raise CorruptSnapshotError(f"malformed schema in the manifest: {exc}") from exc


_FIELD_KEYS = {"name", "kind", "dtype", "ndim", "python", "shape"}


def infer_schema(example: Any) -> Schema:
    """Infer the schema of a snapshot from its first example.

    >>> infer_schema({"image": np.zeros((2, 2), np.uint8)}).describe()
    ['image: uint8[?, ?]']
    """
    structure, items = split_example(example)
    fields = tuple(FieldSpec(name, *classify(value, where)) for name, where, value in items)
    try:
        return Schema(structure, fields)
    except ValueError as exc:
        raise UnsupportedValueError(f"the example cannot be stored: {exc}") from exc


def merge_schemas(a: Schema, b: Schema, *, where: str = "") -> Schema:
    """One schema for examples written by two writers (two streams of one snapshot).

    Fields must agree in name, kind, dtype, rank and Python-ness; observed shapes are merged,
    keeping a dimension where both agree and ``None`` where they differ.
    """
    prefix = f"{where}: " if where else ""
    if a.structure != b.structure or [f.name for f in a.fields] != [f.name for f in b.fields]:
        raise SchemaMismatchError(
            f"{prefix}streams wrote different example structures: {a.describe()} vs "
            f"{b.describe()}")
    fields = []
    for fa, fb in zip(a.fields, b.fields):
        if (fa.kind, fa.dtype, fa.ndim, fa.python) != (fb.kind, fb.dtype, fb.ndim, fb.python):
            raise SchemaMismatchError(
                f"{prefix}streams disagree on field {fa.name!r}: {fa.describe()} vs "
                f"{fb.describe()}; every example of a snapshot must match, cast or reshape "
                "them in the function producing them")
        shape = fa.shape
        if fa.shape is not None and fb.shape is not None:
            shape = tuple(x if x == y else None for x, y in zip(fa.shape, fb.shape))
        elif fa.shape is None:
            shape = fb.shape
        fields.append(FieldSpec(fa.name, fa.kind, fa.dtype, fa.ndim, fa.python, shape))
    return Schema(a.structure, tuple(fields))
