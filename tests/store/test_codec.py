"""Tests of snapcache.store.codec: exact round trips through Arrow IPC, schemas and errors."""

from __future__ import annotations

import io
import json
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcache.errors import CorruptSnapshotError, SchemaMismatchError, UnsupportedValueError
from snapcache.store.codec import Decoder, Encoder, FieldSpec, Schema, infer_schema

from equality import assert_same_example, assert_same_value

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
    "datetime64[ms]", "datetime64[D]", "timedelta64[s]",
]  # fmt: skip


# ---------------------------------------------------------------------------------- helpers


def ipc_round_trip(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Write batches to an in-memory zstd-compressed Arrow IPC file and read them back."""
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    reader = pa.ipc.open_file(pa.BufferReader(sink.getvalue()))
    return [reader.get_batch(i) for i in range(reader.num_record_batches)]


def field_values(schema: Schema, example: Any) -> dict[str, Any]:
    if schema.structure == "dict":
        return example
    if schema.structure == "tuple":
        return {str(i): v for i, v in enumerate(example)}
    return {"value": example}


def assert_columns(schema: Schema, examples: list[Any], columns: dict[str, Any]) -> None:
    assert list(columns) == [f.name for f in schema.fields]
    for spec in schema.fields:
        expected = [field_values(schema, ex)[spec.name] for ex in examples]
        column = columns[spec.name]
        if spec.kind == "tensor":
            if isinstance(column, np.ndarray):
                assert len({e.shape for e in expected}) <= 1
                assert column.shape[0] == len(expected) and not column.flags.writeable
                rows = [column[i, ...] for i in range(len(expected))]
            else:
                assert len({e.shape for e in expected}) > 1
                rows = column
            for e, g in zip(expected, rows, strict=True):
                assert_same_value(e, g)
        elif spec.kind == "scalar":
            assert isinstance(column, np.ndarray) and column.shape == (len(expected),)
            if spec.python:
                assert column.dtype == np.dtype(spec.dtype)
                for e, g in zip(expected, column.tolist(), strict=True):
                    assert_same_value(e, g)
            else:
                for e, i in zip(expected, range(len(expected)), strict=True):
                    assert_same_value(e, column[i])
        else:
            assert column == expected


# ------------------------------------------------------------------------------- strategies


@st.composite
def tensors(draw: st.DrawFn, dtype: np.dtype, ndim: int) -> np.ndarray:
    shape = draw(hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0, max_side=4))
    array = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["c", "fortran", "strided", "big-endian"]))
    if layout == "fortran" and ndim:  # np.asfortranarray turns 0-d arrays into 1-d
        array = np.asfortranarray(array)
    elif layout == "strided" and ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    elif layout == "big-endian" and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder(">"))
    return array


def value_strategies(draw: st.DrawFn) -> st.SearchStrategy[Any]:
    """Draw one field template and return the strategy of its values."""
    kind = draw(st.sampled_from(["tensor", "numpy scalar", "bool", "int", "float", "str", "bytes"]))
    if kind == "tensor":
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        return tensors(dtype, draw(st.integers(0, 3)))
    if kind == "numpy scalar":
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        return hnp.arrays(dtype, ()).map(lambda a: a[()])
    return {
        "bool": st.booleans(),
        "int": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(allow_nan=True, allow_infinity=True),
        "str": st.text(),
        "bytes": st.binary(),
    }[kind]


@st.composite
def example_lists(draw: st.DrawFn) -> list[Any]:
    structure = draw(st.sampled_from(["dict", "tuple", "single"]))
    if structure == "dict":
        keys = draw(
            st.lists(
                st.text(max_size=8).filter(lambda k: not k.endswith(".shape")),
                min_size=1, max_size=4, unique=True,
            )
        )  # fmt: skip
    else:
        keys = [str(i) for i in range(draw(st.integers(1, 4)) if structure == "tuple" else 1)]
    strategies = {key: value_strategies(draw) for key in keys}
    count = draw(st.integers(1, 6))
    examples = []
    for _ in range(count):
        values = {key: draw(strategy) for key, strategy in strategies.items()}
        if structure == "dict":
            examples.append(values)
        elif structure == "tuple":
            examples.append(tuple(values.values()))
        else:
            examples.append(values["0"])
    return examples


# ------------------------------------------------------------------------------ round trips


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples=example_lists(), data=st.data())
def test_round_trip_through_ipc(examples: list[Any], data: st.DataObject) -> None:
    schema = infer_schema(examples[0])
    encoder = Encoder(schema)
    split = data.draw(st.integers(0, len(examples)), label="split")
    batches = []
    for i, example in enumerate(examples):
        if i == split:
            batches.append(encoder.flush())
        encoder.add(example)
    assert encoder.num_rows == (len(examples) - split if split < len(examples) else len(examples))
    batches.append(encoder.flush())
    assert encoder.num_rows == 0 and encoder.nbytes == 0
    assert all(batch.schema == schema.arrow_schema() for batch in batches)

    stored = Schema.from_json(json.loads(json.dumps(encoder.observed_schema().to_json())))
    assert stored == encoder.observed_schema()
    decoder = Decoder(stored)
    batches = ipc_round_trip(batches)
    decoded = [row for batch in batches for row in decoder.rows(batch)]
    assert len(decoded) == len(examples)
    for expected, got in zip(examples, decoded):
        assert_same_example(expected, got)
        for value in field_values(schema, got).values():
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable
    bounds = [0, split if split < len(examples) else len(examples), len(examples)]
    for batch, lo, hi in zip(batches, bounds, bounds[1:]):
        assert_columns(schema, examples[lo:hi], decoder.columns(batch))
        for k in range(hi - lo):  # one row decoded alone (random access) is the same row
            got = decoder.row_at(batch, k)
            assert_same_example(examples[lo + k], got)
            assert all(v.flags.writeable is False for v in field_values(schema, got).values()
                       if isinstance(v, np.ndarray))

    # Sliced batches (non-zero Arrow offsets) decode the same rows.
    whole = pa.Table.from_batches(batches).combine_chunks().to_batches()
    whole = whole[0] if whole else batches[0]
    lo = data.draw(st.integers(0, len(examples)), label="lo")
    hi = data.draw(st.integers(lo, len(examples)), label="hi")
    sliced = whole.slice(lo, hi - lo)
    for expected, got in zip(examples[lo:hi], decoder.rows(sliced), strict=True):
        assert_same_example(expected, got)
    for k in range(hi - lo):
        assert_same_example(examples[lo + k], decoder.row_at(sliced, k))
    assert_columns(schema, examples[lo:hi], decoder.columns(sliced))


def test_round_trip_special_values() -> None:
    payload_nan = np.array([0x7FC00123], np.uint32).view(np.float32)
    example = {
        "nan": np.concatenate([payload_nan, np.array([-0.0, np.inf], np.float32)]),
        "neg_zero": -0.0,
        "py_nan": float("nan"),
        "zero_d": np.array(7, np.int16),
        "scalar": np.float32(1.5),
        "flag": np.bool_(True),
        "empty": np.zeros((3, 0), np.float64),
        "big": 2**63 - 1,
        "text": "héllo\x00✓",
        "blob": b"\x00\xff\x00",
    }
    schema = infer_schema(example)
    encoder = Encoder(schema)
    encoder.add(example)
    (batch,) = ipc_round_trip([encoder.flush()])
    (got,) = list(Decoder(schema).rows(batch))
    assert_same_example(example, got)
    assert_same_example(example, Decoder(schema).row_at(batch, 0))
    assert got["zero_d"].shape == () and type(got["neg_zero"]) is float


def test_rows_of_uniform_tensors_are_views_of_one_batch_array() -> None:
    schema = infer_schema({"tokens": np.zeros(4, np.int32), "length": 4})
    encoder = Encoder(schema)
    for i in range(5):
        encoder.add({"tokens": np.arange(4, dtype=np.int32) + i, "length": i})
    batch = encoder.flush()
    columns = Decoder(schema).columns(batch)
    assert columns["tokens"].shape == (5, 4) and columns["length"].dtype == np.int64
    rows = list(Decoder(schema).rows(batch))
    assert rows[3]["tokens"].base is not None and not rows[3]["tokens"].flags.writeable
    assert rows[3]["tokens"].tolist() == [3, 4, 5, 6] and rows[3]["length"] == 3


def test_columns_build_no_python_rows_of_python_scalars(monkeypatch) -> None:
    """columns() hands out a Python scalar field as an int64 array and never builds the list
    of Python ints that rows() gives (a tolist of every row, per record batch, for nothing)."""
    schema = infer_schema({"tokens": np.zeros(4, np.int32), "length": 4, "flag": True})
    encoder = Encoder(schema)
    for i in range(5):
        encoder.add({"tokens": np.arange(4, dtype=np.int32) + i, "length": i, "flag": i % 2 == 0})
    batch = encoder.flush()
    decoder = Decoder(schema)
    made = []
    real = np.ndarray.tolist

    class Spy(np.ndarray):
        def tolist(self):  # noqa: D102 - counts the conversions
            made.append(len(self))
            return real(self)

    import snapcache.store.decoder as decoder_module
    original = decoder_module._view
    monkeypatch.setattr(decoder_module, "_view", lambda *a: original(*a).view(Spy))
    columns = decoder.columns(batch)
    assert 5 not in made  # (a tensor's one shape is read with a tolist of its ndim values)
    assert columns["length"].tolist() == [0, 1, 2, 3, 4] and columns["length"].dtype == np.int64
    made.clear()
    rows = list(decoder.rows(batch))
    assert made.count(5) == 1  # the int64 field, once; bools come from Arrow as Python bools
    assert [type(r["length"]) for r in rows] == [int] * 5
    assert [r["flag"] for r in rows] == [True, False, True, False, True]
    assert type(rows[0]["flag"]) is bool

def test_encoder_copies_arrays_on_add() -> None:
    array = np.arange(3, dtype=np.float64)
    encoder = Encoder(infer_schema(array))
    encoder.add(array)
    array[:] = -1
    (got,) = list(Decoder(encoder.observed_schema()).rows(encoder.flush()))
    assert got.tolist() == [0.0, 1.0, 2.0]


def test_batches_stay_intact_while_the_encoder_reuses_its_buffers() -> None:
    """Rows are copied into buffers reused from batch to batch once nothing refers to the
    batch made from one: batches still held stay intact, a dropped batch's memory is reused,
    rows that do not fit (more rows, larger rows than the last batch's) are copied alone."""

    def example(i: int, n: int = 4) -> dict:
        return {"x": np.full((n, 3), i, ">f4" if i % 2 else "<f4"), "y": i}

    encoder = Encoder(infer_schema(example(0)))
    held: list[tuple[int, int, int, pa.RecordBatch]] = []

    def batch(lo: int, hi: int, n: int = 4) -> pa.RecordBatch:
        for i in range(lo, hi):
            encoder.add(example(i, n))
        made = encoder.flush()
        held.append((lo, hi, n, made))
        return made

    def address(made: pa.RecordBatch) -> int:
        return made.column(0).values.buffers()[1].address

    batch(0, 5)                      # sizes the buffers
    second = batch(5, 10)            # a fresh buffer
    where = address(second)
    held.pop()
    del second                       # dropped: its buffer is free again
    assert address(batch(10, 15)) == where
    batch(15, 25)                    # more rows than fit: copied alone
    batch(25, 28, n=6)               # larger rows
    for lo in range(28, 80, 5):      # many batches held at once
        batch(lo, lo + 5)
    decoder = Decoder(encoder.observed_schema())
    for lo, hi, n, made in held:
        rows = list(decoder.rows(made))
        assert [r["y"] for r in rows] == list(range(lo, hi))
        for i, r in zip(range(lo, hi), rows):
            assert r["x"].shape == (n, 3) and r["x"].dtype == np.float32
            assert (r["x"] == i).all()



def test_planned_rows_go_into_one_buffer_from_the_first_batch_on() -> None:
    """With the rows of the coming batches planned (the writer plans a stream's first record
    batch before its first row, and the target's rows after each flush), the first batch's
    rows, and a second batch larger than the first, are copied into one reused buffer each
    instead of an array of their own each and a concatenation; what does not fit is still
    copied alone, and every batch reads back intact."""
    def example(i: int) -> dict:
        return {"x": np.full((4, 3), i, np.float32), "y": i}

    def address(made: pa.RecordBatch) -> int:
        return made.column(0).values.buffers()[1].address

    encoder = Encoder(infer_schema(example(0)))
    held = []

    def batch(lo: int, hi: int) -> pa.RecordBatch:
        for i in range(lo, hi):
            encoder.add(example(i))
        made = encoder.flush()
        held.append((lo, hi, made))
        return made

    def slab_addresses() -> set[int]:
        return {s.ctypes.data for s in encoder._slabs[0]}

    encoder.plan_rows(2)
    first = batch(0, 2)
    assert address(first) in slab_addresses()        # the first batch: a buffer already
    encoder.plan_rows(8)
    second = batch(2, 10)                            # 4x the first batch's rows
    assert address(second) in slab_addresses()
    del first, second
    held.clear()
    reused = batch(10, 18)
    assert address(reused) in slab_addresses() and len(encoder._slabs[0]) == 2
    batch(18, 30)                                    # more rows than planned: copied alone
    decoder = Decoder(encoder.observed_schema())
    for lo, hi, made in held:
        rows = list(decoder.rows(made))
        assert [r["y"] for r in rows] == list(range(lo, hi))
        assert all((r["x"] == i).all() for i, r in zip(range(lo, hi), rows))

def test_empty_flush_and_nbytes() -> None:
    schema = infer_schema((np.zeros((2, 2), np.uint8), "ab", 1))
    encoder = Encoder(schema)
    empty = encoder.flush()
    assert empty.num_rows == 0 and list(Decoder(schema).rows(empty)) == []
    assert Decoder(schema).columns(empty)["0"].shape == (0, 0, 0)
    encoder.add((np.zeros((2, 2), np.uint8), "ab", 1))
    assert encoder.num_rows == 1 and encoder.nbytes == 4 + 2 + 8


# --------------------------------------------------------------------------------- schemas


def test_observed_schema_marks_varying_dimensions() -> None:
    encoder = Encoder(infer_schema({"x": np.zeros((2, 3, 4)), "s": "a"}))
    assert encoder.observed_schema().fields[0].shape is None
    for shape in [(2, 3, 4), (2, 5, 4), (2, 3, 4)]:
        encoder.add({"x": np.zeros(shape), "s": "a"})
    encoder.flush()
    encoder.add({"x": np.zeros((2, 1, 4)), "s": "b"})
    observed = encoder.observed_schema()
    assert observed.fields[0].shape == (2, None, 4) and observed.fields[1].shape is None
    assert observed.describe() == ["x: float64[2, None, 4]", "s: str"]


def test_describe() -> None:
    schema = infer_schema(
        {"image": np.zeros((1, 1), np.uint8), "label": 1, "p": 0.5, "ok": True,
         "w": np.float32(1), "name": "a", "raw": b""}
    )  # fmt: skip
    assert schema.describe() == [
        "image: uint8[?, ?]", "label: int (python)", "p: float (python)", "ok: bool (python)",
        "w: float32 (numpy scalar)", "name: str", "raw: bytes",
    ]  # fmt: skip


def test_arrow_schema_is_deterministic() -> None:
    schema = infer_schema({"img": np.zeros((2, 2), bool), "c": np.complex64(1), "t": b""})
    assert schema.arrow_schema() == pa.schema(
        [
            pa.field("img", pa.large_list(pa.uint8()), nullable=False),
            pa.field("img.shape", pa.list_(pa.int32(), 2), nullable=False),
            pa.field("c", pa.list_(pa.float32(), 2), nullable=False),
            pa.field("t", pa.large_binary(), nullable=False),
        ]
    )


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"structure": "dict"},
        {"structure": "list", "fields": [{"name": "a", "kind": "str"}]},
        {"structure": "dict", "fields": []},
        {"structure": "dict", "fields": [{"name": "a", "kind": "blob"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "tensor", "dtype": "object"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "tensor", "dtype": "<f4"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "tensor", "dtype": "nope"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "scalar", "dtype": "int8", "ndim": 1}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "tensor", "dtype": "int8", "ndim": "2"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "tensor", "dtype": "int8", "ndim": 1, "shape": [1, 2]}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "scalar", "dtype": "int8", "python": True}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "str", "extra": 1}]},
        {"structure": "dict", "fields": [{"name": 3, "kind": "str"}]},
        {"structure": "dict", "fields": [{"name": "a", "kind": "str"}, {"name": "a", "kind": "str"}]},
        {"structure": "tuple", "fields": [{"name": "1", "kind": "str"}]},
        {"structure": "single", "fields": [{"name": "x", "kind": "str"}]},
        {"structure": "dict", "fields": ["a"]},
    ],
)  # fmt: skip
def test_from_json_rejects_malformed_schemas(bad: Any) -> None:
    with pytest.raises(CorruptSnapshotError, match="malformed schema"):
        Schema.from_json(bad)


