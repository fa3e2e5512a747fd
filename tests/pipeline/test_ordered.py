"""Epochs over a snapshot in its global order: the run that writes the snapshot and the runs
that read it give the same order for the same (seed, epoch, streams); an iterator's state
resumes its epoch at exactly the next example, computing nothing before it; a state saved by
one stream of a lockstep job resumes the whole job with any number of streams, every
remaining example once."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import snapcache as sc


def example(i):
    return {"id": i, "x": np.full((2,), i, np.float32)}


def ids(items):
    out = []
    for item in items:
        value = item["id"] if isinstance(item, dict) else item
        out.extend(np.asarray(value).reshape(-1).tolist())
    return out


def pipeline(root, n=300, **kw):
    return sc.Dataset.range(n).map(example).snapshot(root, shard_size=kw.pop("shard_size", 2048),
                                                     progress=False, **kw)


def run_streams(ds, epoch, count, **kw):
    """Every stream of ``count`` at once (threads), as workers and ranks run."""
    results = [None] * count
    errors = []

    def run(k):
        try:
            results[k] = ids(ds.iterate(epoch, stream=(k, count), **kw))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("streams", [1, 2, 3])
@pytest.mark.parametrize("tail", ["shuffle", "shuffle-batch", "map-shuffle-batch"])
def test_the_writing_run_and_reading_runs_give_the_same_order(tmp_path, streams, tail):
    def build(root):
        ds = pipeline(root)
        if tail == "map-shuffle-batch":
            ds = ds.map(lambda e: {"id": e["id"], "y": e["x"] * 2})
        ds = ds.shuffle(64, seed=5)
        return ds.batch(16) if "batch" in tail else ds

    written = run_streams(build(str(tmp_path / "a")), 3, streams)   # writes the snapshot
    read = run_streams(build(str(tmp_path / "a")), 3, streams)      # reads it
    assert written == read
    assert sorted(sum(read, [])) == list(range(300))
    other = run_streams(build(str(tmp_path / "b")), 3, streams)     # another writer, same order
    assert other == read
    if streams == 1:
        assert read[0] != list(range(300))


def test_streams_are_not_correlated_and_rotate_between_epochs(root):
    ds = pipeline(root, n=2000).shuffle(100, seed=1)
    list(ds.iterate(0))
    e0 = run_streams(ds, 0, 2)
    e1 = run_streams(ds, 1, 2)
    diff = np.array(e0[1][:500]) - np.array(e0[0][:500])
    assert len(set(diff.tolist())) > 100
    assert set(e0[0]) != set(e1[0])


def test_unshuffled_reads_share_the_rows_in_order(root):
    ds = pipeline(root)
    list(ds)
    shares = run_streams(ds, 0, 3)
    assert sorted(sum(shares, [])) == list(range(300))
    for share in shares:
        assert share == sorted(share)


SHAPES = {
    "shuffle": lambda ds: ds.shuffle(50, seed=3),
    "shuffle-batch": lambda ds: ds.shuffle(50, seed=3).batch(8),
    "map-filter-shuffle-batch-prefetch": lambda ds: ds.map(
        lambda e: {"id": e["id"], "y": e["x"] + 1}, num_parallel_calls=2).filter(
        lambda e: e["id"] % 3 != 0).shuffle(40, seed=2).batch(7).prefetch(2),
    "batch": lambda ds: ds.batch(10),
    "map": lambda ds: ds.map(lambda e: e["id"] * 2),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("stop", [0, 1, 5, 17])
def test_state_resumes_at_exactly_the_next_example(root, shape, stop):
    ds = SHAPES[shape](pipeline(root))
    list(ds.iterate(0))  # the snapshot exists
    full = list(ds.iterate(4))
    it = ds.iterate(4)
    head = [next(it) for _ in range(min(stop, len(full)))]
    state = it.state_dict()
    json.dumps(state)
    assert len(json.dumps(state)) < 600
    rest = list(ds.iterate(state=json.loads(json.dumps(state))))
    assert ids(head + rest) == ids(full)


@pytest.mark.parametrize("shape", ["none", "shuffle"])
def test_rows_handed_out_in_runs_keep_an_exact_state(root, shape, monkeypatch):
    """Unbatched reads of whole columns hand rows out in runs (tagged.RUN at a time) straight
    from the run's list: a state taken anywhere, on a run's edge or inside it, counts exactly
    the rows handed out."""
    from snapcache.pipeline import tagged

    monkeypatch.setattr(tagged, "RUN", 7)
    ds = pipeline(root, n=100)
    if shape == "shuffle":
        ds = ds.shuffle(30, seed=4)
    list(ds.iterate(0))  # the snapshot exists
    full = list(ds.iterate(2))
    assert sorted(ids(full)) == list(range(100))
    for stop in (0, 1, 6, 7, 8, 14, 50, 99, 100):
        it = ds.iterate(2)
        head = [next(it) for _ in range(stop)]
        state = it.state_dict()
        assert state["consumed"] == stop
        assert it.state_dict() == state  # asking twice changes nothing
        rest = list(ds.iterate(state=state))
        assert ids(head + rest) == ids(full)
        it.close()


def test_closing_an_iterator_inside_a_run_ends_it(root, monkeypatch):
    from snapcache.pipeline import tagged

    monkeypatch.setattr(tagged, "RUN", 16)
    ds = pipeline(root, n=100)
    list(ds)
    it = iter(ds)
    assert ids([next(it) for _ in range(3)]) == [0, 1, 2]
    it.close()
    assert list(it) == []


def test_resume_computes_nothing_before_the_state(root):
    seen = []
    base = pipeline(root)
    list(base)

    def spy(e):
        seen.append(e["id"])
        return e

    ds = base.map(spy).shuffle(30, seed=1)
    it = ds.iterate(0)
    first = [next(it)["id"] for _ in range(100)]
    state = it.state_dict()
    it.close()
    seen.clear()
    rest = [e["id"] for e in ds.iterate(state=state)]
    assert sorted(seen) == sorted(rest) and not set(seen) & set(first)
    assert sorted(first + rest) == list(range(300))


@pytest.mark.parametrize("streams,new_streams", [(2, 3), (4, 1), (3, 2), (1, 4), (2, 2)])
@pytest.mark.parametrize("stop", [0, 3, 11])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_lockstep_state_resumes_the_whole_job_elastically(root, streams, new_streams, stop,
                                                            batch):
    ds = pipeline(root, n=250).shuffle(20, seed=9)
    if batch > 1:
        ds = ds.batch(batch)
    list(ds.iterate(0))
    seen = []
    states = []
    for k in range(streams):  # lockstep: every stream consumes `stop` items
        it = ds.iterate(2, stream=(k, streams))
        for _ in range(stop):
            try:
                seen.extend(ids([next(it)]))
            except StopIteration:
                break
        states.append(it.state_dict())
    state = states[0]  # rank 0's state resumes everyone
    rest = run_streams(ds, None, new_streams, state=state)
    flat = sum(rest, [])
    assert len(flat) == len(set(flat))
    assert sorted(flat + seen) == list(range(250))


DROPPING = {
    "batchdrop": lambda ds: ds.batch(4, drop_remainder=True),
    "batchdrop-batch": lambda ds: ds.batch(4, drop_remainder=True).batch(3),
    "shuffle-batchdrop": lambda ds: ds.shuffle(8, seed=3).batch(4, drop_remainder=True),
}
KEEPING = {
    "batchdrop": lambda ds: ds.batch(4),
    "batchdrop-batch": lambda ds: ds.batch(4),
    "shuffle-batchdrop": lambda ds: ds.shuffle(8, seed=3).batch(4),
}


@pytest.mark.parametrize("shape", sorted(DROPPING))
@pytest.mark.parametrize("to_the_end", [True, False])
@pytest.mark.parametrize("new_streams", [1, 3])
@pytest.mark.parametrize("n,written_by", [(30, 2), (250, 1)])
def test_what_an_ended_stream_dropped_stays_dropped_after_an_elastic_resume(
        root, shape, to_the_end, new_streams, n, written_by):
    """A stream that yielded its last item has ended: the remainder it drops at its share's
    end must not come back when the job resumes on another number of streams, whether the
    state was saved after the loop ended or right after the last item."""
    ds = DROPPING[shape](pipeline(root, n=n))
    keeping = KEEPING[shape](pipeline(root, n=n))  # the same shares, nothing dropped
    run_streams(ds, 0, written_by)  # 2: each stream's share is the rows it wrote
    items = [list(ds.iterate(1, stream=(k, 2))) for k in range(2)]
    dropped = [set(ids(keeping.iterate(1, stream=(k, 2)))) - set(ids(items[k]))
               for k in range(2)]
    ended = 0 if dropped[0] else 1  # a stream whose share's end is dropped
    assert dropped[ended]
    its = [ds.iterate(1, stream=(k, 2)) for k in range(2)]
    seen = ids(its[ended]) if to_the_end else \
        ids([next(its[ended]) for _ in range(len(items[ended]))])
    assert sorted(seen) == sorted(ids(items[ended]))
    seen += ids([next(its[1 - ended])])
    states = [it.state_dict() for it in its]
    job = {**states[0], "consumed_by_stream": [s["consumed"] for s in states], "consumed": 0}
    rest = sum(run_streams(ds, None, new_streams, state=job), [])
    assert not set(rest) & set(seen), "repeated"
    assert not set(rest) & dropped[ended], "brought back what the ended stream dropped"


def test_least_yielding_counts_what_a_shares_end_drops(tmp_path):
    from snapcache.pipeline import ordered

    base = pipeline(str(tmp_path / "s"))
    for make, least in [(lambda d: d.batch(4), 1), (lambda d: d.batch(4, drop_remainder=True), 4),
                        (lambda d: d.batch(4).batch(3, drop_remainder=True), 9),
                        (lambda d: d.batch(4, drop_remainder=True).batch(3), 4),
                        (lambda d: d.batch(2, drop_remainder=True).batch(3, drop_remainder=True),
                         6),
                        (lambda d: d.filter(bool).batch(4, drop_remainder=True), 1)]:
        assert ordered.match(make(base)._op).least_yielding == least


def test_a_state_names_its_snapshot(tmp_path):
    a = pipeline(str(tmp_path / "a")).shuffle(10, seed=1)
    b = sc.Dataset.range(300).map(lambda i: {"id": i + 1, "x": np.zeros(2, np.float32)}
                                  ).snapshot(str(tmp_path / "b"), progress=False
                                             ).shuffle(10, seed=1)
    list(a)
    list(b)
    it = a.iterate(0)
    next(it)
    state = it.state_dict()
    with pytest.raises(ValueError, match="belongs to snapshot"):
        list(b.iterate(state=state))
    with pytest.raises(ValueError, match="not an iterator state"):
        list(a.iterate(state={"consumed": 3}))
    with pytest.raises(ValueError, match="cannot resume"):
        a.take(3).iterate(state=state)


def test_unseeded_shuffles_resume_with_the_drawn_seed(root):
    ds = pipeline(root).shuffle(30)
    list(ds)
    it = ds.iterate(1)
    head = [next(it)["id"] for _ in range(40)]
    state = it.state_dict()
    rest = [e["id"] for e in ds.iterate(state=state)]
    assert sorted(head + rest) == list(range(300))
    assert head + rest != list(range(300))


@pytest.mark.parametrize("batch", [1, 4, (4, 3), (2, 5, 3)])
def test_a_state_saved_while_writing_resumes_the_write_then_the_position(root, counter, batch):
    def make(i):
        counter.hit()
        return example(i)

    ds = sc.Dataset.range(300).map(make).snapshot(root, shard_size=1024, progress=False)
    sizes = batch if isinstance(batch, tuple) else (batch,) if batch > 1 else ()
    if sizes:
        ds = ds.map(lambda e: e)
    for size in sizes:  # a batch of batches: an item takes the product of the sizes
        ds = ds.batch(size)
    it = ds.iterate(0)
    head = ids([next(it) for _ in range(150 // int(np.prod(sizes, dtype=int)))])
    state = json.loads(json.dumps(it.state_dict()))
    it.close()  # the process stops mid-write: finished shards stay
    computed = counter.count
    assert not committed_snapshots(root)
    rest = ids(ds.iterate(state=state))
    assert head + rest == list(range(300))
    assert counter.count - computed < 300  # finished shards were reused, not recomputed
    assert committed_snapshots(root)


def test_writing_states_are_refused_where_positions_do_not_apply(root):
    ds = pipeline(root).filter(lambda e: e["id"] % 2)
    it = ds.iterate(0)
    next(it)
    with pytest.raises(ValueError, match="writing epoch"):
        it.state_dict()


def committed_snapshots(root):
    import os

    return [d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "manifest.json"))]


def test_len_where_known(root):
    assert len(sc.Dataset.range(10).map(str).batch(3)) == 4
    gen = sc.Dataset.from_generator(lambda: iter(range(25))).snapshot(root, progress=False)
    with pytest.raises(TypeError, match="not known"):
        len(gen)
    assert gen  # truthy whatever its length
    list(gen)
    assert len(gen) == 25 and len(gen.shuffle(5, seed=0).batch(10)) == 3
    with pytest.raises(TypeError, match="not known"):
        len(gen.filter(bool))


def test_nothing_is_built_or_leased_before_the_first_example(root, counter):
    import os

    def make(i):
        counter.hit()
        return example(i)

    import gc
    import time

    def pipeline():
        return sc.Dataset.range(50).map(make).snapshot(root, progress=False).shuffle(10, seed=0)

    ds = pipeline()
    it = ds.iterate(0)
    assert counter.count == 0 and not os.path.exists(root)
    assert next(it)["id"] in range(50) and counter.count == 50
    it.close()
    (fp,) = os.listdir(root)

    def leases():
        return [n for n in os.listdir(os.path.join(root, fp)) if n.startswith("reader-")]

    del ds, it  # the pipeline object holds its read lease until it is collected
    gc.collect()
    deadline = time.monotonic() + 60
    while leases() and time.monotonic() < deadline:
        time.sleep(0.01)
    ds = pipeline()
    it = ds.iterate(1)
    assert not leases()
    next(it)
    assert leases()
    it.close()


@pytest.fixture(scope="module")
def grid_snapshot(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("grid") / "snaps")
    ds = pipeline(root, n=211, shard_size=1500)
    list(ds)
    return ds


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 3), epoch=st.integers(0, 3), world=st.integers(1, 3),
       workers=st.integers(1, 3), stop=st.integers(0, 40), new_world=st.integers(1, 3),
       new_workers=st.integers(1, 3), batch=st.sampled_from([1, 3]))
def test_resume_grid(grid_snapshot, seed, epoch, world, workers, stop, new_world, new_workers,
                     batch):
    """Every epoch a permutation; the same (seed, epoch) gives the same order for any number
    of streams' union; a resumed stream continues exactly; an elastic resume reads every
    remaining example once."""
    ds = grid_snapshot.shuffle(17, seed=seed)
    ds = ds.batch(batch) if batch > 1 else ds
    n = world * workers
    items = [list(ds.iterate(epoch, stream=(k, n))) for k in range(n)]
    full = [ids(i) for i in items]
    assert sorted(sum(full, [])) == list(range(211))
    stop = min([stop] + [len(i) for i in items])  # lockstep: no stream runs out before
    seen, states = [], []
    for k in range(n):  # lockstep stop
        it = ds.iterate(epoch, stream=(k, n))
        head = []
        for _ in range(stop):
            try:
                head.extend(ids([next(it)]))
            except StopIteration:
                break
        seen.extend(head)
        states.append(it.state_dict())
        assert head + ids(ds.iterate(state=states[-1], stream=(k, n))) == full[k]
    m = new_world * new_workers
    rest = [ids(ds.iterate(state=states[0], stream=(k, m))) for k in range(m)]
    flat = sum(rest, [])
    assert len(flat) == len(set(flat)) and sorted(flat + seen) == list(range(211))


def refuse_seven(e):
    if int(e["id"]) == 7:
        raise ValueError("boom")
    return e


def reject_seven(e):
    if int(e["id"]) == 7:
        raise KeyError("no such key")
    return True


ERROR_SHAPES = {
    "map": lambda ds: ds.map(refuse_seven),
    "map-threads": lambda ds: ds.map(refuse_seven, num_parallel_calls=2),
    "map-process": lambda ds: ds.map(refuse_seven, num_parallel_calls=2, executor="process"),
    "shuffle-map-batch": lambda ds: ds.shuffle(5, seed=0).map(refuse_seven).batch(3),
    "filter": lambda ds: ds.filter(reject_seven),
    "map-shuffle-filter": lambda ds: ds.map(lambda e: e).shuffle(5, seed=0).filter(reject_seven),
}


@pytest.mark.parametrize("shape", sorted(ERROR_SHAPES))
def test_an_error_after_a_committed_snapshot_names_the_users_function(root, shape):
    """Found: the ordered read runs the user's map/filter wrapped to carry positions, and the
    error note named the wrapper (``map `partial(_map_value)```) instead of the function."""
    list(pipeline(root, n=20))  # committed
    ds = ERROR_SHAPES[shape](pipeline(root, n=20))
    for epoch in range(2):
        with pytest.raises((ValueError, KeyError)) as raised:
            list(ds.iterate(epoch))
        note = " ".join(getattr(raised.value, "__notes__", []))
        name = "filter `reject_seven`" if "filter" in shape else "map `refuse_seven`"
        assert f"raised by {name} on example #" in note, note
        assert "partial" not in note


def refuse_batch_with_seven(batch):
    if 7 in batch["id"].tolist():
        raise ValueError("boom")
    return batch


def not_multiple_of_3(e):
    return int(e["id"]) % 3 != 0


NOTE_SHAPES = {
    "map": lambda ds: ds.map(refuse_seven),
    "threads": lambda ds: ds.map(refuse_seven, num_parallel_calls=2),
    "process": lambda ds: ds.map(refuse_seven, num_parallel_calls=2, executor="process"),
    "filter": lambda ds: ds.filter(reject_seven),
    "filter-map": lambda ds: ds.filter(not_multiple_of_3).map(refuse_seven),
    "batch-map": lambda ds: ds.batch(4).map(refuse_batch_with_seven),
    "shuffle-map": lambda ds: ds.shuffle(6, seed=2).map(refuse_seven),
    "shuffle-map-batch": lambda ds: ds.shuffle(6, seed=2).map(refuse_seven).batch(3),
}


def note_of(iterator):
    try:
        for _ in iterator:
            pass
    except (ValueError, KeyError) as e:
        return [n for n in e.__notes__ if n.startswith("snapcache: raised")]
    return None


@pytest.mark.parametrize("shape", sorted(NOTE_SHAPES))
def test_an_error_note_names_the_example_by_its_position_in_the_epoch_whatever_the_streams(
        root, shape):
    """Found: the note counted the failing input within the stream's share, so with
    DataLoader workers or ranks it named another example than without (example 7 of 20,
    stream 1 of 2: "#2 of this epoch"). It names the position in the epoch's order now (and
    the snapshot row, where a shuffle made them differ), the same for any number of streams
    and after a resume."""
    base = pipeline(root, n=20)
    list(base)  # committed
    ds = NOTE_SHAPES[shape](base)
    order = ids(base.shuffle(6, seed=2).iterate(0)) if "shuffle" in shape else list(range(20))
    at = order.index(7)
    what = "the batch whose last example is" if "batch-map" in shape else "example"
    name = "filter `reject_seven`" if shape == "filter" else \
        "map `refuse_batch_with_seven`" if "batch-map" in shape else "map `refuse_seven`"
    expected = f"snapcache: raised by {name} on {what} #{at} of this epoch" + (
        " (row 7 of the snapshot)" if at != 7 else "")
    for count in (1, 2, 3):
        notes = [note_of(ds.iterate(0, stream=(k, count))) for k in range(count)]
        assert [n for n in notes if n is not None] == [[expected]], (count, notes)
    if shape == "map":  # resumed from a state, on another number of streams
        it = ds.iterate(0)
        next(it), next(it)
        state = it.state_dict()
        notes = [note_of(ds.iterate(state=state, stream=(k, 2))) for k in range(2)]
        assert [n for n in notes if n is not None] == [[expected]], notes


BATCH_SHAPES = {
    "batch-batch": lambda ds: ds.batch(4).batch(3),
    "batch-batch-prefetch": lambda ds: ds.batch(4).prefetch(2).batch(3).prefetch(1),
    "batch-map-batch": lambda ds: ds.batch(4).map(lambda b: {**b, "y": b["x"] * 2}).batch(3),
    "batch-filter": lambda ds: ds.batch(4).filter(lambda b: int(b["id"][0]) % 8 != 0),
    "batchdrop-batch": lambda ds: ds.batch(4, drop_remainder=True).batch(3),
    "batch-batchdrop": lambda ds: ds.batch(4).batch(3, drop_remainder=True),
    "shuffle-batch-batch": lambda ds: ds.shuffle(16, seed=1).batch(4).batch(3),
    "shuffle-batchdrop-batch-batch": lambda ds: ds.shuffle(16, seed=1).batch(
        2, drop_remainder=True).batch(2).batch(3),
}


def by_hand(examples, shape):
    """What ``BATCH_SHAPES[shape]`` gives over ``examples`` (in the epoch's order), computed
    here batch by batch."""
    def batch(items, size, drop=False):
        cut = [items[i:i + size] for i in range(0, len(items), size)]
        if drop and cut and len(cut[-1]) < size:
            cut.pop()
        return [{k: np.stack([v[k] for v in group]) for k in group[0]} for group in cut]

    items = [{"id": np.asarray(e["id"]), "x": e["x"]} for e in examples]
    if shape == "shuffle-batchdrop-batch-batch":
        return batch(batch(batch(items, 2, True), 2), 3)
    first = batch(items, 4, "batchdrop" in shape)
    if shape == "batch-filter":
        return [b for b in first if int(b["id"][0]) % 8 != 0]
    out = batch(first, 3, shape.endswith("batchdrop"))
    if shape == "batch-map-batch":
        out = [{**b, "y": b["x"] * 2} for b in out]
    return out


def assert_same_items(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            assert np.asarray(g[k]).shape == w[k].shape, k
            np.testing.assert_array_equal(g[k], w[k])


@pytest.mark.parametrize("shape", sorted(BATCH_SHAPES))
def test_every_op_after_the_first_batch_runs_on_a_committed_snapshot(root, shape):
    """Found: ``snapshot -> batch(4) -> batch(3)`` read whole columns, cut the first batch and
    never ran the second (items of shape (4,), 13 of them, while len() said 5)."""
    ds = BATCH_SHAPES[shape](pipeline(root, n=50))  # 13 batches of 4 (the last of 2)
    written = list(ds.iterate(1))  # the writing epoch
    read = list(ds.iterate(1))     # the committed snapshot, in whole columns where it can be
    base = pipeline(root, n=50)
    order = list((base.shuffle(16, seed=1) if "shuffle" in shape else base).iterate(1))
    want = by_hand(order, shape)
    assert_same_items(read, want)
    assert_same_items(written, want)
    if "filter" not in shape:
        assert len(ds) == len(want)


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("shuffled", [False, True])
def test_streams_share_a_batch_of_batches_in_whole_items(root, streams, shuffled):
    """Shares are cut in whole items of the outer batch (12 positions for batch(4).batch(3)):
    only the last stream's last batch is short, as in one process, and len() is what the
    streams yield together."""
    ds = pipeline(root, n=100)
    if shuffled:
        ds = ds.shuffle(10, seed=2)
    ds = ds.batch(4).batch(3)
    list(ds.iterate(0))
    shares = [list(ds.iterate(1, stream=(k, streams))) for k in range(streams)]
    shapes = [np.asarray(item["id"]).shape for share in shares for item in share]
    assert shapes.count((3, 4)) == 8 and len(shapes) == 9 == len(ds)
    assert sorted(ids(sum(shares, []))) == list(range(100))


@pytest.mark.parametrize("shape", sorted(BATCH_SHAPES))
@pytest.mark.parametrize("streams,new_streams", [(1, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("stop", [0, 1, 3])
def test_a_batch_of_batches_resumes_exactly(root, shape, streams, new_streams, stop):
    # 144 examples: every stream's share is whole batches of 4 (no batch of batches of
    # different sizes, which cannot be stacked)
    ds = BATCH_SHAPES[shape](pipeline(root, n=144))
    list(ds.iterate(0))
    # the uninterrupted epoch, by the row path (a map after the snapshot: no whole columns)
    rows = BATCH_SHAPES[shape](pipeline(root, n=144).map(lambda e: e))
    full = [list(rows.iterate(2, stream=(k, streams))) for k in range(streams)]
    heads, states = [], []
    for k in range(streams):  # lockstep: every stream takes `stop` items
        it = ds.iterate(2, stream=(k, streams))
        heads.append([next(it) for _ in range(stop)])
        states.append(json.loads(json.dumps(it.state_dict())))
        it.close()
    if streams == new_streams:  # each stream continues its own share, in the same order
        for k in range(streams):
            rest = list(ds.iterate(state=states[k], stream=(k, streams)))
            assert_same_items(heads[k] + rest, [dict(i) for i in full[k]])
        return
    if shape == "batch-filter":
        return  # rank 0's state alone does not say where the others are (tested elsewhere)
    rest = [ids(ds.iterate(state=states[0], stream=(k, new_streams)))
            for k in range(new_streams)]
    seen = ids(sum(heads, []))
    flat = sum(rest, []) + seen
    everything = set(ids(sum(full, [])))
    assert len(flat) == len(set(flat))
    if "drop" in shape:  # what is dropped depends on how the rest is shared out
        assert set(seen) <= everything
    else:
        assert sorted(flat) == sorted(everything)


def rebuilt(root, streams, shard_size=2048):
    """The snapshot at ``root`` lost and written again by ``streams`` streams."""
    import shutil

    shutil.rmtree(root)
    ds = pipeline(root, shard_size=shard_size).shuffle(50, seed=7).batch(10)
    run_streams(ds, 0, streams)
    return ds


@pytest.mark.parametrize("change", ["streams", "shard_size"])
def test_a_state_is_refused_by_a_snapshot_rebuilt_with_another_layout(root, change):
    """Found: a mid-epoch state was applied to a snapshot rebuilt (same id) by another number
    of streams or with another shard_size, whose epoch order differs: examples repeated and
    lost, silently. The state now names the layout it was read in."""
    ds = pipeline(root).shuffle(50, seed=7).batch(10)
    run_streams(ds, 0, 2)  # written by 2 streams
    it = ds.iterate(1, stream=(0, 2))
    next(it)
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert isinstance(state["layout"], str)
    again = rebuilt(root, 3) if change == "streams" else rebuilt(root, 2, shard_size=1500)
    for streams in (2, 3):
        with pytest.raises(ValueError, match="rebuilt with another layout.*Start the epoch "
                                             "again: iterate without the state"):
            next(again.iterate(state=state, stream=(0, streams)))
    # what the message says to do works: the epoch again, from its start, every example once
    assert sorted(sum(run_streams(again, 1, 3), [])) == list(range(300))


def test_a_snapshot_rebuilt_with_the_same_layout_resumes_exactly(root):
    ds = pipeline(root).shuffle(50, seed=7).batch(10)
    run_streams(ds, 0, 2)
    full = run_streams(ds, 1, 2)
    heads, states = [], []
    for k in range(2):
        it = ds.iterate(1, stream=(k, 2))
        heads.append(ids([next(it) for _ in range(4)]))
        states.append(json.loads(json.dumps(it.state_dict())))
        it.close()
    again = rebuilt(root, 2)  # the same bytes: the same layout
    for k in range(2):
        assert heads[k] + ids(again.iterate(state=states[k], stream=(k, 2))) == full[k]


def test_a_state_saved_before_the_layout_was_recorded_still_resumes(root):
    """States saved by the previous release have no ``layout``: taken unchecked, as then."""
    ds = pipeline(root).shuffle(50, seed=7).batch(10)
    list(ds.iterate(0))
    full = ids(ds.iterate(1))
    it = ds.iterate(1)
    head = ids([next(it) for _ in range(5)])
    state = it.state_dict()
    del state["layout"]
    assert head + ids(ds.iterate(state=state)) == full


def test_every_reading_state_names_its_layout(root):
    from snapcache.store.ordered_read import layout_id
    from snapcache.store.reader import load_manifest
    from snapcache.store.fs import Storage

    ds = pipeline(root).map(lambda e: e).batch(4)
    it = ds.iterate(0)  # the writing epoch: nothing committed, no layout yet
    next(it)
    writing = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert "layout" not in writing
    resumed = ds.iterate(state=writing)  # still being written: streams as it is written
    next(resumed)
    assert "layout" not in resumed.state_dict() and resumed.state_dict()["writing"]
    list(resumed)  # commits it
    (folder,) = committed_snapshots(root)
    layout = layout_id(load_manifest(Storage(root).child(folder)))
    resumed = ds.iterate(state=writing)  # committed now: reads it
    next(resumed)
    assert resumed.state_dict()["layout"] == layout
    shuffled = pipeline(root).shuffle(20, seed=1).batch(4)
    it = shuffled.iterate(2, stream=(0, 2))
    next(it)
    assert it.state_dict()["layout"] == layout
    elastic = shuffled.iterate(state=it.state_dict(), stream=(1, 3))  # another stream count
    next(elastic)
    assert elastic.state_dict()["layout"] == layout


def test_a_writing_state_resumes_without_waiting_for_the_other_streams(root):
    """A stream's state saved while the snapshot is written resumes as the writing epoch
    runs: it goes on with its share at once (finished shards read back, the rest written),
    not after the other streams' commit. A stream that waited for it would never yield while
    a loader waited on another stream first; here, in one thread, it would wait for ever."""
    ds = pipeline(root).map(lambda e: e).batch(4)
    it = ds.iterate(0, stream=(0, 2))
    head = [next(it) for _ in range(30)]  # past its first shard
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    rest = list(ds.iterate(state=state, stream=(0, 2)))
    assert committed_snapshots(root) == [] and len(head) + len(rest) == 38
    other = list(ds.iterate(0, stream=(1, 2)))
    assert sorted(ids(head + rest + other)) == list(range(300))
    assert len(committed_snapshots(root)) == 1
    with pytest.raises(ValueError, match="resumes only with the same streams"):
        next(ds.iterate(state=state, stream=(0, 3)))


@pytest.mark.parametrize("before,resumable", [
    (lambda ds: ds.map(example, num_parallel_calls=2, deterministic=False), False),
    (lambda ds: ds.shuffle(8).map(example), False),
    (lambda ds: ds.shuffle(8, seed=3).map(example), True),
    (lambda ds: ds.map(example, num_parallel_calls=2), True)])
def test_a_writing_state_is_refused_when_the_order_before_the_snapshot_varies(
        root, before, resumable):
    """A writing epoch's state counts the rows a stream yielded in the order it was writing
    them. A resumed stream writes (or restarts) its share again: if an op before the snapshot
    yields in an order that varies between runs, the rows it skips are not the ones that were
    yielded, so the state is refused with the way out instead of repeating or losing some."""
    ds = before(sc.Dataset.range(60)).snapshot(root, shard_size=2048, progress=False).batch(4)
    it = ds.iterate(0)
    head = [next(it) for _ in range(3)]
    if not resumable:
        with pytest.raises(ValueError, match="varies between runs.*deterministic=True"):
            it.state_dict()
        return
    state = it.state_dict()
    it.close()
    assert sorted(ids(head + list(ds.iterate(state=state)))) == list(range(60))


def test_a_state_an_earlier_release_saved_for_a_batch_of_batches_resumes(root):
    """Earlier releases recorded the first batch's size as the unit of batch(4).batch(3)
    (now 12, the positions of a whole item): their reading states still resume exactly."""
    ds = pipeline(root, n=144).batch(4).batch(3)
    list(ds.iterate(0))
    it = ds.iterate(2)
    head = [next(it) for _ in range(3)]
    state = {**it.state_dict(), "unit": 4}  # as saved before: its share was cut in 4s
    it.close()
    rest = list(ds.iterate(state=state))
    assert sorted(ids(head + rest)) == list(range(144))
