"""Bulk hashing of in-memory sources gives exactly the digest of feeding the examples one by
one, whatever mix of structures, dtypes, shapes and layouts the examples have; dtype, shape,
order and content all count."""

from __future__ import annotations

import collections
import enum
import math

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapcache.fingerprint import bulk
from snapcache.fingerprint.canonical import feed_value
from snapcache.fingerprint.tree import Walk


def one_by_one(items):
    h = xxhash.xxh3_128()
    walk = Walk()
    count = 0
    for count, item in enumerate(items, 1):
        feed_value(h, item, walk)
    return h.digest(), count


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of a few examples, so every test crosses many chunk boundaries."""
    monkeypatch.setattr(bulk, "CHUNK_BYTES", 2048)


def token(i):
    rng = np.random.default_rng(i)
    return {"tokens": rng.integers(0, 32000, 128, dtype=np.int32), "length": int(i % 128)}


CASES = {
    "tokens": [token(i) for i in range(300)],
    "images and labels": [(np.full((8, 8, 3), i, np.uint8), np.int64(i)) for i in range(100)],
    "bare arrays": [np.arange(i, i + 6, dtype=np.float32).reshape(2, 3) for i in range(200)],
    "large arrays": [np.full(3000, i, np.float64) for i in range(20)],
    "ints": list(range(-500, 500)),
    "ints beyond 64 bits": [2**63 + i for i in range(100)] + list(range(100)),
    "floats with nan and -0.0": [math.nan, -0.0, 0.0, 1.5, math.inf, -math.nan] * 50,
    "bools and None": [{"ok": i % 3 == 0, "x": None, "v": float(i)} for i in range(200)],
    "nested": [{"a": {"b": [np.int16(i), i]}, "c": (np.zeros(2, np.complex64), True)}
               for i in range(150)],
    "empty arrays": [{"e": np.zeros((0, 3), np.int8), "i": i} for i in range(100)],
}


@pytest.mark.parametrize("name", CASES)
def test_bulk_digest_equals_one_by_one(name):
    items = CASES[name]
    assert bulk.hash_items(items) == one_by_one(items)
    assert bulk.hash_items(tuple(items)) == one_by_one(items)
    assert bulk.hash_items(iter(items)) == one_by_one(items)


def mixed_items():
    base = [token(i) for i in range(40)]
    base[3] = {"tokens": base[3]["tokens"].astype(np.int64), "length": 3}      # dtype
    base[7] = {"tokens": base[7]["tokens"][:100], "length": 7}                  # shape
    base[9] = {"tokens": base[9]["tokens"].reshape(2, 64), "length": 9}        # ndim
    base[11] = {"tokens": base[11]["tokens"][::-1], "length": 11}              # not contiguous
    base[13] = {"tokens": base[13]["tokens"], "length": 2**70}                 # big int
    base[15] = {"length": 15, "tokens": base[15]["tokens"]}                    # key order
    base[17] = collections.OrderedDict(base[17])                                # dict subclass
    base[19] = {"tokens": base[19]["tokens"], "length": 19.0}                  # float, not int
    base[21] = {"tokens": base[21]["tokens"], "length": True}                  # bool, not int
    base[23] = {"tokens": base[23]["tokens"], "length": 23, "x": 1}            # extra key
    base[25] = {"tokens": list(base[25]["tokens"][:3]), "length": 25}          # a list
    base[27] = {"tokens": base[27]["tokens"].astype(">i4"), "length": 27}      # byte order
    base[29] = {"tokens": np.asfortranarray(np.ones((4, 32), np.int32)), "length": 29}
    base[31] = "a string"
    return base


def test_examples_that_do_not_fit_the_layout_fall_back_with_the_same_digest():
    items = mixed_items()
    assert bulk.hash_items(items) == one_by_one(items)


def test_dtype_shape_order_and_content_all_count():
    items = [token(i) for i in range(100)]
    digest = bulk.hash_items(items)[0]
    variants = {
        "dtype": lambda e: {"tokens": e["tokens"].view(np.uint32), "length": e["length"]},
        "shape": lambda e: {"tokens": e["tokens"].reshape(2, 64), "length": e["length"]},
        "content": lambda e: {"tokens": e["tokens"] + 1, "length": e["length"]},
        "scalar type": lambda e: {"tokens": e["tokens"], "length": np.int64(e["length"])},
    }
    for name, change in variants.items():
        changed = list(items)
        changed[57] = change(changed[57])
        assert bulk.hash_items(changed)[0] != digest, name
    swapped = list(items)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    assert bulk.hash_items(swapped)[0] != digest
    assert bulk.hash_items(items[:-1])[0] != digest


@pytest.mark.parametrize("array", [
    np.arange(600, dtype=np.int32).reshape(100, 6),
    np.arange(600, dtype=np.float64),
    np.arange(600, dtype=np.int16).reshape(10, 6, 10)[:, ::2],  # rows not contiguous
    np.array([True, False] * 50),
    np.arange(10, dtype=">i4").reshape(5, 2),
    np.array([{"a": 1}, 2, "x"], dtype=object),
], ids=["2d", "1d", "strided", "bool", "big-endian", "object"])
def test_an_array_source_hashes_its_rows(array):
    assert bulk.hash_items(array) == one_by_one(array)


def test_an_unhashable_item_is_named_by_its_position():
    import threading
    items = [token(i) for i in range(50)]
    items[37] = {"tokens": items[37]["tokens"], "length": threading.Lock()}
    with pytest.raises(bulk.Unhashable) as info:
        bulk.hash_items(items)
    assert "item #37" in info.value.path


leaves = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(), st.none(),
    st.text(max_size=3),
    hnp.arrays(st.sampled_from([np.uint8, np.int32, np.float32, np.float64, np.bool_]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)),
    st.sampled_from([np.int64(3), np.float32(1.5), np.uint8(7), np.bool_(True)]),
)
structures = st.recursive(
    leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                    st.tuples(inner, inner),
                                    st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(structures, max_size=4), st.lists(st.integers(0, 3), max_size=30))
def test_any_mix_of_structures_hashes_like_one_by_one(templates, picks):
    items = [templates[p % len(templates)] for p in picks] if templates else []
    assert bulk.hash_items(items) == one_by_one(items)


def test_examples_of_one_structure_are_not_encoded_one_by_one(monkeypatch):
    calls = []
    real = bulk.feed_value
    monkeypatch.setattr(bulk, "feed_value", lambda *a: (calls.append(1), real(*a))[1])
    items = [token(i) for i in range(2000)]
    expected = one_by_one(items)
    assert bulk.hash_items(items) == expected
    assert len(calls) < 20  # the layout's skeleton and leaves, not one call per example


def counting_feed_value(monkeypatch):
    calls = []
    real = bulk.feed_value
    monkeypatch.setattr(bulk, "feed_value", lambda *a: (calls.append(1), real(*a))[1])
    return calls


def test_arrays_that_are_not_contiguous_are_hashed_in_bulk_in_their_c_order(monkeypatch):
    base = np.arange(400 * 256, dtype=np.int32).reshape(400, 256)
    items = [{"small": base[i, ::4],                                       # strided, 1-d
              "big": np.asfortranarray(base[i].reshape(16, 16).astype(np.float64)),  # > 4 KiB
              "tail": base[i][::-2][:5], "i": i} for i in range(400)]
    items[7]["small"] = np.ascontiguousarray(items[7]["small"])          # a mix of layouts
    expected = one_by_one(items)
    calls = counting_feed_value(monkeypatch)
    assert bulk.hash_items(items) == expected
    assert len(calls) < 20  # the layout's skeleton and leaves, not one call per example


@pytest.mark.parametrize("keys", [("a",), ("a", "b"), ("a", "b", "c"), ("a", "b", "c", "d")])
def test_a_dict_whose_keys_come_in_another_order_hashes_like_one_by_one(keys):
    rng = np.random.default_rng(len(keys))
    items = [{k: np.int16(i + j) for j, k in enumerate(keys)} for i in range(500)]
    for i in rng.choice(500, 40, replace=False).tolist():
        order = list(keys)
        rng.shuffle(order)
        items[i] = {k: items[i][k] for k in order}
    items[250] = {**items[250], "z": 1}                       # a key more
    items[251] = {k: v for k, v in items[251].items() if k != keys[-1]}  # a key fewer
    assert bulk.hash_items(items) == one_by_one(items)


def test_examples_with_strings_or_objects_hash_like_one_by_one():
    items = [{"text": f"document {i} \u00e9", "tokens": np.arange(i % 7, dtype=np.int64),
              "meta": np.array([i, "x", None], dtype=object), "bytes": bytes([i % 256]) * 3}
             for i in range(300)]
    assert bulk.hash_items(items) == one_by_one(items)
    items = [("label", i, np.float32(i) / 3) for i in range(300)]  # a str in a fixed layout
    assert bulk.hash_items(items) == one_by_one(items)


def test_runs_of_different_structures_hash_like_one_by_one():
    tokens = [token(i) for i in range(150)]
    images = [(np.full((4, 4, 3), i, np.uint8), np.int64(i)) for i in range(90)]
    bigger = [token(i) | {"extra": np.ones(2000, np.float32) * i} for i in range(60)]
    items = tokens[:70] + images + tokens[70:] + bigger + images[:5] + tokens[:3]
    assert bulk.hash_items(items) == one_by_one(items)


@settings(max_examples=40, deadline=None)
@given(st.lists(structures, min_size=1, max_size=4), st.integers(0, 3000),
       st.integers(0, 2**32 - 1))
def test_many_examples_mostly_of_one_structure_hash_like_one_by_one(templates, count, seed):
    """Thousands of examples: chunks of every size, layouts and kept matrices reused across
    them; the first template's examples make ~97% of them, the others come anywhere."""
    rng = np.random.default_rng(seed)
    picks = np.where(rng.random(count) < 0.97, 0, rng.integers(0, len(templates), count))
    items = [templates[p] for p in picks.tolist()]
    assert bulk.hash_items(items) == one_by_one(items)


