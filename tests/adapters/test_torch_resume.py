"""torch resume: a StatefulDataLoader checkpointed mid-epoch resumes at exactly the next
example, with any number of workers, in a fresh process too; rank 0's loader state resumes a
whole lockstep job with another world size and worker count; DDP-ready shares give every rank
the same count; batching across workers leaves one partial batch per epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful.StatefulDataLoader

import snapcache as sc  # noqa: E402
from snapcache.adapters.torch import job_state  # noqa: E402

N = 97


def make(i):
    return {"id": i, "x": np.full((3,), i, np.float32)}


def build(root, n=N):
    ds = sc.Dataset.range(n).map(make).snapshot(root, shard_size=1024, progress=False)
    list(ds)  # written once: the tests below read
    return ds


def ids_of(batches):
    return [int(i) for b in batches for i in np.asarray(b["id"]).reshape(-1)]


def take(it, k):
    return [next(it) for _ in range(k)]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_in", ["pipeline", "loader"])
def test_stateful_dataloader_resumes_exactly(root, workers, batch_in):
    ds = build(root).map(lambda e: e).shuffle(16, seed=4)
    if batch_in == "pipeline":
        ds, kwargs = ds.batch(5), {"batch_size": None}
    else:
        kwargs = {"batch_size": 5}

    def loader():
        torch_ds = ds.to_torch()
        torch_ds.set_epoch(2)
        return StatefulDataLoader(torch_ds, num_workers=workers, **kwargs)

    full = ids_of(loader())
    assert sorted(full) == list(range(N))
    first = loader()
    it = iter(first)
    head = ids_of(take(it, 7))
    state = json.loads(json.dumps(first.state_dict()))
    del it
    again = loader()
    again.load_state_dict(state)
    rest = ids_of(again)
    assert head + rest == full


RESUME_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import snapcache as sc
    from torchdata.stateful_dataloader import StatefulDataLoader
    sys.path.insert(0, {tests!r})
    from test_torch_resume import make
    ds = sc.Dataset.range({n}).map(make).snapshot({root!r}, shard_size=1024, progress=False)
    loader = StatefulDataLoader(ds.shuffle(16, seed=4).batch(4).to_torch(), batch_size=None,
                                num_workers=2)
    loader.load_state_dict(json.load(open({state!r})))
    print(json.dumps([int(i) for b in loader for i in np.asarray(b["id"]).reshape(-1)]))
""")


def test_a_fresh_process_resumes_a_two_worker_loader(root, tmp_path):
    ds = build(root).shuffle(16, seed=4).batch(4)
    full = ids_of(StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2))
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)
    it = iter(loader)
    head = ids_of(take(it, 9))
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(loader.state_dict()))
    del it
    code = RESUME_CHILD.format(tests=os.path.dirname(__file__), n=N, root=root,
                               state=str(state_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [os.path.dirname(os.path.dirname(sc.__file__))] +
                             os.environ.get("PYTHONPATH", "").split(os.pathsep))})
    assert out.returncode == 0, out.stderr
    rest = json.loads(out.stdout.strip().splitlines()[-1])
    assert head + rest == full


@pytest.mark.parametrize("batch", [1, 4])
def test_two_ranks_of_two_workers_resume_as_one_rank_of_three(root, batch):
    ds = build(root).shuffle(10, seed=1)
    if batch > 1:
        ds = ds.batch(batch)
    steps = 5
    loaders = [StatefulDataLoader(ds.to_torch(rank=r, world_size=2), batch_size=None,
                                  num_workers=2) for r in range(2)]

    def run(r):  # lockstep: every rank takes `steps` batches
        it = iter(loaders[r])
        got = ids_of(take(it, steps))
        return got, loaders[r].state_dict()

    (seen0, state0), (seen1, _) = run(0), run(1)  # the snapshot is committed: one by one
    job = job_state(json.loads(json.dumps(state0)))
    resumed = StatefulDataLoader(ds.to_torch(rank=0, world_size=1, state=job),
                                 batch_size=None, num_workers=3)
    rest = ids_of(resumed)
    assert len(rest) == len(set(rest))
    assert sorted(seen0 + seen1 + rest) == list(range(N))


def test_job_state_keeps_the_layout_and_a_rebuilt_snapshot_refuses_it(root):
    """An elastic resume's state names the snapshot's layout (what its order depends on): a
    snapshot lost and rebuilt with another layout (here another shard_size) refuses it rather
    than repeat some examples and skip others."""
    import shutil

    ds = build(root).shuffle(10, seed=1).batch(4)
    loader = StatefulDataLoader(ds.to_torch(rank=0, world_size=2), batch_size=None,
                                num_workers=2)
    take(iter(loader), 3)
    job = job_state(json.loads(json.dumps(loader.state_dict())))
    assert isinstance(job["layout"], str)
    shutil.rmtree(root)
    again = sc.Dataset.range(N).map(make).snapshot(root, shard_size=700, progress=False)
    list(again)
    resumed = StatefulDataLoader(again.shuffle(10, seed=1).batch(4).to_torch(state=job),
                                 batch_size=None, num_workers=0)
    with pytest.raises(ValueError, match="rebuilt with another layout"):
        next(iter(resumed))


