"""Snapshot options a user meets on the second run: compression=None, and options that
differ from the existing snapshot's (warned once, naming what it has)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import OptionConflictWarning
from snapcache.store.options import WriteOptions


def pipeline(root, **options):
    return sc.Dataset.range(50).map(lambda i: np.full(64, i % 3, np.uint8)).snapshot(
        root, progress=False, **options)


def test_compression_none_means_no_compression(root):
    assert WriteOptions(compression=None).compression == "none"
    ds = pipeline(root, compression=None)
    assert len(list(ds)) == 50
    snap = ds.open_snapshot()
    assert snap.manifest.compression == "none"
    assert {s.compression for s in snap.manifest.shards} == {"none"}
    with pytest.raises(ValueError, match="compression_level needs"):
        WriteOptions(compression=None, compression_level=3)


@pytest.mark.parametrize("shape", ["rows", "batches"])
def test_conflicting_options_warn_once_naming_what_the_snapshot_has(root, shape):
    list(pipeline(root, name="train", compression="lz4"))
    again = pipeline(root, name="train-v2", compression=None)
    if shape == "batches":  # the whole-column read path opens the snapshot elsewhere
        again = again.shuffle(10, seed=0).batch(8)
    with pytest.warns(OptionConflictWarning) as caught:
        list(again)
    [warning] = [w for w in caught if issubclass(w.category, OptionConflictWarning)]
    assert warning.filename == __file__  # the user's line, not snapcache's
    text = str(warning.message)
    assert "name='train-v2' (the snapshot's name is 'train')" in text
    assert "compression='none' (the snapshot was written with 'lz4')" in text
    assert "snapcache purge" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptionConflictWarning)
        list(again)  # once is enough
    assert again.open_snapshot().name == "train"


def test_matching_or_default_options_do_not_warn(root):
    list(pipeline(root, name="train", compression="lz4"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptionConflictWarning)
        list(pipeline(root, name="train", compression="lz4"))
        list(pipeline(root))  # no name given, default compression: nothing asked differs
