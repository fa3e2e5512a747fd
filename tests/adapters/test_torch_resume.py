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


def checkpoint_after(loader, k):
    """The ids of ``loader``'s first ``k`` items, and its state then (through JSON, as saved);
    the loader's iterator is dropped, as by a crash."""
    it = iter(loader)
    head = ids_of(take(it, k))
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    return head, state


def run_child(code: str) -> list:
    """Run ``code`` in a new Python process (the real resume: after a restart); its last line of
    output, as JSON."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [os.path.dirname(os.path.dirname(sc.__file__)),
                              os.path.dirname(__file__)] +
                             os.environ.get("PYTHONPATH", "").split(os.pathsep))})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    head, state = checkpoint_after(loader(), 7)
    again = loader()
    again.load_state_dict(state)
    rest = ids_of(again)
    assert head + rest == full


RESUME_CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import snapcache as sc
    from torchdata.stateful_dataloader import StatefulDataLoader
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
    head, state = checkpoint_after(
        StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2), 9)
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    rest = run_child(RESUME_CHILD.format(n=N, root=root, state=str(state_path)))
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


# -- checkpoints at the end of an epoch, job states across epochs ------------------------------
NEXT_EPOCH_CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import snapcache as sc
    from torchdata.stateful_dataloader import StatefulDataLoader
    from test_torch_resume import make
    ds = sc.Dataset.range({n}).map(make).snapshot({root!r}, shard_size=1024, progress=False)
    train = ds.shuffle(16, seed=4).batch(4).to_torch()
    loader = StatefulDataLoader(train, batch_size=None, num_workers={workers})
    loader.load_state_dict(json.load(open({state!r})))
    if {set_epoch}:
        train.set_epoch(1)
    print(json.dumps([int(i) for b in loader for i in np.asarray(b["id"]).reshape(-1)]))
""")


@pytest.mark.parametrize("workers,set_epoch", [(0, True), (0, False), (2, True)])
def test_a_checkpoint_after_an_epoch_resumes_with_the_next_epoch(root, tmp_path, workers,
                                                                set_epoch):
    """The usual "save after each epoch": a new process that loads it runs the next epoch in
    full (the one set_epoch gives; with num_workers=0 and no set_epoch, the next one)."""
    ds = build(root).shuffle(16, seed=4).batch(4)
    train = ds.to_torch()
    loader = StatefulDataLoader(train, batch_size=None, num_workers=workers)
    epochs = []
    for epoch in range(2):
        train.set_epoch(epoch)
        epochs.append(ids_of(loader))
        if epoch == 0:
            state_path = tmp_path / "state.json"
            state_path.write_text(json.dumps(loader.state_dict()))
    assert sorted(epochs[1]) == list(range(N)) and epochs[1] != epochs[0]
    rest = run_child(NEXT_EPOCH_CHILD.format(n=N, root=root, workers=workers,
                                             set_epoch=set_epoch, state=str(state_path)))
    assert rest == epochs[1]