@pytest.mark.parametrize("items", [[], (), iter([]), np.zeros((0, 3), np.int32),
                                   [np.zeros(0, np.float32)] * 50, [{}] * 40, [()] * 40,
                                   [{"e": np.zeros((2, 0), np.int8), "n": None}] * 60],
                         ids=["list", "tuple", "iterator", "array", "empty arrays",
                              "empty dicts", "empty tuples", "empty leaves"])
def test_empty_sources_and_empty_examples_hash_like_one_by_one(items):
    expected = one_by_one(list(items) if not isinstance(items, np.ndarray) else items)
    if not isinstance(items, (list, tuple, np.ndarray)):
        items = iter([])
    assert bulk.hash_items(items) == expected


def test_str_and_bytes_fields_are_hashed_in_bulk(monkeypatch):
    items = [{"text": f"doc {i} " * (i % 4) + "\u00e9\ud800", "label": i % 10,
              "raw": bytes([i % 256]) * (i % 5), "tokens": np.arange(i % 3, i % 3 + 4)}
             for i in range(400)]
    calls = counting_feed_value(monkeypatch)
    for some in (items, [f"bare {i}" for i in range(300)], [(b"", "")] * 300):
        expected = one_by_one(some)
        calls.clear()
        assert bulk.hash_items(some) == expected
        assert len(calls) < 20  # the layout's skeleton and leaves, not one call per example
    expected = one_by_one(items)
    changed = list(items)
    changed[5] = {**items[5], "text": items[5]["text"] + "!"}
    assert bulk.hash_items(changed)[0] != expected[0]