@pytest.mark.parametrize("workers,new_world,new_workers", [(0, 1, 0), (2, 1, 3), (1, 3, 2)])
def test_with_a_filter_every_ranks_state_resumes_the_job(root, workers, new_world, new_workers):
    """A filter after the snapshot: ranks in lockstep on batches have read different numbers
    of examples, so rank 0's state alone is refused and every rank's state resumes exactly."""
    ds = build(root).shuffle(10, seed=1).filter(lambda e: int(e["id"]) % 3 != 0).batch(4)
    loaders = [StatefulDataLoader(ds.to_torch(rank=r, world_size=2), batch_size=None,
                                  num_workers=workers) for r in range(2)]
    its = [iter(loader) for loader in loaders]
    seen = []
    for _ in range(4):  # lockstep: every rank takes 4 batches
        for it in its:
            seen += ids_of([next(it)])
    states = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    del its
    with pytest.raises(ValueError, match="Pass every rank's loader state"):
        job_state(states[0])
    with pytest.raises(ValueError, match="not in rank order"):
        job_state(states[::-1])
    job = job_state(states)
    rest = []
    for r in range(new_world):
        rest += ids_of(StatefulDataLoader(ds.to_torch(rank=r, world_size=new_world, state=job),
                                          batch_size=None, num_workers=new_workers))
    assert len(seen + rest) == len(set(seen + rest))
    assert sorted(seen + rest) == [i for i in range(N) if i % 3]


def test_one_streams_state_of_a_filtered_pipeline_does_not_resume_the_others(root):
    ds = build(root).shuffle(10, seed=1).filter(lambda e: int(e["id"]) % 3 != 0).batch(4)
    it = ds.iterate(stream=(0, 2))
    next(it)
    state = it.state_dict()
    it.close()
    with pytest.raises(ValueError, match="does not say where the others are"):
        next(ds.iterate(stream=(1, 2), state=state))
    with pytest.raises(ValueError, match="does not say where the others are"):
        next(ds.iterate(state=state))
    own = ds.iterate(stream=(0, 2), state=state)  # its own stream continues
    assert ids_of(list(own))
    own.close()


@pytest.mark.parametrize("mode", ["drop", "pad"])
@pytest.mark.parametrize("world,workers", [(2, 1), (3, 2), (4, 3)])
def test_ddp_shares_are_equal(root, mode, world, workers):
    ds = build(root).shuffle(8, seed=0)

    def run(r):
        torch_ds = ds.to_torch(rank=r, world_size=world, drop_remainder=mode == "drop",
                               pad=mode == "pad")
        return ids_of(StatefulDataLoader(torch_ds, batch_size=None, num_workers=workers))

    per_rank = [run(r) for r in range(world)]
    counts = [len(r) for r in per_rank]
    assert len(set(counts)) == 1
    flat = sum(per_rank, [])
    if mode == "drop":
        assert len(flat) == len(set(flat)) and N - len(flat) < world * workers
    else:
        assert set(flat) == set(range(N)) and len(flat) - N < world * workers


@pytest.mark.parametrize("workers", [2, 3])
def test_batching_across_workers_gives_one_partial_batch_per_epoch(root, workers):
    ds = build(root).shuffle(10, seed=2).batch(8)
    sizes = [len(b["id"]) for b in StatefulDataLoader(ds.to_torch(), batch_size=None,
                                                      num_workers=workers)]
    assert sum(sizes) == N
    assert sum(s != 8 for s in sizes) == 1


def test_a_loader_over_a_pipeline_that_cannot_resume_says_so(root):
    ds = build(root).take(50)
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    it = iter(loader)
    take(it, 3)
    state = loader.state_dict()
    again = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    with pytest.raises(ValueError, match="cannot be resumed exactly"):
        again.load_state_dict(state)
        next(iter(again))


def test_map_style_dataset_over_a_snapshot_with_a_sampler(root):
    from torch.utils.data import DataLoader, DistributedSampler

    from snapcache.adapters.torch import to_torch_map_style
    from snapcache.store.fs import Storage
    from snapcache.store.row_access import RowAccess
    from snapcache.store.reader import SnapshotReader

    build(root)
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    train = to_torch_map_style(RowAccess(SnapshotReader.open(Storage(root).child(fp))))
    assert len(train) == N and int(train[5]["id"]) == 5
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(train, num_replicas=2, rank=rank, shuffle=True, seed=1)
        for batch in DataLoader(train, batch_size=8, sampler=sampler, num_workers=2):
            assert torch.equal(batch["x"][:, 0], batch["id"].float())
            seen.extend(batch["id"].tolist())
    assert set(seen) == set(range(N))


def test_job_state_refuses_a_state_saved_between_worker_snapshots(root):
    ds = build(root).batch(4)
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                                snapshot_every_n_steps=5)
    it = iter(loader)
    take(it, 7)
    state = loader.state_dict()
    del it
    assert state["_steps_since_snapshot"]
    with pytest.raises(ValueError, match="snapshot_every_n_steps=1"):
        job_state(state)
    # the loader's own resume, with the same workers, is exact
    again = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                               snapshot_every_n_steps=5)
    again.load_state_dict(state)
    rest = ids_of(again)
    assert len(rest) == N - 28 and len(set(rest)) == len(rest)
