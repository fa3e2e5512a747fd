"""The shards of a snapshot in the order cooperating streams first read them
(``ordered.shards_in_read_order``, ``shares.first_needs``: the order a DataLoader's process fetches them into the
node-local cache for its workers) are the order the streams really read them in."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import snapcache as sc
from snapcache.pipeline.ordered import committed_reader, match, shards_in_read_order
from snapcache.pipeline.streams import StreamSpec


def example(i):
    return {"id": i, "x": np.full((2,), i, np.float32)}


def first_reads(ds, epoch, k, count, shard_of):
    """The shards stream ``k`` of ``count`` reads, in the order it first reads them."""
    seen: dict[int, None] = {}
    for batch in ds.iterate(epoch, stream=(k, count)):
        for row in np.asarray(batch["id"]).reshape(-1).tolist():
            seen.setdefault(shard_of(row), None)
    return list(seen)


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("tail", ["batch", "shuffle-batch", "big-window"])
def test_the_predicted_order_is_the_streams_first_reads_in_turn(tmp_path, count, tail):
    root = str(tmp_path / "snaps")
    base = sc.Dataset.range(900).map(example).snapshot(root, shard_size=2048, progress=False)
    assert len(list(base)) == 900
    ds = {"batch": base.batch(8), "shuffle-batch": base.shuffle(64, seed=5).batch(8),
          "big-window": base.shuffle(2000, seed=1)}[tail]
    reader = committed_reader(match(ds._op).snapshot)
    shards = reader.manifest.shards
    assert len(shards) >= 8
    ends = np.cumsum([s.rows for s in shards])

    def shard_of(row):
        return int(np.searchsorted(ends, row, side="right"))

    for epoch in (0, 3):
        actual = [first_reads(ds, epoch, k, count, shard_of) for k in range(count)]
        expected: dict[int, None] = {}
        for turn in itertools.zip_longest(*actual):
            for shard in turn:
                if shard is not None:
                    expected.setdefault(shard, None)
        for shard in range(len(shards)):
            expected.setdefault(shard, None)
        predicted = shards_in_read_order(ds._op, reader, epoch,
                                         [StreamSpec(k, count) for k in range(count)])
        assert predicted == list(expected)


def test_an_order_not_known_here_is_the_manifests(tmp_path):
    root = str(tmp_path / "snaps")
    base = sc.Dataset.range(300).map(example).snapshot(root, shard_size=2048, progress=False)
    list(base)
    reader = committed_reader(match(base._op).snapshot)
    everything = list(range(len(reader.manifest.shards)))
    unseeded = base.shuffle(50)  # one stream draws its seed when it starts
    assert shards_in_read_order(unseeded._op, reader, 0, [StreamSpec(0, 1)]) == everything
