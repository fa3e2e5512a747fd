"""snapcache's forms of library values: common deterministic values fingerprint by content
(an audit found re.compile, torch.float32 and a pandas DataFrame raising FingerprintError);
torch and pandas forms are registered without importing either."""

from __future__ import annotations

import argparse
import array
import datetime
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import threading
import weakref
import zoneinfo

import numpy as np
import pytest

from snapcache.errors import FingerprintError
from snapcache.fingerprint import hash_value, register

ROOT = pathlib.Path(__file__).resolve().parents[2]


def digest(value) -> str:
    return hash_value(value, "v").digest


def assert_by_content(make_a, make_b):
    """Two makes of one value hash alike; a different value does not."""
    assert digest(make_a()) == digest(make_a())
    assert digest(make_a()) != digest(make_b())


# -- standard library and numpy ----------------------------------------------------------------

@pytest.mark.parametrize("make_a, make_b", [
    (lambda: re.compile(r"\s+"), lambda: re.compile(r"\s*")),
    (lambda: re.compile(r"a"), lambda: re.compile(r"a", re.IGNORECASE)),
    (lambda: re.compile(rb"a"), lambda: re.compile(r"a")),
    (lambda: datetime.timezone.utc, lambda: datetime.timezone(datetime.timedelta(hours=1))),
    (lambda: datetime.timezone(datetime.timedelta(0)),
     lambda: datetime.timezone(datetime.timedelta(0), "Z")),
    (lambda: zoneinfo.ZoneInfo("UTC"), lambda: zoneinfo.ZoneInfo("Europe/Paris")),
    (lambda: array.array("i", [1, 2]), lambda: array.array("i", [1, 3])),
    (lambda: array.array("i", [1, 2]), lambda: array.array("l", [1, 2])),
    (lambda: struct.Struct("<i"), lambda: struct.Struct(">i")),
    (lambda: np.random.PCG64(1), lambda: np.random.PCG64(2)),
    (lambda: np.random.MT19937(1), lambda: np.random.PCG64(1)),
    (lambda: np.random.SeedSequence(1), lambda: np.random.SeedSequence(1, spawn_key=(1,))),
], ids=["pattern", "pattern-flags", "pattern-bytes", "timezone", "timezone-name", "zoneinfo",
        "array", "array-typecode", "struct", "pcg64", "bit-generators", "seed-sequence"])
def test_stdlib_and_numpy_values_by_content(make_a, make_b):
    assert_by_content(make_a, make_b)


def test_a_bit_generator_counts_its_position():
    a, b = np.random.PCG64(1), np.random.PCG64(1)
    b.random_raw()
    assert digest(a) != digest(b)


# -- torch -------------------------------------------------------------------------------------

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_torch_values_by_content(torch):
    assert_by_content(lambda: torch.float32, lambda: torch.float64)
    assert_by_content(lambda: torch.device("cpu"), lambda: torch.device("meta"))
    assert_by_content(lambda: torch.Size([2, 3]), lambda: torch.Size([3, 2]))
    assert digest(torch.Size([2, 3])) != digest((2, 3))
    assert_by_content(lambda: torch.strided, lambda: torch.sparse_coo)
    assert_by_content(lambda: torch.contiguous_format, lambda: torch.channels_last)
    assert_by_content(lambda: torch.arange(3), lambda: torch.arange(3.0))
    assert_by_content(lambda: torch.Generator().manual_seed(1),
                      lambda: torch.Generator().manual_seed(2))


def test_a_torch_default_argument_counts(torch):
    from snapcache.fingerprint import hash_function

    def to_tensor(x, dtype=torch.float32):
        return torch.tensor(x, dtype=dtype)

    first = hash_function(to_tensor, "map").digest
    to_tensor.__defaults__ = (torch.float16,)
    assert hash_function(to_tensor, "map").digest != first


# -- pandas ------------------------------------------------------------------------------------