def test_decoder_rejects_a_batch_of_another_schema() -> None:
    encoder = Encoder(infer_schema({"a": 1}))
    encoder.add({"a": 1})
    with pytest.raises(CorruptSnapshotError, match="does not match"):
        Decoder(infer_schema({"a": 1.0})).columns(encoder.flush())


# ---------------------------------------------------------------------------------- errors


class Point(tuple):
    pass


@pytest.mark.parametrize(
    ("example", "match"),
    [
        ({"a": None}, r"key 'a'.*NoneType.*supported values are"),
        ({"a": [1, 2]}, r"key 'a'.*list.*np\.asarray"),
        ({"a": {"b": 1}}, r"key 'a'.*dict.*flatten"),
        ({"a": np.array([object()], dtype=object)}, r"key 'a'.*dtype object"),
        ({"a": np.array(["abc"])}, r"key 'a'.*dtype <U3"),
        ((1, 2**63), r"tuple element 1.*does not fit in int64"),
        (-(2**63) - 1, r"the example.*does not fit in int64"),
        (np.str_("x"), r"the example.*str_"),
        (np.zeros(2, np.longdouble) if np.dtype(np.longdouble).itemsize > 8 else None, r"the example"),
        ({1: 2}, r"dict keys must be str"),
        ({}, r"empty dict"),
        (Point((1, 2)), r"tuple subclass"),
        ({"a": np.zeros((2, 2)), "a.shape": 1}, r"collide"),
        (bytearray(b"x"), r"bytearray"),
    ],
)
def test_unsupported_values(example: Any, match: str) -> None:
    with pytest.raises(UnsupportedValueError, match=match):
        infer_schema(example)


