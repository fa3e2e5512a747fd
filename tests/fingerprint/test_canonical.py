"""hash_value: deterministic, by content, order-independent where order means nothing (sets;
dicts keep their order: iterating code sees it)."""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import enum
import io
import math
import pathlib
import random
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapcache.errors import FingerprintError
from snapcache.fingerprint import FINGERPRINT_VERSION, FingerprintNode, hash_value, register
from snapcache.fingerprint.tree import combine, leaf, pipeline_root


def digest(value) -> str:
    return hash_value(value, "v").digest


# -- generated values --------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.binary(max_size=8))
arrays = hnp.arrays(dtype=st.sampled_from([np.float32, np.float64, np.int8, np.int64, np.bool_]),
                    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3))
values = st.recursive(
    scalars | arrays,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=4)
                   | st.dictionaries(st.integers(), inner, max_size=4)),
    max_leaves=12)


def reference(v):
    """An independent, type-exact description of a generated value: equal iff same content."""
    if isinstance(v, float):
        return ("float", b"nan" if math.isnan(v) else struct.pack("<d", v))
    if isinstance(v, np.ndarray):
        bits = np.where(np.isnan(v), np.nan, v) if v.dtype.kind == "f" else v
        return ("array", v.dtype.str, v.shape, bits.tobytes())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(reference(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((reference(k), reference(x)) for k, x in v.items()))
    return (type(v).__name__, v)


@settings(max_examples=200, deadline=None)
@given(values)
def test_deterministic_for_nested_values(value):
    assert digest(value) == digest(value) == digest(copy.deepcopy(value))


@settings(max_examples=200, deadline=None)
@given(values, values)
def test_distinct_values_have_distinct_digests(a, b):
    assert (digest(a) == digest(b)) == (reference(a) == reference(b))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=5) | st.integers(), values, max_size=6), st.randoms())
def test_dict_order_counts(d, rnd):
    """Code that iterates a dict sees its order: a reordered dict may compute something else,
    so it is another fingerprint (a false hit would read stale data)."""
    items = list(d.items())
    rnd.shuffle(items)
    same_order = [k for k, _ in items] == list(d)
    assert (digest(dict(items)) == digest(d)) == same_order
    assert (digest([dict(items)]) == digest([d])) == same_order  # nested dicts too


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers() | st.text(max_size=5) | st.floats(allow_nan=False)), st.randoms())
def test_sets_are_order_independent(s, rnd):
    items = list(s)
    rnd.shuffle(items)
    assert digest(set(items)) == digest(s)
    assert digest(frozenset(items)) == digest(frozenset(s))


# -- distinctions ------------------------------------------------------------------------------

DISTINCT = [
    1, 1.0, True, "1", b"1", bytearray(b"1"), np.int64(1), np.float64(1.0), None, 0, False, "",
    0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1j, 2**70, -(2**70),
    [1, 2], (1, 2), {1, 2}, frozenset({1, 2}), {1: 2}, [[1, 2]], [(1, 2)], [], (), {}, set(),
    np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64), np.zeros((3, 2), np.float32),
    np.zeros(6, np.float32), np.dtype("float32"), np.dtype("float64"),
    range(3), range(0, 3, 2), slice(1, 2), pathlib.PurePosixPath("/a/b"), "/a/b",
    datetime.date(2024, 1, 1), datetime.timedelta(seconds=1),
]


def test_distinct_values_table():
    digests = [digest(v) for v in DISTINCT]
    duplicates = [(DISTINCT[i], DISTINCT[j]) for i in range(len(DISTINCT)) for j in range(i)
                  if digests[i] == digests[j]]
    assert duplicates == []


def test_nan_is_one_value_and_negative_zero_is_not_zero():
    other_nan = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]
    assert digest(float("nan")) == digest(other_nan)
    assert digest(-0.0) != digest(0.0)