@pytest.fixture
def pd():
    return pytest.importorskip("pandas")


def test_a_dataframe_counts_values_dtypes_columns_and_index(pd):
    def frame(**change):
        data = {"id": [0, 1, 2], "label": [5, 6, 7], "name": ["a", "b", "c"]}
        data.update(change.pop("data", {}))
        return pd.DataFrame(data, **change)

    base = digest(frame())
    assert digest(frame()) == base
    assert digest(frame(data={"label": [5, 6, 8]})) != base               # a value
    assert digest(frame(data={"name": ["a", "b", "d"]})) != base          # a str value
    assert digest(frame().astype({"label": "int32"})) != base             # a dtype
    assert digest(frame().rename(columns={"label": "y"})) != base         # a column name
    assert digest(frame()[["label", "id", "name"]]) != base               # column order
    assert digest(frame(index=[10, 11, 12])) != base                      # the index
    named = frame()
    named.index.name = "row"
    assert digest(named) != base                                          # the index's name


def test_pandas_values_are_hashed_by_content_not_repr(pd):
    """A repr rounds floats and elides the middle of long frames: both changes count."""
    a = pd.DataFrame({"x": np.zeros(1000)})
    b = a.copy()
    b.loc[500, "x"] = 1.0
    assert repr(a) == repr(b)  # the middle rows are elided
    assert digest(a) != digest(b)
    assert repr(pd.Series([0.1])) == repr(pd.Series([0.1000000001]))
    assert digest(pd.Series([0.1])) != digest(pd.Series([0.1000000001]))


@pytest.mark.parametrize("make_a, make_b", [
    (lambda pd: pd.Series([1, 2], name="a"), lambda pd: pd.Series([1, 2], name="b")),
    (lambda pd: pd.Series([1, 2]), lambda pd: pd.Series([1, 2], dtype="Int64")),
    (lambda pd: pd.Series([1, None], dtype="Int64"), lambda pd: pd.Series([1, 0], dtype="Int64")),
    (lambda pd: pd.Series(["a", "b"], dtype="category"),
     lambda pd: pd.Series(pd.Categorical(["a", "b"], categories=["b", "a"]))),
    (lambda pd: pd.Series([[1, 2], [3]], dtype=object),
     lambda pd: pd.Series([[1, 2], [4]], dtype=object)),
    (lambda pd: pd.date_range("2024-01-01", periods=3, tz="UTC"),
     lambda pd: pd.date_range("2024-01-01", periods=3, tz="Europe/Paris")),
    (lambda pd: pd.Index(["a", "b"], name="k"), lambda pd: pd.Index(["a", "b"], name="j")),
    (lambda pd: pd.RangeIndex(3), lambda pd: pd.RangeIndex(4)),
    (lambda pd: pd.MultiIndex.from_tuples([(1, "a"), (2, "b")]),
     lambda pd: pd.MultiIndex.from_tuples([(1, "a"), (2, "c")])),
    (lambda pd: pd.Categorical(["a"]), lambda pd: pd.Categorical(["b"])),
    (lambda pd: pd.Timedelta(1), lambda pd: pd.Timedelta(2)),
    (lambda pd: pd.Period("2024-01", "M"), lambda pd: pd.Period("2024-01", "D")),
    (lambda pd: pd.Interval(0, 1), lambda pd: pd.Interval(0, 1, closed="both")),
], ids=["series-name", "series-dtype", "na", "categories", "object-column", "tz", "index-name",
        "range-index", "multi-index", "categorical", "timedelta-ns", "period", "interval"])
def test_pandas_values_by_content(pd, make_a, make_b):
    assert_by_content(lambda: make_a(pd), lambda: make_b(pd))


