"""The digests of a few fixed in-memory sources, pinned: bulk hashing may get faster, but an
in-memory source's fingerprint (and so every snapshot built from one) must never change.

The digests were computed by the code before bulk hashing was reworked for speed (issue #14,
target 1) and are checked both in bulk and one example at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xxhash

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
