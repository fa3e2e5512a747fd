"""Exactly-once in every state: the streams of an epoch (DataLoader workers x ranks) together
yield every example once, whatever the upstream (element-wise or not) and whether they write,
wait for another writer, replay a stream recorded before the commit, or read the committed
snapshot."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import pytest

import snapcache as sc
from snapcache.errors import CorruptSnapshotError
import snapcache.store.writer as writer_module
from snapcache.pipeline import snapshot_exec
from snapcache.store.reader import load_manifest

N = 120


def square(i):
    return i * i


def odd(i):
    return i % 2 == 1


def total(batch):
    return int(sum(batch))


UPSTREAMS = {
    "map": (lambda: sc.Dataset.range(N).map(square), [i * i for i in range(N)]),
    "filter": (lambda: sc.Dataset.range(N).filter(odd), [i for i in range(N) if i % 2]),
    "unordered map": (lambda: sc.Dataset.range(N).map(square, num_parallel_calls=2,
                                                      deterministic=False),
                      [i * i for i in range(N)]),
    "batch": (lambda: sc.Dataset.range(N).batch(7).map(total),
              [sum(range(k, min(k + 7, N))) for k in range(0, N, 7)]),
    "seeded shuffle": (lambda: sc.Dataset.range(N).shuffle(16, seed=3), list(range(N))),
    "take": (lambda: sc.Dataset.range(3 * N).take(N), list(range(N))),
}


def run_streams(ds, count, parallel):
    def one(k):
        return [int(x) for x in ds.iterate(epoch=0, stream=(k, count))]
    if not parallel:
        return [one(k) for k in range(count)]
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, k) for k in range(count)]
        return [f.result(timeout=300) for f in futures]


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("upstream", list(UPSTREAMS))
@pytest.mark.parametrize("state", ["write in turn", "write at once", "replay", "read"])
def test_streams_yield_every_example_once(tmp_path, monkeypatch, upstream, count, state):
    make, expected = UPSTREAMS[upstream]
    ds = make().snapshot(str(tmp_path), shard_size=400, progress=False)
    if state == "replay":  # every stream recorded, nobody committed (the crash window)
        with monkeypatch.context() as patched:
            patched.setattr(writer_module, "try_commit", lambda *a, **k: None)
            patched.setattr(snapshot_exec, "try_commit", lambda *a, **k: None)
            for k in range(count):
                try:
                    list(ds.iterate(epoch=0, stream=(k, count)))
                except CorruptSnapshotError:  # one writer for all streams: it reads back
                    pass                       # after its commit, which we prevented
        assert load_manifest(ds.open_snapshot().storage) is None
    if state == "read":
        list(ds)
    outputs = run_streams(ds, count, parallel=state == "write at once")
    seen = collections.Counter(x for out in outputs for x in out)
    assert seen == collections.Counter(expected), (upstream, count, state)
    assert ds.open_snapshot().state == "committed"
    again = run_streams(ds, count, parallel=False)  # and once committed
    assert collections.Counter(x for out in again for x in out) == collections.Counter(expected)


CACHED = {
    "snapshot -> map -> cache": lambda ds: ds.map(square).cache(),
    "snapshot -> shuffle -> cache": lambda ds: ds.shuffle(16, seed=3).cache(),
}


@pytest.mark.parametrize("filled_by", ["the whole epoch", "a share"])
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("tail", list(CACHED))
def test_a_cache_replays_only_to_whole_epochs_and_streams_compute_their_share(
        tmp_path, tail, count, filled_by):
    """Found: ``cache()`` replayed whatever one complete run had stored to every later run,
    whatever its stream: after a pass in the main process each DataLoader worker yielded the
    whole epoch (every example ``count`` times), and after a run of one stream's share a
    whole epoch yielded that share only. A cache serves whole single-stream epochs; the
    streams of an epoch each compute their share, in every epoch and whatever filled it."""
    base = sc.Dataset.range(N).snapshot(str(tmp_path), shard_size=400, progress=False)
    expected = collections.Counter(x for x in (square(i) if "map" in tail else i
                                               for i in range(N)))
    list(base)  # committed
    ds = CACHED[tail](base)
    if filled_by == "a share":
        list(ds.iterate(epoch=0, stream=(0, count)))
    else:
        list(ds.iterate(epoch=0))
    for epoch in (1, 2):
        whole = [int(x) for x in ds.iterate(epoch=epoch)]
        assert collections.Counter(whole) == expected, (epoch, "whole epoch")
        shares = [[int(x) for x in ds.iterate(epoch=epoch, stream=(k, count))]
                  for k in range(count)]
        assert collections.Counter(x for share in shares for x in share) == expected, \
            (epoch, "streams")


def test_a_filled_cache_replays_whole_epochs_without_computing(tmp_path, counter):
    """What the cache is for, kept: once a whole epoch filled it, whole epochs replay it."""
    def costly(i):
        counter.hit()
        return i + 1

    ds = sc.Dataset.range(N).snapshot(str(tmp_path), progress=False).map(costly).cache()
    list(ds.iterate(epoch=0, stream=(1, 2)))  # a share: computed, not stored
    assert counter.count == N // 2
    assert list(ds) == [i + 1 for i in range(N)]  # the first whole epoch fills it
    calls = counter.count
    assert list(ds) == [i + 1 for i in range(N)] and counter.count == calls