class Key(str):
    pass


class Field(str, enum.Enum):
    TOKENS = "tokens"


@pytest.mark.parametrize("key", [Key("tokens"), Field.TOKENS, Key("length")],
                         ids=["str subclass", "str enum", "second key"])
def test_a_key_equal_to_the_layouts_but_not_a_str_hashes_like_one_by_one(key):
    """Equal to a layout key, but encoded as its own type (the dict is not all-str keys)."""
    items = [token(i) for i in range(60)]
    e = items[33]
    items[33] = {k if k != key else key: v for k, v in e.items()}
    assert any(type(k) is not str for k in items[33])
    assert bulk.hash_items(items) == one_by_one(items)


def test_containers_whose_length_or_keys_change_within_a_chunk_hash_like_one_by_one():
    """A chunk where lengths or keys differ but add up to the layout's (a longer list beside a
    shorter one, a dict with a key more beside one with a key fewer, keys swapped between
    values of one type) is not taken for the layout."""
    lists = [[i, i + 1] for i in range(60)]
    lists[10], lists[11] = [1, 2, 3], [4]
    dicts = [{"a": i, "b": -i} for i in range(60)]
    dicts[20], dicts[21] = {"a": 1, "b": 2, "c": 3}, {"a": 4}
    dicts[30] = {"b": 5, "a": 6}
    nested = [{"x": [np.int8(i), (i, float(i))], "y": {}} for i in range(60)]
    nested[40] = {"x": [np.int8(1), (1, 1.0, None)], "y": {}}
    nested[41] = {"x": [np.int8(1), (1,)], "y": {}}
    nested[50] = {"x": [np.int8(1), (1, 1.0)], "y": {"z": None}}
    for items in (lists, dicts, nested):
        assert bulk.hash_items(items) == one_by_one(items)


