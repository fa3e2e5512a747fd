"""A value that cannot be stored is refused at its example, with index and key, before
anything is committed."""

from __future__ import annotations

import os

import pytest

import snapcache as sc
from snapcache.errors import UnsupportedValueError
from snapcache.store.codec import Encoder, infer_schema

LATIN1_NAME = os.fsdecode(b"caf\xe9.jpg")     # "caf\udce9.jpg": a lone surrogate


def example(i):
    return {"name": LATIN1_NAME if i == 37 else f"img-{i}.jpg", "i": i}


def test_lone_surrogate_is_refused_at_its_example_before_commit(tmp_path):
    root = tmp_path / "snaps"
    ds = sc.Dataset.range(100).map(example).snapshot(str(root), progress=False)
    seen = []
    with pytest.raises(UnsupportedValueError) as info:
        for value in ds:
            seen.append(value["i"])
    message = str(info.value)
    assert "example 37" in message and "key 'name'" in message, message
    assert "lone surrogate" in message and "os.fsencode" in message, message
    assert len(seen) < 100
    assert not any(os.path.exists(os.path.join(root, d, "manifest.json"))
                   for d in os.listdir(root))


def test_lone_surrogate_in_a_dict_key_or_single_value_is_refused():
    encoder = Encoder(infer_schema({"a": "x"}))
    with pytest.raises(UnsupportedValueError, match="example 0, key 'a'.*lone surrogate"):
        encoder.add({"a": LATIN1_NAME})
    with pytest.raises(UnsupportedValueError, match="lone surrogate"):
        infer_schema({LATIN1_NAME: 1})
    with pytest.raises(UnsupportedValueError, match="the example.*lone surrogate"):
        infer_schema(LATIN1_NAME)
    encoder.add({"a": "naïve 日本"})                 # other non-ASCII text is fine
    assert encoder.flush().num_rows == 1
