"""Random generator objects captured upstream of a snapshot warn like global randomness does:
their draws would be computed once and replayed every epoch."""

from __future__ import annotations

import functools
import random
import warnings

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import RandomnessWarning
from snapcache.fingerprint import detect_randomness

from fp_user_code import make


GENERATORS = {
    "numpy Generator": (np.random.default_rng(0), "numpy.random.Generator"),
    "numpy RandomState": (np.random.RandomState(0), "numpy.random.RandomState"),
    "random.Random": (random.Random(0), "random.Random"),
    "random.SystemRandom": (random.SystemRandom(), "random.SystemRandom"),
}


@pytest.mark.parametrize("case", sorted(GENERATORS))
def test_captured_generators_are_reported_however_captured(case):
    rng, kind = GENERATORS[case]
    expected = f"draws from a captured random generator (`rng`: {kind})"
    as_global = make("def f(x):\n    return x + rng.random()\n", rng=rng)
    assert detect_randomness(as_global) == [expected]
    closure = make("def outer(rng):\n    return lambda x: x + rng.random()\n", "outer")(rng)
    assert detect_randomness(closure) == [expected]
    default = make("def f(x, rng=None):\n    return x + rng.random()\n")
    default.__defaults__ = (rng,)
    assert detect_randomness(default) == [expected]
    partial = functools.partial(make("def g(x, rng):\n    return x + rng.random()\n", "g"),
                                rng=rng)
    assert detect_randomness(partial) == [expected]
    helper = make("def f(x):\n    return jitter(x)\n",
                  jitter=make("def jitter(x):\n    return x + rng.random()\n", "jitter", rng=rng))
    assert detect_randomness(helper) == [expected + " via helper `jitter`"]


def test_callable_objects_and_bound_methods_holding_a_generator():
    cls = make("class Aug:\n    def __init__(self):\n        self.rng = np.random.default_rng(1)\n"
               "    def __call__(self, x):\n        return x + self.rng.random()\n", "Aug")
    assert detect_randomness(cls()) == [
        "draws from a captured random generator (`self.rng`: numpy.random.Generator)"]
    rng = np.random.default_rng(2)
    assert detect_randomness(rng.permutation) == [
        "draws from a captured random generator (`self`: numpy.random.Generator)"]


def test_seeded_inside_or_global_functions_are_not_reported_twice():
    assert detect_randomness(make("def f(x):\n    return np.random.default_rng(x).random()\n")) \
        == []
    shuffle = make("from random import shuffle\ndef f(x):\n    shuffle(x)\n")
    assert detect_randomness(shuffle) == ["reads global random state (`random.shuffle`)"]


def test_a_captured_generator_upstream_of_a_snapshot_warns(tmp_path):
    rng = np.random.default_rng(0)
    ds = sc.Dataset.range(5).map(lambda x: x + rng.random()).snapshot(str(tmp_path),
                                                                     progress=False)
    with pytest.warns(RandomnessWarning, match="captured random generator .*`rng`"):
        list(ds)
    quiet = sc.Dataset.range(5).snapshot(str(tmp_path), progress=False) \
        .map(lambda x: x + rng.random())                 # downstream: random per epoch
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomnessWarning)
        assert len(list(quiet)) == 5