@pytest.mark.parametrize(
    ("first", "later", "match"),
    [
        ({"a": 1, "b": 2}, {"a": 1, "c": 2}, r"example 1: dict keys changed.*missing \['b'\], unexpected \['c'\]"),
        ({"a": 1}, {"a": 1, "b": 2}, r"example 1: dict keys changed.*unexpected \['b'\]"),
        ({"x": np.zeros(2, np.float32)}, {"x": np.zeros(2, np.float64)}, r"example 1, key 'x'.*float32.*float64"),
        ({"x": np.zeros(2)}, {"x": np.zeros((2, 2))}, r"key 'x'.*ndim 1.*ndim 2"),
        ({"x": "s"}, {"x": b"s"}, r"key 'x': expected str.*got bytes"),
        ({"x": 1}, {"x": 1.0}, r"key 'x': expected Python int.*got Python float"),
        ({"x": 1.0}, {"x": np.float64(1.0)}, r"key 'x': expected Python float.*numpy float64 scalar"),
        ({"x": np.zeros(())}, {"x": np.float64(0)}, r"key 'x'.*array with ndim 0.*numpy float64 scalar"),
        ((1, 2), (1, 2, 3), r"example 1: expected a tuple of 2 values, got 3"),
        ((1, 2), {"0": 1, "1": 2}, r"example 1: expected a tuple like the first example, got a dict"),
        ({"x": 1}, None, r"example 1: expected a dict.*got None; leave such examples out with \.filter"),
        ((1, 2), 3, r"example 1: expected a tuple like the first example, got a single value"),
        ((1, 2), (1, "2"), r"example 1, tuple element 1: expected Python int.*got str"),
        (1, 2**64, r"example 1, the example.*int64"),
        ({"x": 1}, {"x": None}, r"example 1, key 'x'.*NoneType.*placeholder.*\.filter"),
        ({"x": 1}, {"x": [1, 2]}, r"key 'x'.*list.*return a tuple or a dict.*np\.asarray"),
    ],
)  # fmt: skip
def test_schema_mismatch(first: Any, later: Any, match: str) -> None:
    encoder = Encoder(infer_schema(first))
    encoder.add(first)
    unsupported = ("int64", "NoneType", "list")
    error = UnsupportedValueError if any(w in match for w in unsupported) else SchemaMismatchError
    with pytest.raises(error, match=match):
        encoder.add(later)
    assert encoder.num_rows == 1  # a rejected example is not queued, not even partly


def test_mismatch_names_the_global_index() -> None:
    encoder = Encoder(infer_schema({"x": 1}))
    with pytest.raises(SchemaMismatchError, match=r"example 41, key 'x'"):
        encoder.add({"x": "no"}, index=41)


def test_error_classes_subclass_builtins() -> None:
    assert issubclass(UnsupportedValueError, TypeError)
    assert issubclass(SchemaMismatchError, ValueError)


def test_field_spec_validation() -> None:
    with pytest.raises(ValueError):
        FieldSpec("a", "tensor", "float32", ndim=1, shape=(1, 2))
    assert FieldSpec("a", "tensor", "float32", ndim=2, shape=(None, 3)).describe() == "a: float32[None, 3]"