@pytest.mark.parametrize("workers,set_epoch", [(0, False), (2, True), (3, False)])
def test_a_checkpoint_right_after_the_last_batch_resumes_with_the_next_epoch(
        root, tmp_path, workers, set_epoch):
    """A loop that counts steps stops after the last batch without asking for more: the
    loader is not marked finished, and with workers some (or all) of theirs are not either,
    but every share is used up. A new process that loads it runs the next epoch in full, with
    workers as without (no empty epoch first)."""
    ds = build(root).shuffle(16, seed=4).batch(4)
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=workers)
    it = iter(loader)
    assert sorted(ids_of(take(it, -(-N // 4)))) == list(range(N))  # every batch, not one more
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    assert not state["_iterator_finished"]
    assert job_state(state) == {"epoch": 0, "finished": True}
    train = ds.to_torch()
    train.set_epoch(1)
    expected = ids_of(StatefulDataLoader(train, batch_size=None, num_workers=workers))
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    rest = run_child(NEXT_EPOCH_CHILD.format(n=N, root=root, workers=workers,
                                             set_epoch=set_epoch, state=str(state_path)))
    assert rest == expected


def test_a_worker_that_cannot_tell_whether_its_loaders_epoch_ended_warns(root, monkeypatch):
    """A worker whose share had ended, started by a loader not seen starting it: it says that
    the iteration may be empty (and what to do) rather than be silent."""
    from torch.utils.data import get_worker_info  # noqa: F401  (what is patched below)

    ds = build(root).batch(4)
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None)
    it = iter(loader)
    take(it, -(-N // 4))
    dataset_state = loader.state_dict()["dataset_state"]
    worker = ds.to_torch()
    monkeypatch.setattr(torch.utils.data, "get_worker_info",
                        lambda: type("Info", (), {"id": 0, "num_workers": 1, "seed": 0})())
    with pytest.warns(RuntimeWarning, match="whether the others' had is not known"):
        worker.load_state_dict(dataset_state)


def twice(e):
    return [e, e]


def keep(e):
    return int(e["id"]) % 3 != 0


@pytest.mark.parametrize("shape,workers", [("writing filter", 0), ("unseeded shuffle", 2),
                                           ("interleave", 0), ("take", 0)])
def test_an_epoch_end_checkpoint_resumes_for_every_pipeline(tmp_path, shape, workers):
    """Pipelines that cannot resume mid-epoch (and a writing epoch that cannot) resume from the
    end of an epoch: nothing is left of it. Mid-epoch, such a state is still refused."""
    base = sc.Dataset.range(N).map(make).snapshot(str(tmp_path / "snaps"), shard_size=1024,
                                                  progress=False)
    if shape != "writing filter":
        list(base)
    ds = {"writing filter": lambda: base.filter(keep).batch(4),
          "unseeded shuffle": lambda: base.shuffle(8).batch(4),
          "interleave": lambda: base.interleave(twice, cycle_length=1).batch(4),
          "take": lambda: base.take(30).batch(4)}[shape]()
    loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=workers)
    first = ids_of(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    train = ds.to_torch()
    again = StatefulDataLoader(train, batch_size=None, num_workers=workers)
    again.load_state_dict(state)
    train.set_epoch(1)
    assert sorted(ids_of(again)) == sorted(first)
    # the whole job's state of an ended epoch starts the next epoch too
    job = job_state(state)
    assert job == {"epoch": 0, "finished": True}
    resumed = ds.to_torch(state=job)
    assert resumed.epoch == 1
    assert sorted(ids_of(StatefulDataLoader(resumed, batch_size=None, num_workers=workers))) \
        == sorted(first)
    if shape == "unseeded shuffle":  # mid-epoch: refused, in the worker
        _, state = checkpoint_after(
            StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=workers), 3)
        later = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=workers)
        later.load_state_dict(state)
        with pytest.raises(ValueError, match="cannot be resumed exactly"):
            ids_of(later)


@pytest.mark.parametrize("kind,set_epoch", [("stateful", True), ("stateful", False),
                                            ("plain", True)])
def test_a_job_state_resumes_its_own_epoch_only(root, kind, set_epoch):
    """to_torch(state=job_state(...)) with DataLoader workers: the rest of the saved epoch,
    then full epochs (the workers of each epoch are forked from the main process's copy)."""
    from torch.utils.data import DataLoader

    ds = build(root).shuffle(16, seed=4).batch(4)
    make_loader = StatefulDataLoader if kind == "stateful" else DataLoader

    def epochs(train, numbers):
        loader = make_loader(train, batch_size=None, num_workers=3)
        out = []
        for epoch in numbers:
            if set_epoch:
                train.set_epoch(epoch)
            out.append(ids_of(loader))
        return out

    expected = epochs(ds.to_torch(), [0, 1, 2])
    head, saved = checkpoint_after(
        StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2), 5)
    rest, *later = epochs(ds.to_torch(state=job_state(saved)), [0, 1, 2])
    assert sorted(head + rest) == list(range(N))
    assert later == (expected[1:] if set_epoch else expected[:1] * 2)


def test_a_checkpoint_before_a_resumed_worker_yields_keeps_its_place(root):
    """Resumed loaders checkpointed again before each of their workers yielded: a worker not
    started yet is still where its loaded state was."""
    ds = build(root).shuffle(16, seed=4).batch(4)

    def loader():
        return StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)

    seen, state = checkpoint_after(loader(), 3)
    second = loader()
    second.load_state_dict(state)
    more, state = checkpoint_after(second, 1)  # worker 1 has not yielded since the resume
    seen += more
    third = loader()
    third.load_state_dict(state)
    seen += ids_of(third)
    assert sorted(seen) == list(range(N))


WRITING_CHILD = textwrap.dedent("""
    import json, os
    import numpy as np
    import snapcache as sc
    from torchdata.stateful_dataloader import StatefulDataLoader
    from snapcache.adapters.torch import job_state
    from test_torch_resume import make
    ds = sc.Dataset.range({n}).map(make).snapshot({root!r}, shard_size=1024,
                                                  progress=False).batch(4)
    ids = lambda bs: [int(i) for b in bs for i in np.asarray(b["id"]).reshape(-1)]
    if {save}:  # the writing epoch, checkpointed after 5 batches, then the process dies
        loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers={workers})
        it = iter(loader)
        head = ids([next(it) for _ in range(5)])
        json.dump(loader.state_dict(), open({state!r}, "w"))
        print(json.dumps(head), flush=True)
        os._exit(0)
    state = job_state(json.load(open({state!r})))
    loader = StatefulDataLoader(ds.to_torch(state=state), batch_size=None,
                                num_workers={workers})
    print(json.dumps(ids(loader)))
""")


@pytest.mark.parametrize("workers", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_job_state_of_the_writing_epoch_resumes_exactly_with_as_many_streams(tmp_path,
                                                                            workers):
    """A job checkpointed while its first epoch writes the snapshot, resumed after a crash by
    job_state with as many workers: the snapshot is completed and each remaining example
    comes once. With another number of workers it is refused."""
    root, state = str(tmp_path / "snaps"), str(tmp_path / "state.json")
    args = dict(n=N, root=root, workers=workers, state=state)
    head = run_child(WRITING_CHILD.format(save=True, **args))
    rest = run_child(WRITING_CHILD.format(save=False, **args))
    assert len(head) == 20 and sorted(head + rest) == list(range(N))
    ds = sc.Dataset.range(N).map(make).snapshot(root, shard_size=1024, progress=False).batch(4)
    other = ds.to_torch(state=job_state(json.load(open(state))))
    other = StatefulDataLoader(other, batch_size=None,  # 2 streams for 1, 1 for 2
                               num_workers=3 - max(workers, 1))
    with pytest.raises(ValueError, match="resumes only with the same streams"):
        ids_of(other)


PHASE_CHILD = textwrap.dedent("""
    import json, os
    import numpy as np
    import snapcache as sc
    from torchdata.stateful_dataloader import StatefulDataLoader
    from snapcache.adapters.torch import job_state
    from test_torch_resume import make
    ds = sc.Dataset.range({n}).map(make).snapshot({root!r}, shard_size=1024,
                                                  progress=False).shuffle(16, seed=4).batch(4)
    ids = lambda bs: [int(i) for b in bs for i in np.asarray(b["id"]).reshape(-1)]
    train = ds.to_torch(state=job_state(json.load(open({load!r}))))
    loader = StatefulDataLoader(train, batch_size=None, num_workers={workers})
    it = iter(loader)
    seen = ids([next(it) for _ in range({batches})]) if {batches} >= 0 else ids(it)
    if {save!r}:
        json.dump(loader.state_dict(), open({save!r}, "w"))
    print(json.dumps(seen), flush=True)
    os._exit(0)  # a crash: nothing is closed
""")


@pytest.mark.parametrize("middle,last", [pytest.param(3, 2, marks=pytest.mark.slow), (2, 1)])
def test_a_job_state_checkpointed_before_any_batch_resumes_again(root, tmp_path, middle, last):
    """Saved mid-epoch with 2 workers; resumed by job_state in a new process with ``middle``
    workers and checkpointed again before any batch (each stream is still at its share of the
    job state); resumed from that in another with ``last`` workers: every example once."""
    ds = build(root).shuffle(16, seed=4).batch(4)
    seen, state = checkpoint_after(
        StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2), 5)
    first, second = tmp_path / "first.json", str(tmp_path / "second.json")
    first.write_text(json.dumps(state))

    def phase(load, workers, batches, save):
        return run_child(PHASE_CHILD.format(n=N, root=root, load=str(load), workers=workers,
                                            batches=batches, save=save))

    assert phase(first, middle, 0, second) == []
    job = job_state(json.load(open(second)))
    assert job is not None and job["streams"] == middle
    seen += phase(second, last, -1, "")
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("workers,batches", [(2, 1), pytest.param(3, 2, marks=pytest.mark.slow),
                                             (2, 5)])
def test_a_writing_epoch_checkpoint_resumes_by_load_state_dict(tmp_path, workers, batches):
    """Checkpointed while the first epoch writes the snapshot, before some worker yielded
    (its state is a fresh start) or after each did: the resumed loader goes on at once and
    every example comes once. Before, each resumed worker first wrote its whole share and
    waited for the commit, while the loader, fetching from its workers in turn, waited for
    it with a fresh worker's prefetch full: no batch ever came."""
    root = str(tmp_path / "snaps")

    def loader():
        ds = sc.Dataset.range(N).map(make).snapshot(root, shard_size=1024,
                                                    progress=False).batch(4)
        return StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=workers)

    seen, state = checkpoint_after(loader(), batches)  # its workers end with it
    assert all(w["dataset_state"]["iterator"] is None or w["dataset_state"]["iterator"]["writing"]
               for w in state["_snapshot"]["_worker_snapshots"].values())
    second = loader()
    second.load_state_dict(state)
    seen += ids_of(second)
    assert sorted(seen) == list(range(N))
    assert sorted(ids_of(loader())) == list(range(N))  # the next epoch reads the snapshot
