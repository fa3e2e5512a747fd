"""Snapshot options a user meets on the second run: compression=None, options that differ
from the existing snapshot's (warned once, naming what it has), and a key= whose source changed
since (the snapshot is read, and len() counts it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import OptionConflictWarning, RedundantSnapshotWarning
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


def square(x):
    return x * x


@pytest.mark.parametrize("between, named", [
    (lambda ds: ds, None),
    (lambda ds: ds.shuffle(50, seed=0), "shuffle(50)"),
    (lambda ds: ds.take(5).prefetch().repeat(2), "take(5), prefetch"),
])
def test_a_snapshot_of_a_snapshot_that_computes_nothing_warns_at_the_users_line(
        root, between, named):
    first = sc.Dataset.range(10).map(square).snapshot(root, progress=False)
    with pytest.warns(RedundantSnapshotWarning, match="second copy on disk") as caught:
        between(first).snapshot(root, progress=False)
    message = str(caught[0].message)
    assert caught[0].filename == __file__
    assert "remove one of the two .snapshot() calls" in message
    assert named is None or named in message


def test_a_snapshot_after_a_computing_op_does_not_warn(root):
    first = sc.Dataset.range(10).snapshot(root, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RedundantSnapshotWarning)
        first.map(square).snapshot(root, progress=False)
        first.filter(lambda x: x > 2).snapshot(root, progress=False)
        first.interleave(lambda x: [x, x]).snapshot(root, progress=False)
        sc.Dataset.range(10).shuffle(5, seed=1).snapshot(root, progress=False)  # no snapshot below


def test_a_local_copy_of_a_remote_snapshot_points_to_local_cache(tmp_path):
    with pytest.warns(RedundantSnapshotWarning, match="local_cache="):
        sc.Dataset.range(10).snapshot("s3://bucket/snaps", progress=False).snapshot(
            str(tmp_path), progress=False)


def test_len_counts_the_committed_snapshot_that_epochs_read(root):
    """Found: with ``snapshot(key=...)`` ``len()`` came from the source (120) while every
    epoch read the keyed snapshot written from an earlier source (100 examples). A committed
    snapshot's count now comes first, below it and after it."""
    list(sc.Dataset.range(100).map(lambda i: {"id": i}).snapshot(root, key="v1",
                                                                   progress=False))
    grown = sc.Dataset.range(120).map(lambda i: {"id": i}).snapshot(root, key="v1",
                                                                     progress=False)
    for ds in (grown, grown.batch(8), grown.shuffle(10, seed=0).take(50), grown.cache(),
               grown.map(lambda e: e).batch(8, drop_remainder=True).repeat(2)):
        assert len(ds) == sum(1 for _ in ds) == len(list(ds.iterate(epoch=1)))
    assert len(grown) == 100 and len(grown.batch(8)) == 13
    # not committed yet: the source's length, which the writing epoch yields
    fresh = sc.Dataset.range(30).map(lambda i: {"id": i}).snapshot(root, key="v2",
                                                                    progress=False)
    assert len(fresh) == 30 == sum(1 for _ in fresh) == len(fresh)