def test_a_dataframe_subclass_counts_its_metadata_and_code(pd):
    class Labels(pd.DataFrame):
        _metadata = ["source"]

        @property
        def _constructor(self):
            return Labels

    a, b = Labels({"x": [1]}), Labels({"x": [1]})
    a.source, b.source = "v1", "v2"
    assert digest(a) != digest(b)
    assert digest(a) != digest(pd.DataFrame({"x": [1]}))


def test_an_unhashable_value_in_a_dataframe_names_the_dataframe(pd):
    """Not a pandas internal (the audit's message said to register weakref.ReferenceType)."""
    labels = pd.DataFrame({"id": [0, 1], "lock": [None, threading.Lock()]})
    with pytest.raises(FingerprintError) as info:
        hash_value(labels, "global `LABELS`", where="map #1 `label`")
    message = str(info.value)
    assert "inside the `pandas.DataFrame` captured as global `LABELS` of map #1 `label`" in message
    assert "`_thread.lock`" in message and "weakref" not in message


def test_an_unhashable_internal_of_a_library_object_names_the_object():
    """A library's plain object is hashed by its attributes, its internals: the message says
    which object the user holds, and that it is the type to register."""
    owner = argparse.Namespace(ref=weakref.ref(argparse.Namespace))
    with pytest.raises(FingerprintError) as info:
        hash_value([owner], "global `ARGS`")
    message = str(info.value)
    assert ("object of type `weakref.ReferenceType` (attribute `ref`) inside the "
            "`argparse.Namespace` captured as item #0 of global `ARGS`") in message
    assert "register(argparse.Namespace, fn)" in message


def test_a_form_the_user_registers_wins(pd, clean_registry):
    register(pd.Index, lambda index: "any index")
    assert digest(pd.Index([1])) == digest(pd.Index([2]))
    from snapcache.fingerprint.forms import load_forms
    load_forms("pandas")  # a late default registration does not replace it
    assert digest(pd.Index([1])) == digest(pd.Index([2]))


# -- in a fresh process ------------------------------------------------------------------------

def run(code: str, seed: str = "0") -> str:
    env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout


def test_fingerprinting_does_not_import_torch_or_pandas():
    out = run("""
import datetime, json, re, sys, zoneinfo
import numpy as np
import snapcache as sc
PATTERN = re.compile(r"\\s+")
ZONE = zoneinfo.ZoneInfo("UTC")
def clean(s):
    return PATTERN.sub(" ", s), ZONE, np.random.SeedSequence(1), datetime.timezone.utc
sc.Dataset.from_iterable(["a  b"]).map(clean).fingerprint()
print(json.dumps([m in sys.modules for m in ("torch", "pandas")]))
""")
    assert json.loads(out) == [False, False]


def test_pandas_digests_are_the_same_in_every_process(pd):
    code = """
import pandas as pd, numpy as np
from snapcache.fingerprint import hash_value
df = pd.DataFrame({"name": ["apple", "kiwi", None], "obj": pd.Series(["x", 1, (2, "y")], dtype=object),
                   "cat": pd.Categorical(["b", "a", "b"]), "n": pd.array([1, None, 3], dtype="Int64")},
                  index=pd.Index(["r1", "r2", "r3"], name="row"))
print(hash_value(df, "df").digest)
"""
    assert run(code, "1") == run(code, "2")


def test_a_masked_constant_and_an_arrow_list_column_fingerprint(pd):
    """np.ma.masked refuses the fill_value getter's write; pandas cannot hash an Arrow list
    column: both fingerprint by content."""
    import numpy as np
    import pyarrow as pa

    assert hash_value(np.ma.masked, "v").digest == hash_value(np.ma.masked, "v").digest

    def frame(last):
        return pd.DataFrame({"ids": pd.array([[1, 2], [3, last]],
                                             dtype=pd.ArrowDtype(pa.list_(pa.int64())))})
    assert hash_value(frame(4), "v").digest == hash_value(frame(4), "v").digest
    assert hash_value(frame(4), "v").digest != hash_value(frame(5), "v").digest
