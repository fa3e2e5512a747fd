"""Memo caches are not state: a warm tokenizer-like object, an lru_cache'd function and a
fresh one give the same fingerprint; what they compute from still counts; register overrides."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import snapcache as sc
from snapcache.fingerprint import canonical, hash_function, hash_value


class BPETokenizer:
    """Like a BPE tokenizer: vocabulary and merges (state) and a cache (not state)."""

    def __init__(self, vocab, merges):
        self.vocab = dict(vocab)
        self.merges = list(merges)
        self.cache = {}
        self._word_cache = {}

    def __call__(self, word):
        if word not in self.cache:
            self.cache[word] = np.array([self.vocab.get(c, 0) for c in word], np.int32)
            self._word_cache[word] = len(word)
        return {"ids": self.cache[word]}


VOCAB = {"a": 1, "b": 2, "c": 3}
WORDS = ["abc", "cab", "bca", "abc"]


def digest(fn):
    return hash_function(fn, "map").digest


def test_a_warm_tokenizer_has_the_fingerprint_of_a_cold_one():
    cold = BPETokenizer(VOCAB, [("a", "b")])
    warm = BPETokenizer(VOCAB, [("a", "b")])
    for word in WORDS:
        warm(word)
    assert warm.cache and warm._word_cache
    assert digest(warm) == digest(cold)
    assert digest(warm) != digest(BPETokenizer({**VOCAB, "d": 4}, [("a", "b")]))
    assert digest(warm) != digest(BPETokenizer(VOCAB, [("b", "c")]))


def test_a_new_pipeline_with_a_warm_tokenizer_reads_the_snapshot(root):
    tok = BPETokenizer(VOCAB, [("a", "b")])
    first = sc.Dataset.from_iterable(WORDS).map(tok).snapshot(root, progress=False)
    assert [e["ids"].tolist() for e in first] == [[1, 2, 3], [3, 1, 2], [2, 3, 1], [1, 2, 3]]
    # Another run of the script (a new pipeline object) with the tokenizer warm by now.
    again = sc.Dataset.from_iterable(WORDS).map(tok).snapshot(root, progress=False)
    assert again.explain().hit
    assert again.open_snapshot().id == first.open_snapshot().id


def test_lru_cache_wrappers_count_by_the_wrapped_function():
    @functools.lru_cache(maxsize=None)
    def square(x):
        return x * x

    def fresh():
        @functools.lru_cache(maxsize=None)
        def square(x):
            return x * x
        return square

    before = digest(square)
    square(3), square(4)
    assert digest(square) == before == digest(fresh())

    @functools.cache
    def cube(x):
        return x * x * x

    assert digest(cube) != before


def test_the_default_rule_is_by_attribute_name_and_container_value():
    assert canonical.is_memo_cache("cache", {})
    assert canonical.is_memo_cache("_cache", {})
    assert canonical.is_memo_cache("bpe_cache", {})
    assert canonical.is_memo_cache("_memo", [])
    assert not canonical.is_memo_cache("cache_size", {})     # a setting, not a cache
    assert not canonical.is_memo_cache("cache", 128)         # not a container: state
    assert not canonical.is_memo_cache("vocab", {})


class Normalizer:
    """Its ``cache`` is not a memo: it changes the result. Registered to say so."""

    def __init__(self, table):
        self.cache = dict(table)

    def __call__(self, x):
        return self.cache.get(x, x)


def test_register_overrides_the_default_rule():
    a, b = Normalizer({1: 10}), Normalizer({1: 20})
    assert hash_value(a, "v").digest == hash_value(b, "v").digest  # the default rule
    sc.fingerprint.register(Normalizer, lambda n: ("Normalizer", sorted(n.cache.items())))
    try:
        assert hash_value(a, "v").digest != hash_value(b, "v").digest
    finally:
        canonical._REGISTRY.pop(Normalizer, None)
        canonical._clear_lookups()


def test_fingerprinting_a_class_does_not_keep_it_alive():
    """A notebook sweep defines its transform class anew in every cell run: the fingerprint's
    lookups must not keep each old class (and what it holds) alive."""
    import gc
    import weakref

    refs = []
    for k in range(5):
        Transform = type("Transform", (), {"__init__": lambda self, k=k: setattr(self, "k", k),
                                           "__call__": lambda self, x: x + self.k})
        hash_value(Transform(), "v")
        refs.append(weakref.ref(Transform))
        del Transform
    gc.collect()
    assert [r for r in refs if r() is not None] == []
