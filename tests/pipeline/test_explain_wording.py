"""explain's words: a reordered dict is a miss that says what changed, never "100% alike"."""

from __future__ import annotations

import snapcache as sc

WEIGHTS = {"a": 1, "b": 2}


def first_key(i):
    return i * next(iter(WEIGHTS.values()))   # depends on the dict's order


def test_a_reordered_dict_is_a_miss_that_says_what_changed(root):
    global WEIGHTS
    ds = sc.Dataset.range(5).map(first_key).snapshot(root, progress=False)
    assert list(ds) == [0, 1, 2, 3, 4]
    saved = WEIGHTS
    try:
        WEIGHTS = {"b": 2, "a": 1}
        again = sc.Dataset.range(5).map(first_key).snapshot(root, progress=False)
        report = again.explain()
        assert not report.hit
        text = str(report)
        assert "100%" not in text
        assert "the same values in another order or place" in text
        assert "global `WEIGHTS` changed: order changed" in text
        assert list(again) == [0, 2, 4, 6, 8]   # not the stale snapshot
    finally:
        WEIGHTS = saved


def test_similarity_wording_never_says_100_percent():
    from snapcache.pipeline.explain import alike

    assert alike(0.999) == "99% alike"
    assert alike(0.67) == "67% alike"
    assert alike(1.0) == "the same values in another order or place"
