"""Values and functions whose digests must not depend on the process, cwd or PYTHONHASHSEED.

Imported by test_stability.py in-process and by a subprocess it starts; run as a script it prints
the digests as JSON.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import datetime
import enum
import functools
import json
import math
import re
import struct
import sys

import numpy as np

SIZE = 224
WORDS = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}  # iteration order follows the seed
TABLE = {"zeta": 1, "alpha": [1.5, "x"], "mid": {"nested": frozenset({"p", "q", "r"})}}


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@dataclasses.dataclass(frozen=True)
class Config:
    size: int = 224
    mean: tuple = (0.485, 0.456, 0.406)
    tags: frozenset = frozenset({"train", "aug", "v2"})


class Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.names = {"a", "b", "c"}

    def __call__(self, x):
        return x * self.factor


def normalize(x):
    return (x - np.mean(x)) / (np.std(x) + 1e-6)


def decode_and_resize(x):
    """Uses a helper, a module, a global int and a global set."""
    y = normalize(x)[:SIZE]
    return y if "alpha" in WORDS else math.sqrt(len(y))


def make_scaler(factor):
    def scale(x):
        return x * factor + SIZE
    return scale


def values() -> dict[str, object]:
    return {
        "int": 1, "float": 1.0, "bool": True, "str": "1", "bytes": b"1", "none": None,
        "set_of_str": WORDS, "frozenset": frozenset(WORDS), "dict": TABLE,
        "nested": [WORDS, {"k": WORDS}, (1, 2.5, -0.0, float("nan"))],
        "array": np.arange(12, dtype=np.float32).reshape(3, 4),
        "enum": Color.GREEN, "dataclass": Config(), "callable": Scale(2.0),
        "dict_int_keys": {3: "c", 1: "a", 2: "b"},
        **library_values(),
    }


class Vocab(collections.OrderedDict):
    """A subclass of a type with a default form: the form, its code and its attributes."""

    def __init__(self, unk):
        super().__init__(a=1)
        self.unk = unk
        self.reserved = {"<pad>", "<eos>", "<bos>"}


@dataclasses.dataclass
class Base:
    name: str = "base"


class Resize(Base):
    """Extends a dataclass without being one: its fields and its own attributes."""

    def __init__(self, size):
        super().__init__(name="resize")
        self.size = size
        self.modes = frozenset({"bilinear", "nearest"})


def library_values() -> dict[str, object]:
    return {
        "pattern": re.compile(r"\s+", re.IGNORECASE), "timezone": datetime.timezone.utc,
        "array_module": array.array("d", [1.5, 2.5]), "struct": struct.Struct("<if"),
        "seed_sequence": np.random.SeedSequence(7), "pcg64": np.random.PCG64(7),
        "masked": np.ma.masked_array([1, 2, 3], mask=[0, 1, 0]), "vocab": Vocab(0),
        "dataclass_subclass": Resize(224),
    }


def functions() -> dict[str, object]:
    return {
        "decode_and_resize": decode_and_resize,
        "closure": make_scaler(3),
        "lambda": lambda x: [v * 2 for v in x if v not in WORDS],
        "partial": functools.partial(normalize),
        "method": Scale(4.0).__call__,
        "class": Scale,
        "builtin": len,
        "ufunc": np.add,
    }


def digests() -> dict[str, str]:
    from snapcache.fingerprint import hash_function, hash_value
    from snapcache.fingerprint.tree import pipeline_root

    out = {f"value:{k}": hash_value(v, k).digest for k, v in values().items()}
    out.update({f"function:{k}": hash_function(f, k).digest for k, f in functions().items()})
    ops = [hash_function(f, f"map #{i} `{k}`") for i, (k, f) in enumerate(functions().items())]
    out["pipeline"] = pipeline_root(ops).digest
    return out


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, sort_keys=True)
