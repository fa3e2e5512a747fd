"""Fingerprints of pipelines: what upstream computes, as a tree that can explain a cache miss.

>>> from snapcache.fingerprint import hash_value
>>> hash_value([1, 2.0, "three"], "global `X`").digest == hash_value([1, 2.0, "three"], "x").digest
True

See ``DESIGN.md`` ("Fingerprint rules"). The submodules hold the pieces: ``tree`` (nodes and
digests), ``canonical`` (values), ``functions`` (code), ``sources`` and ``explain``.
"""

from snapcache.fingerprint.canonical import hash_value, register
from snapcache.fingerprint.explain import diff_trees
from snapcache.fingerprint.functions import (
    detect_dataset_randomness, detect_randomness, hash_function)
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
