"""Ops describe themselves: traits, fingerprint fields, runners; decisions derive from them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import snapcache
from snapcache.pipeline import ops, plan
from snapcache.pipeline.ops import base
from snapcache.pipeline.ops import resumable, splittable

ALL_OPS = [cls for cls in vars(ops).values()
           if isinstance(cls, type) and issubclass(cls, ops.Op) and cls is not ops.Op]


def double(x):
    return x * 2


def keep_even(x):
    return x % 2 == 0


def pipeline(ds):
    return ds._op


def test_every_op_has_a_runner_and_declares_every_field():
    for cls in ALL_OPS:
        assert cls in ops.RUNNERS, f"{cls.__name__} has no registered runner"
        declared = (set(cls.fingerprint_functions) | set(cls.fingerprint_args)
                    | set(cls.fingerprint_source) | set(cls.fingerprint_args_if_set)
                    | set(cls.not_fingerprinted))
        fields = {f.name for f in dataclasses.fields(cls)} - {"parent"}
        assert fields == declared, (
            f"{cls.__name__}: fields {sorted(fields - declared)} are not declared as counting "
            f"or not counting toward the fingerprint; declared but absent: "
            f"{sorted(declared - fields)}")
        counted = (set(cls.fingerprint_functions) | set(cls.fingerprint_args)
                   | set(cls.fingerprint_source) | set(cls.fingerprint_args_if_set))
        assert not counted & set(cls.not_fingerprinted)


@pytest.mark.parametrize("how", [dict(num_parallel_calls=4), dict(executor="process"),
                                 dict(deterministic=False),
                                 dict(num_parallel_calls=snapcache.AUTOTUNE)])
def test_how_a_map_runs_does_not_count(how):
    ds = snapcache.Dataset.range(10)
    assert ds.map(double).fingerprint() == ds.map(double, **how).fingerprint()


def test_what_a_map_computes_counts():
    ds = snapcache.Dataset.range(10)
    assert ds.map(double).fingerprint() != ds.map(keep_even).fingerprint()
    assert ds.batch(2).fingerprint() != ds.batch(3).fingerprint()
    assert ds.interleave(lambda x: [x], cycle_length=2).fingerprint() != \
        ds.interleave(lambda x: [x], cycle_length=3).fingerprint()
    assert ds.interleave(lambda x: [x], cycle_length=2, num_parallel_calls=2).fingerprint() == \
        ds.interleave(lambda x: [x], cycle_length=2).fingerprint()


def test_fingerprint_digests_did_not_move():
    # The declared-field fingerprints equal the hand-written ones they replaced.
    from snapcache.fingerprint import hash_function, hash_value
    from snapcache.fingerprint.tree import combine, pipeline_root

    ds = snapcache.Dataset.range(7).map(double).batch(2, drop_remainder=True)
    tree = plan.pipeline_fingerprint(ds._op)
    source, map_op, batch_op = [node for node in ops.lineage(ds._op)]
    expected = pipeline_root([
        combine("source", source.fingerprint_children("source"), kind="op:range",
                summary=source.describe()),
        combine("map #1 `double`", [hash_function(double, "function `double`",
                                                  where="map #1 `double`")],
                kind="op:map", summary="map `double`"),
        combine("batch #2", [hash_value(2, "argument `batch_size`", where="batch #2"),
                             hash_value(True, "argument `drop_remainder`", where="batch #2")],
                kind="op:batch", summary="batch(2)")])
    assert tree.digest == expected.digest


def test_order_preserving_follows_deterministic():
    ds = snapcache.Dataset.range(10)
    assert ds.map(double)._op.traits.order_preserving
    assert not ds.map(double, deterministic=False)._op.traits.order_preserving
    assert not ds.shuffle(4, seed=0)._op.traits.order_preserving
    assert not ds.interleave(lambda x: [x], deterministic=False)._op.traits.order_preserving


def test_splittable_and_resumable_derive_from_traits():
    ds = snapcache.Dataset.range(100)
    assert splittable(pipeline(ds.map(double).filter(keep_even).prefetch().cache()))
    assert not splittable(pipeline(ds.shuffle(10, seed=0)))
    assert not splittable(pipeline(ds.batch(2)))
    assert resumable(pipeline(ds.map(double).prefetch()))
    assert not resumable(pipeline(ds.map(double, deterministic=False)))
    assert not resumable(pipeline(ds.filter(keep_even)))
    assert not resumable(pipeline(ds.map(double).cache()))
    assert resumable(pipeline(snapcache.Dataset.from_iterable([1, 2, 3]).map(double)))
    assert not resumable(pipeline(snapcache.Dataset.from_iterable({1: 0, 2: 0}.keys())))
    assert not resumable(pipeline(snapcache.Dataset.from_generator(lambda: iter([1]))))


@pytest.mark.parametrize("build, expected", [
    (lambda ds: ds, 10),
    (lambda ds: ds.map(double).prefetch().shuffle(3, seed=1), 10),
    (lambda ds: ds.batch(3), 4),
    (lambda ds: ds.batch(3, drop_remainder=True), 3),
    (lambda ds: ds.take(4), 4),
    (lambda ds: ds.take(40), 10),
    (lambda ds: ds.shard(3, 1), 3),
    (lambda ds: ds.repeat(2), 20),
    (lambda ds: ds.repeat(), None),
    (lambda ds: ds.filter(keep_even), None),
    (lambda ds: ds.interleave(lambda x: [x]), None),
])
def test_known_length_is_the_real_length(build, expected):
    ds = build(snapcache.Dataset.range(10))
    assert ops.known_length(ds._op) == expected
    if expected is not None:
        assert sum(1 for _ in ds) == expected


TAKE_UPSTREAMS = {
    "range": (lambda: snapcache.Dataset.range(40), True),
    "list, map, prefetch": (lambda: snapcache.Dataset.from_iterable(list(range(40)))
                            .map(double).prefetch(), True),
    "generator": (lambda: snapcache.Dataset.from_generator(lambda: iter(range(40))), True),
    "take of a take": (lambda: snapcache.Dataset.range(60).take(40), True),
    "filter": (lambda: snapcache.Dataset.range(80).filter(keep_even), False),
    "seeded shuffle": (lambda: snapcache.Dataset.range(40).shuffle(8, seed=1), False),
}


SELECTIONS = {f"take({k})": (lambda ds, k=k: ds.take(k)) for k in (0, 1, 7, 13, 40, 100)}
SELECTIONS.update({f"shard({n}, {i})": (lambda ds, n=n, i=i: ds.shard(n, i))
                   for n, i in ((2, 0), (2, 1), (3, 2), (4, 1), (7, 3))})


@pytest.mark.parametrize("count", [2, 3, 5])
@pytest.mark.parametrize("upstream", list(TAKE_UPSTREAMS))
@pytest.mark.parametrize("selection", list(SELECTIONS))
def test_streams_select_by_position_together(upstream, count, selection):
    """take(k) and shard(n, i) run as n streams (DataLoader workers, ranks) yield what one
    run yields, not that of each stream's share (take(k) yielded k per stream): after a
    strided upstream each stream its own (so a snapshot of it is written by every stream),
    otherwise stream 0 all of it."""
    make, positional = TAKE_UPSTREAMS[upstream]
    ds = SELECTIONS[selection](make())
    alone = list(ds)
    assert len(alone) == ops.known_length(ds._op) or ops.known_length(ds._op) is None
    shares = [list(ds.iterate(epoch=0, stream=(i, count))) for i in range(count)]
    assert sorted(x for share in shares for x in share) == sorted(alone)
    if positional:  # each stream the ones at its positions of the upstream (values unique)
        position = {x: p for p, x in enumerate(make())}
        assert shares == [[x for x in alone if position[x] % count == i] for i in range(count)]
    else:
        assert shares == [alone] + [[]] * (count - 1)
    assert splittable(pipeline(ds)) is positional
    assert ops.strided(pipeline(make())) is positional


def test_a_take_after_a_snapshot_under_streams_is_the_snapshots_first_k(tmp_path):
    ds = snapcache.Dataset.range(100).map(double).snapshot(str(tmp_path), progress=False)
    list(ds)
    taken = ds.take(30)
    shares = [list(taken.iterate(epoch=0, stream=(i, 4))) for i in range(4)]
    assert [x for share in shares for x in share] == list(taken) == [2 * i for i in range(30)]


def test_a_take_before_a_snapshot_is_written_by_every_stream(tmp_path):
    """range(400).take(200).map(f).snapshot() with 2 workers: each computes its half (it was
    one worker computing all 200 while the other waited)."""
    ds = snapcache.Dataset.range(400).take(200).map(double).snapshot(
        str(tmp_path), progress=False)
    outputs = [list(ds.iterate(epoch=0, stream=(i, 2))) for i in range(2)]
    assert sorted(x for out in outputs for x in out) == [2 * i for i in range(200)]
    manifest = ds.open_snapshot().manifest
    assert manifest.num_examples == 200
    # shards are named <run>-<stream>-<seq>: each stream wrote its 100
    assert sorted((s.path.split("-")[1], s.rows) for s in manifest.shards) == [
        ("0000", 100), ("0001", 100)]


def test_per_stream_and_structure_traits():
    ds = snapcache.Dataset.range(10)
    per_stream = {node.kind for node in ops.lineage(
        ds.take(5).batch(2).shard(2, 0).map(double).filter(keep_even).shuffle(2).repeat(2)
        .prefetch().cache()._op) if node.traits.per_stream}
    assert per_stream == {"take", "batch", "shard"}
    assert ds.batch(2)._op.traits.batch_dims == 1
    assert not ds.map(double)._op.traits.structure_preserving


def test_no_op_type_lists_outside_the_ops():
    # Decisions about what kind of op something is live in the ops (their traits).
    import snapcache.adapters.ray as ray_adapter
    import snapcache.adapters.tf as tf_adapter

    assert not hasattr(tf_adapter, "STRUCTURE_PRESERVING")
    assert not hasattr(ray_adapter, "_PER_STREAM")
    assert not hasattr(ops, "SOURCES")


def test_an_op_without_a_runner_is_named():
    @dataclasses.dataclass(frozen=True, eq=False)
    class Orphan(ops.Op):
        kind = "orphan"

    with pytest.raises(TypeError, match="Orphan"):
        base.run(Orphan(parent=None), 0)


def test_traits_validate_the_length_rule():
    with pytest.raises(ValueError, match="length"):
        ops.Traits(length="sometimes")


def test_ops_pickle_without_their_memos():
    import pickle

    ds = snapcache.Dataset.from_iterable(np.arange(5)).map(double)
    ds.fingerprint()
    op = pickle.loads(pickle.dumps(ds._op))
    assert "_memos" not in op.__dict__
    assert plan.pipeline_fingerprint(op).digest == ds.fingerprint()