def test_array_byte_order_is_normalized_and_layout_ignored():
    a = np.arange(6, dtype="<i4").reshape(2, 3)
    assert digest(a) == digest(a.astype(">i4"))
    assert digest(a) == digest(np.asfortranarray(a))
    assert digest(a.T) != digest(a)
    assert digest(np.array([1, 2], dtype=object)) == digest(np.array([1, 2], dtype=object))
    assert digest(np.array([1, 2], dtype=object)) != digest(np.array([1, 3], dtype=object))


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclasses.dataclass
class Params:
    size: int
    mean: tuple


class Plain:
    def __init__(self, scale):
        self.scale = scale


class Slotted:
    __slots__ = ("a", "__b")

    def __init__(self, a, b):
        self.a = a
        self.__b = b


def test_supported_kinds_hash_by_content():
    assert digest(Mode.TRAIN) != digest(Mode.EVAL)
    assert digest(Mode.TRAIN) == digest(Mode.TRAIN)
    assert digest(Params(1, (2,))) == digest(Params(1, (2,)))
    assert digest(Params(1, (2,))) != digest(Params(2, (2,)))
    assert digest(Plain(1)) == digest(Plain(1)) != digest(Plain(2))
    assert digest(Slotted(1, 2)) == digest(Slotted(1, 2)) != digest(Slotted(1, 3))
    assert digest(np) == digest(np) != digest(math)
    assert digest(int) != digest(float)
    assert digest(Plain) == digest(Plain) != digest(Params)
    assert digest(collections.OrderedDict(a=1)) != digest({"a": 1})
    assert digest(collections.Counter("aab")) != digest({"a": 2, "b": 1})
    assert digest(collections.Counter("aab")) == digest(collections.Counter("aba"))
    assert digest(random.Random(1)) == digest(random.Random(1)) != digest(random.Random(2))
    assert digest(np.random.default_rng(1)) != digest(np.random.default_rng(2))


@dataclasses.dataclass
class Transform:
    name: str = "transform"


class Resize(Transform):
    """Extends a dataclass without being one: ``size`` is not a field."""

    def __init__(self, size):
        super().__init__(name="resize")
        self.size = size


@dataclasses.dataclass
class Compiled:
    pattern: str

    def __post_init__(self):
        self.parts = self.pattern.split("|")


def test_a_dataclass_subclass_counts_its_own_attributes():
    """The fields and the rest of the state: what a subclass's ``__init__`` or a
    ``__post_init__`` sets counts too (an audit found Resize(size=2) and Resize(size=3) alike)."""
    assert digest(Resize(2)) == digest(Resize(2)) != digest(Resize(3))
    node = hash_value(Resize(2), "closure `t`")
    assert [c.label for c in node.children] == ["class `Resize`", "field `name`",
                                                "attribute `size`"]
    a, b = Compiled("a|b"), Compiled("a|b")
    b.parts = ["a", "c"]
    assert digest(a) != digest(b)
    # a dataclass without other state hashes as before: its fields, in their order
    assert [c.label for c in hash_value(Params(1, (2,)), "x").children] == [
        "class `Params`", "field `size`", "field `mean`"]


class Vocab(collections.OrderedDict):
    def __init__(self, unk):
        super().__init__(a=1)
        self.unk = unk

    def __call__(self, key):
        return self.get(key, self.unk)


class Vocab2(collections.OrderedDict):  # Vocab with another __call__
    def __init__(self, unk):
        super().__init__(a=1)
        self.unk = unk

    def __call__(self, key):
        return self.get(key, self.unk) * 10


class Defaults(collections.defaultdict):
    pass


class Seeded(random.Random):
    pass


class Tagged(np.ndarray):
    pass