@pytest.mark.parametrize("scalar", [np.float16(1.5), np.complex64(1 - 2j), np.uint8(7),
                                    np.bool_(True), np.int64(-3), np.float64(math.nan),
                                    np.array(5, np.int16), np.array(2.5, ">f8")],
                         ids=["f2", "c8", "u1", "bool_", "i8", "nan", "0-d i2", "0-d >f8"])
def test_numbers_of_every_kind_beside_python_ints_and_floats_hash_like_one_by_one(scalar):
    items = [(i, float(i) / 7, scalar, -0.0, i % 2 == 0) for i in range(300)]
    items[100] = (np.int64(100), float(100) / 7, scalar, -0.0, True)  # numpy int, not int
    items[200] = (200, 200, scalar, -0.0, True)                        # int, not float
    assert bulk.hash_items(items) == one_by_one(items)


def test_arrays_whose_shape_changes_in_a_way_their_sizes_hide_hash_like_one_by_one():
    base = np.arange(64, dtype=np.float32)
    shapes = [(64,), (8, 8), (2, 4, 8), (4, 2, 8), (1, 64), (64, 1), (64, 1, 1)]
    for shape in shapes:
        items = [{"a": base.reshape(shape) + i} for i in range(80)]
        for j, other in enumerate(s for s in shapes if s != shape):
            items[5 + 7 * j] = {"a": base.reshape(other)}
        items[70] = {"a": np.asfortranarray(items[70]["a"])}   # another memory order
        items[71] = {"a": items[71]["a"].astype(">f4")}        # another byte order
        items[72] = {"a": items[72]["a"].view(np.int32)}      # another dtype, same size
        assert bulk.hash_items(items) == one_by_one(items), shape
    zero_d = [np.array(i, np.int32) for i in range(100)]
    zero_d[50] = np.array([50], np.int32)
    assert bulk.hash_items(zero_d) == one_by_one(zero_d)


CHANGES = [
    lambda e: {"length": e["length"], "tokens": e["tokens"]},                    # key order
    lambda e: {Key("tokens"): e["tokens"], "length": e["length"]},               # key type
    lambda e: {"tokens": e["tokens"], "length": e["length"], "x": None},         # a key more
    lambda e: {"tokens": e["tokens"]},                                           # a key fewer
    lambda e: {"tokens": e["tokens"].astype(np.int64), "length": e["length"]},   # dtype
    lambda e: {"tokens": e["tokens"].reshape(2, 64), "length": e["length"]},     # shape
    lambda e: {"tokens": e["tokens"][::-1], "length": e["length"]},              # strides
    lambda e: {"tokens": e["tokens"], "length": np.int32(e["length"])},          # numpy int
    lambda e: {"tokens": e["tokens"], "length": e["length"] > 3},                # bool
    lambda e: collections.OrderedDict(e),                                        # dict subclass
    lambda e: (e["tokens"], e["length"]),                                        # a tuple
]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.lists(st.tuples(st.integers(0, 399),
                                               st.integers(0, len(CHANGES) - 1)), max_size=6))
def test_token_like_examples_with_changes_anywhere_hash_like_one_by_one(n, changes):
    items = [token(i) for i in range(n)]
    for at, change in changes:
        if at < n:  # a change of the example as made (a later one replaces an earlier one)
            items[at] = CHANGES[change](token(at))
    assert bulk.hash_items(items) == one_by_one(items)


