"""Fingerprints of pipelines: what upstream computes, as a tree that can explain a cache miss.

>>> from snapcache.fingerprint import hash_value
>>> hash_value([1, 2.0, "three"], "global `X`").digest == hash_value([1, 2.0, "three"], "x").digest
True

See ``DESIGN.md`` ("Fingerprint rules"). The submodules hold the pieces: ``tree`` (nodes and
digests), ``canonical`` (values), ``forms`` (library types' forms), ``origin`` (user code or
library), ``bytecode`` (what code reads, from its bytecode), ``functions`` (code),
``randomness`` (what code draws at random, from the same reading of its bytecode), ``sources``
and ``explain``.
"""

from snapcache.fingerprint.canonical import hash_value, register
from snapcache.fingerprint.explain import diff_trees
from snapcache.fingerprint.functions import hash_function
from snapcache.fingerprint.randomness import detect_dataset_randomness, detect_randomness
from snapcache.fingerprint.tree import FINGERPRINT_VERSION, FingerprintNode

__all__ = [
    "FINGERPRINT_VERSION",
    "FingerprintNode",
    "register",
    "hash_value",
    "hash_function",
    "detect_randomness",
    "detect_dataset_randomness",
    "diff_trees",
]