def test_a_subclass_of_a_registered_type_counts_its_class_and_attributes():
    """A user class extending a type with a default form (OrderedDict, defaultdict,
    random.Random, ...) is more than its base (an audit found Vocab(unk=1) and Vocab(unk=7),
    and an edited Vocab.__call__, one snapshot)."""
    assert digest(Vocab(1)) == digest(Vocab(1)) != digest(Vocab(7))
    assert digest(Vocab(1)) != digest(Vocab2(1))
    assert digest(Vocab(1)) != digest(collections.OrderedDict(a=1))
    a, b = Defaults(int), Defaults(int)
    b.note = "x"
    assert digest(a) != digest(b)
    c, d = Seeded(1), Seeded(1)
    d.tag = 3
    assert digest(c) != digest(d)
    assert digest(Seeded(1)) != digest(random.Random(1))
    held = Vocab(1)
    held.lock = threading.Lock()  # left out (it cannot be hashed), the rest still counts
    assert digest(held) == digest(held) != digest(Vocab(1))
    cyclic = Vocab(1)
    cyclic["self"] = cyclic
    assert digest(cyclic) == digest(cyclic)


def test_ndarray_subclasses_count_what_they_add():
    """A MaskedArray by its data, mask and fill value; other subclasses by the array, their class
    and their attributes (a recarray is not an ndarray of the same records)."""
    masked = np.ma.masked_array([5, 5, 5, 5], mask=[0, 0, 0, 0])
    assert digest(masked) == digest(np.ma.masked_array([5, 5, 5, 5], mask=[0, 0, 0, 0]))
    assert digest(masked) != digest(np.ma.masked_array([5, 5, 5, 5], mask=[0, 1, 0, 1]))
    assert digest(masked) != digest(np.ma.masked_array([5, 5, 5, 5], fill_value=7))
    assert digest(masked) != digest(np.array([5, 5, 5, 5]))
    x, y = np.arange(3).view(Tagged), np.arange(3).view(Tagged)
    y.info = "meters"
    assert digest(x) == digest(np.arange(3).view(Tagged)) != digest(y)
    assert digest(x) != digest(np.arange(3))
    rows = np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])
    assert digest(rows.view(np.recarray)) != digest(rows)


def test_summaries_are_short_and_address_free():
    assert hash_value(224, "global `SIZE`").summary == "224"
    assert hash_value(np.zeros((3, 224, 224), np.float32), "x").summary == "float32[3, 224, 224]"
    assert hash_value(Plain(1), "x").summary == "<Plain object>"
    assert len(hash_value("x" * 500, "x").summary) <= 60
    assert "0x" not in hash_value(lambda: 0, "x").summary


def test_small_str_keyed_dicts_and_objects_have_children():
    node = hash_value({"size": 224, "mean": 0.5}, "global `cfg`")
    assert [c.label for c in node.children] == ["key `size`", "key `mean`"]  # in the dict's order
    obj = hash_value(Plain(3), "closure `t`")
    assert [c.label for c in obj.children] == ["class `Plain`", "attribute `scale`"]


def test_cycles_terminate_and_are_deterministic():
    a = [1]
    a.append(a)
    d = {"self": None}
    d["self"] = d
    p = Plain(None)
    p.scale = p
    for v in (a, d, p, [a, a]):
        assert digest(v) == digest(v)
    b = [1]
    b.append(b)
    assert digest(a) == digest(b)


def test_label_does_not_change_the_digest():
    assert hash_value(3, "global `a`").digest == hash_value(3, "closure `b`").digest


# -- errors ------------------------------------------------------------------------------------

class HoldsLock:
    def __init__(self):
        self.lock = threading.Lock()


def _generator():
    yield 1


@pytest.mark.parametrize("value, type_name", [
    (threading.Lock(), "_thread.lock"),
    (_generator(), "generator"),
    (HoldsLock(), "_thread.lock"),
    ([1, {"k": threading.RLock()}], "_thread.RLock"),
])
def test_unhashable_values_raise_a_clear_error(value, type_name):
    with pytest.raises(FingerprintError) as info:
        hash_value(value, "global `thing`", where="map #1 `f`")
    message = str(info.value)
    assert f"`{type_name}`" in message
    assert "global `thing` of map #1 `f`" in message
    assert "register(" in message and 'key="' in message
    assert isinstance(info.value, TypeError)