# -- pinned digests ------------------------------------------------------------------------
# The digests of a few fixed in-memory sources: bulk hashing may get faster, but an in-memory
# source's fingerprint (and so every snapshot built from one) must never change. They were
# computed by the code before bulk hashing was reworked for speed (issue #14, target 1) and are
# checked both in bulk and one example at a time.

def _tokens(i):
    # deterministic without a random generator (whose streams may change between numpy versions)
    length = 16 + (i * 37) % 113
    tokens = np.zeros(128, np.int32)
    tokens[:length] = (np.arange(length, dtype=np.int64) * 7919 + i * 104729) % 32000 + 1
    return {"tokens": tokens, "length": length}


def _sources():
    base = np.arange(64 * 300, dtype=np.int32).reshape(300, 64)
    return {
        "token-like": [_tokens(i) for i in range(3000)],
        "image-like": [{"image": np.full((16, 16, 3), i % 251, np.uint8), "label": np.int64(i)}
                       for i in range(200)],
        "large arrays": [np.arange(i, i + 1500, dtype=np.float64) for i in range(30)],
        "mixed dtypes and shapes": [
            {"x": base[i].astype([np.int32, np.int64, np.float32, np.uint8][i % 4])
             .reshape([(64,), (8, 8), (2, 32), (64,)][i % 4]), "i": i} for i in range(300)],
        "layouts": [{"f": np.asfortranarray(base[i].reshape(8, 8)), "s": base[i, ::3],
                     "be": base[i, :5].astype(">i4"), "z": np.array(i, np.int16)} for i in range(300)],
        "python and numpy scalars": [(i, np.int64(i), float(i) / 3, np.float32(i), i % 2 == 0,
                                      None, np.bool_(i % 3 == 0)) for i in range(500)],
        "floats": [math.nan, -0.0, 0.0, 1.5, math.inf, -math.inf] * 40,
        "str bytes object": [{"text": f"doc {i} \u00e9", "raw": bytes([i % 256]) * (i % 5),
                              "o": np.array([i, "x", None], dtype=object)} for i in range(200)],
        "nested": [{"a": {"b": [np.int16(i), i, [i, (i, "k")]]},
                    "c": (np.zeros(2, np.complex64) + i, True)} for i in range(300)],
        "big ints": [2**63 + i for i in range(50)] + list(range(-50, 50)),
        "one example": [_tokens(7)],
        "empty": [],
        "array rows": np.arange(4000, dtype=np.int32).reshape(500, 8),
    }


PINNED = {
    "token-like": "3cdb2b521e65737cf1eab400be31ea59",
    "image-like": "e45c108f131f985ce92a361fb129ffe6",
    "large arrays": "2fa2bd1b07ab95ade6e4cfa9616a3004",
    "mixed dtypes and shapes": "305896c33825be58d9002e3d847f5d33",
    "layouts": "e879a79ca64f31f59484686e1c267097",
    "python and numpy scalars": "fd88561607cb48749baebea7e65c990c",
    "floats": "40efd268ff5e7d005bb0b591dab30f67",
    "str bytes object": "f436f6fb9fe0ea1e3051676486194925",
    "nested": "b9efdb591c9fbeca13473837517df496",
    "big ints": "cb3dfbec272dbf94068f31091de2626e",
    "one example": "41555176ee5cc9eef618506408dfbce2",
    "empty": "99aa06d3014798d86001c324468d497f",
    "array rows": "9a9d94e469bc0d8bd16a5e7e98e61a0f",
}


@pytest.mark.parametrize("chunk_bytes", [bulk.CHUNK_BYTES, 2048])
@pytest.mark.parametrize("name", PINNED)
def test_fixed_sources_keep_their_digests(name, chunk_bytes, monkeypatch):
    monkeypatch.setattr(bulk, "CHUNK_BYTES", chunk_bytes)
    items = _sources()[name]
    digest, count = bulk.hash_items(items)
    assert count == len(items)
    assert digest.hex() == PINNED[name]
    assert one_by_one(items)[0].hex() == PINNED[name]