def test_open_file_is_unhashable(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")
    with open(path) as f, pytest.raises(FingerprintError, match="capture its path"):
        hash_value(f, "closure `f`")
    with pytest.raises(FingerprintError, match="attribute `lock`"):
        hash_value(HoldsLock(), "global `h`")


def test_non_deterministic_fallbacks_are_never_used():
    with pytest.raises(FingerprintError):
        hash_value(io.BytesIO(b"x"), "x")
    with pytest.raises(FingerprintError):
        hash_value(threading.Condition(), "x")
    assert digest(object()) == digest(object())  # a stateless sentinel is a value


# -- register ----------------------------------------------------------------------------------

class Image:
    def __init__(self, pixels, cache=None):
        self.pixels = pixels
        self.cache = cache


class SubImage(Image):
    pass


def test_register_teaches_a_type_and_its_subclasses(clean_registry):
    with pytest.raises(FingerprintError):
        hash_value(Image(b"ab", cache=threading.Lock()), "global `img`")
    register(Image, lambda im: im.pixels)
    assert digest(Image(b"ab", threading.Lock())) == digest(Image(b"ab", threading.Lock()))
    assert digest(Image(b"ab")) != digest(Image(b"ac"))
    assert digest(Image(b"ab")) != digest(b"ab")  # the type is part of the digest
    assert digest(SubImage(b"ab", threading.Lock())) == digest(SubImage(b"ab"))


def test_register_rejects_non_types():
    with pytest.raises(TypeError):
        register("Image", lambda im: 0)
    with pytest.raises(TypeError):
        register(Image, None)


# -- pinned digests ----------------------------------------------------------------------------
# These pin the hashing scheme. If one changes on purpose, bump FINGERPRINT_VERSION (which
# invalidates every snapshot) and update the pins; an accidental change must fail here.

def test_pinned_digests():
    assert FINGERPRINT_VERSION == 2
    assert digest({"a": 1, "b": [1.5, "x"]}) == "94b3c0d4b94c993947781a0e5f4fbc03"
    assert digest([1, 2.5, "x", b"y", None, True, (3,)]) == "fad2cc07d2b89b6e7d8d842355fb0a09"
    assert digest(np.arange(6, dtype=np.float32).reshape(2, 3)) == \
        "6db24b7ff7e8afdc6d4dd3d4d33e25eb"
    assert digest({"b", "a", "c"}) == "8f9480e385a003697d63aa2997230202"
    root = pipeline_root([leaf("source", "source:range", b"\x00" * 48, "range(0, 3, 1)"),
                          combine("map #1 `f`", [leaf("bytecode", "bytecode", b"x")],
                                  kind="op:map")])
    assert root.digest == "4f567fe3f6e4a5c91469bf43e0321eb1"


def test_node_json_round_trip():
    node = hash_value({"size": 224, "names": ["a"]}, "global `cfg`")
    assert FingerprintNode.from_json(node.to_json()) == node


@dataclasses.dataclass
class WithHandle:
    size: int

    def __post_init__(self):
        self._lock = threading.Lock()  # a handle: the fields name what it computes


class LockedRandom(random.Random):
    def __init__(self, seed):
        super().__init__(seed)
        self._lock = threading.Lock()


def test_state_that_cannot_be_hashed_beside_what_counts_is_left_out():
    """A dataclass's handle kept by __post_init__, a lock a subclass of a registered type
    holds: left out (they counted not at all before their other state did), never a
    FingerprintError; what can be hashed still counts."""
    assert hash_value(WithHandle(2), "v").digest == hash_value(WithHandle(2), "v").digest
    assert hash_value(WithHandle(2), "v").digest != hash_value(WithHandle(3), "v").digest
    assert hash_value(LockedRandom(0), "v").digest == hash_value(LockedRandom(0), "v").digest
    assert hash_value(LockedRandom(0), "v").digest != hash_value(LockedRandom(1), "v").digest
