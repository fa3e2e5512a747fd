"""PyTorch adapter: DataLoader workers and ranks see every example once; epochs reshuffle;
the first epoch writes one snapshot as cooperating streams; from_torch reads map-style datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import traceback
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import snapcache as sc  # noqa: E402
from snapcache.errors import CacheBypassedWarning, RandomnessWarning  # noqa: E402
from snapcache.adapters.torch import TorchDataset, to_tensors  # noqa: E402
from snapcache.store.fs import Storage  # noqa: E402
from snapcache.store.protocol import best_progress  # noqa: E402
from snapcache.store.reader import load_manifest  # noqa: E402

N = 40


def counted(log_path: str):
    """An 'expensive' map that appends its input to a file (workers are processes)."""

    def expensive(i):
        with open(log_path, "a") as f:
            f.write(f"{i}\n")
        return {"id": i, "x": np.full(3, i, np.float32)}

    return expensive


def calls(log_path) -> list[int]:
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return [int(line) for line in f.read().split()]


def ids_of(loader) -> list[int]:
    out: list[int] = []
    for item in loader:
        ids = item["id"] if isinstance(item, dict) else item
        out.extend(ids.tolist() if isinstance(ids, torch.Tensor) else [int(ids)])
    return out


def snapshot_streams(root: str, ds) -> set[int]:
    """The stream numbers of the committed snapshot's shards (``<run>-<stream>-<seq>.arrow``)."""
    [folder] = [name for name in os.listdir(root)]
    manifest = load_manifest(Storage(root).child(folder))
    assert manifest is not None
    return {int(shard.path.split("-")[1]) for shard in manifest.shards}


def test_dataloader_with_two_workers_writes_one_snapshot_and_delivers_each_example_once(
        tmp_path, root):
    log = str(tmp_path / "calls")
    ds = sc.Dataset.range(N).map(counted(log)).snapshot(root, progress=False)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)

    first = ids_of(loader)
    assert sorted(first) == list(range(N))
    assert sorted(calls(log)) == list(range(N))          # the expensive map ran once an example
    assert len(os.listdir(root)) == 1                     # one snapshot, not one per worker
    assert snapshot_streams(root, ds) == {0, 1}           # written by both workers as streams

    second = ids_of(loader)                               # epoch 2 reads the snapshot
    assert sorted(second) == list(range(N))
    assert len(calls(log)) == N


@pytest.mark.filterwarnings("ignore::snapcache.errors.CacheBypassedWarning")  # said, and meant
def test_workers_forked_after_a_pass_that_filled_a_cache_each_yield_their_share_once(root):
    """Found: a ``cache()`` filled by a pass in the main process (an evaluation loop) was
    inherited by the forked DataLoader workers, and each replayed the whole epoch: 2 workers
    yielded every example twice."""
    ds = sc.Dataset.range(N).map(lambda i: {"id": i, "x": np.float32(i)}).snapshot(
        root, progress=False).cache()
    assert sorted(int(e["id"]) for e in ds) == list(range(N))  # fills the cache
    for workers in (2, 1):
        ids = ids_of(DataLoader(ds.to_torch(), batch_size=None, num_workers=workers))
        assert sorted(ids) == list(range(N)), workers


@pytest.mark.parametrize("workers, persistent, ranks, warned", [
    (0, False, 1, None), (1, True, 1, None), (1, False, 1, "persistent_workers=False"),
    (2, True, 1, "read as 2 streams (2 DataLoader workers)"),
    (0, False, 2, "read as 2 streams (2 ranks)")])
def test_a_cache_that_never_replays_is_said_once(workers, persistent, ranks, warned):
    """cache() replays only an epoch read whole as one stream, in the process that filled it:
    read by several workers or ranks, or by workers that end with each epoch, it computes every
    epoch. The loader's first epoch says so, once, from the user's loop; read as one stream
    that keeps its cache, nothing is said."""
    ds = sc.Dataset.range(N).map(lambda i: {"id": i}).cache()
    torch_ds = ds.to_torch(rank=0, world_size=ranks)
    loader = DataLoader(torch_ds, batch_size=None, num_workers=workers,
                        persistent_workers=persistent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ids_of(loader)
    said = [w for w in caught if issubclass(w.category, CacheBypassedWarning)]
    if warned is None:
        assert said == []
        return
    [warning] = said
    assert warned in str(warning.message) and ".snapshot()" in str(warning.message)
    assert warning.filename == __file__, warning.filename


def refuse_31(e):
    if int(e["id"]) == 31:
        raise ValueError("bad label in example 31")
    return e


@pytest.mark.parametrize("shuffled", [False, True])
def test_an_error_in_a_worker_names_the_same_example_as_without_workers(root, shuffled):
    """Found: the note on a map's exception counted within the worker's share: example 31
    was "#31 of this epoch" with num_workers=0 and "#11" with 2 workers."""
    base = sc.Dataset.range(N).map(lambda i: {"id": i}).snapshot(root, progress=False)
    list(base)  # committed
    ds = base.shuffle(8, seed=1).map(refuse_31) if shuffled else base.map(refuse_31)
    notes = []
    for workers in (0, 2):
        with pytest.raises(Exception, match="bad label in example 31") as raised:
            for _ in DataLoader(ds.to_torch(), batch_size=None, num_workers=workers):
                pass
        text = "".join(traceback.format_exception(raised.value))
        notes.append([line.strip() for line in text.splitlines() if "snapcache: raised" in line])
    assert notes[0] == notes[1] and len(notes[0]) == 1, notes
    if not shuffled:
        assert notes[0] == ["snapcache: raised by map `refuse_31` on example #31 of this epoch"]


def test_take_with_two_workers_yields_the_first_k_once_and_splits_the_work(tmp_path, root):
    """take(k) under DataLoader workers: k examples in all (it was k per worker), the
    expensive map before a snapshot split between the workers."""
    log = str(tmp_path / "calls")
    ds = sc.Dataset.range(2 * N).take(N).map(counted(log)).snapshot(root, progress=False)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
    assert sorted(ids_of(loader)) == list(range(N))
    assert sorted(calls(log)) == list(range(N))
    assert snapshot_streams(root, ds) == {0, 1}           # each worker computed its half
    for head in (ds.take(7), sc.Dataset.range(2 * N).take(N).shuffle(8, seed=1),
                 ds.shuffle(8, seed=1).take(7)):
        loader = DataLoader(head.to_torch(), batch_size=None, num_workers=2)
        assert sorted(ids_of(loader)) == sorted(int(e["id"]) if isinstance(e, dict) else int(e)
                                                for e in head) and len(head) == len(list(head))


PROCESS_MAP_IN_WORKERS = """
import sys
import snapcache as sc
from torch.utils.data import DataLoader

def make(i):
    return {"id": i}

def passthrough(example):
    return example

if __name__ == "__main__":
    base = sc.Dataset.range(40).map(make).snapshot(sys.argv[1], progress=False)
    list(base)
    ds = base.map(passthrough, num_parallel_calls=2, executor="process").batch(5)
    ids = [int(i) for b in DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
           for i in b["id"]]
    print(sorted(ids) == list(range(40)))
"""


def test_a_process_map_inside_dataloader_workers_runs_on_threads_and_says_so(tmp_path):
    """DataLoader workers are daemonic: they cannot start processes. A map with
    executor='process' runs on threads there, with a warning naming the way out (it failed
    with the stdlib's "daemonic processes are not allowed to have children")."""
    script = tmp_path / "train.py"
    script.write_text(PROCESS_MAP_IN_WORKERS)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "snaps")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "executor='process' but runs inside a DataLoader worker" in done.stderr
    assert "executor='thread'" in done.stderr and "num_workers=0" in done.stderr


def test_set_epoch_reshuffles_the_order_but_not_the_set(root):
    ds = sc.Dataset.range(N).snapshot(root, progress=False).shuffle(16, seed=3).batch(4)
    torch_ds = ds.to_torch()
    loader = DataLoader(torch_ds, batch_size=None, num_workers=2)
    orders = []
    for epoch in (0, 1, 1):
        torch_ds.set_epoch(epoch)
        orders.append(ids_of(loader))
    assert all(sorted(order) == list(range(N)) for order in orders)
    assert orders[0] != orders[1]
    assert orders[1] == orders[2]                         # same epoch, same order


RANK_CHILD = """
import json
import numpy as np
import snapcache as sc
from torch.utils.data import DataLoader
ds = sc.Dataset.range({n})
if {root!r} is not None:
    ds = ds.snapshot({root!r}, progress=False)
torch_ds = ds.shuffle(8, seed=0).to_torch(rank={rank}, world_size=2)
torch_ds.set_epoch({epoch})
print(json.dumps([int(np.asarray(x)) for x in DataLoader(torch_ds, batch_size=None,
                                                           num_workers=2)]))
"""


CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [os.path.dirname(os.path.dirname(sc.__file__))] + os.environ.get("PYTHONPATH", "").split(
        os.pathsep))}


@pytest.mark.parametrize("with_snapshot", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_two_ranks_times_two_workers_partition_the_examples(root, with_snapshot):
    ds = sc.Dataset.range(N)
    if with_snapshot:
        ds = ds.snapshot(root, progress=False)
    ds = ds.shuffle(8, seed=0)
    per_rank = []
    for epoch in range(2):  # with a snapshot: epoch 0 writes 4 streams, epoch 1 reads
        # The ranks are processes running at once, as in a job: a seeded shuffle's writing
        # epoch completes the snapshot (every stream's share) before yielding.
        ranks = [subprocess.Popen([sys.executable, "-c", RANK_CHILD.format(
            n=N, root=root if with_snapshot else None, rank=rank, epoch=epoch)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV)
            for rank in range(2)]
        per_rank = []
        for proc in ranks:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            per_rank.append(json.loads(out.strip().splitlines()[-1]))
        assert not set(per_rank[0]) & set(per_rank[1])
        assert sorted(per_rank[0] + per_rank[1]) == list(range(N))
    if with_snapshot:
        assert snapshot_streams(root, ds) == {0, 1, 2, 3}


LEFT_REFERENCED_CHILD = """
import atexit
workers = []
# Registered before multiprocessing's own exit function, so it runs after it: after the workers
# were terminated and joined.
atexit.register(lambda: print(*[worker.exitcode for worker in workers], flush=True))
import multiprocessing
import time
import numpy as np
import snapcache as sc
from torchdata.stateful_dataloader import StatefulDataLoader
def expensive(i):
    time.sleep(0.002)
    return {{"i": i, "x": np.full(16, i, np.int32)}}
ds = sc.Dataset.range(4000).map(expensive).snapshot({root!r}, progress=False).batch(8)
loader = StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2)
for seen, batch in enumerate(loader, 1):  # the loader holds its iterator
    if seen == 4:  # two batches from each worker: both are inside the writing epoch
        break
workers.extend(multiprocessing.active_children())
print("leaving", flush=True)
"""


def test_a_loader_left_referenced_mid_first_epoch_exits_quietly_keeping_its_work(root):
    """A script that stops mid-way through the writing epoch and exits with the loader still
    referenced: at interpreter exit ``multiprocessing`` terminates the workers (SIGTERM) and
    joins them. Each worker keeps what it computed and exits with status 0, so torch's
    SIGCHLD handler, run while the parent waits, reports no worker as crashed."""
    child = subprocess.run([sys.executable, "-c", LEFT_REFERENCED_CHILD.format(root=root)],
                           capture_output=True, text=True, timeout=300, env=CHILD_ENV)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["leaving", "0", "0"], child.stderr
    assert "unexpectedly" not in child.stderr and "killed by signal" not in child.stderr, \
        child.stderr
    [folder] = os.listdir(root)
    kept = [best_progress(Storage(root).child(folder), stream, 2) for stream in (0, 1)]
    assert all(record is not None and record.rows > 0 for record in kept), child.stderr


def test_dataloader_without_workers_and_with_collation(root):
    ds = sc.Dataset.range(10).map(lambda i: {"id": i, "x": np.full(2, i, np.float32)})
    batches = list(DataLoader(ds.to_torch(), batch_size=4))  # torch collates the examples
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0]["x"].dtype == torch.float32 and batches[0]["x"].shape == (4, 2)


def test_stream_comes_from_rank_arguments_then_environment(monkeypatch):
    ds = sc.Dataset.range(4)
    assert ds.to_torch(rank=1, world_size=3).stream() == (1, 3)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert ds.to_torch().stream() == (2, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK must be in"):
        ds.to_torch().stream()
    with pytest.raises(ValueError, match="both rank and world_size"):
        ds.to_torch(rank=0)
    with pytest.raises(ValueError, match="rank must be in"):
        ds.to_torch(rank=2, world_size=2)


def test_stream_comes_from_torch_distributed_when_initialized(tmp_path, monkeypatch):
    distributed = torch.distributed
    if not distributed.is_available():
        pytest.skip("torch.distributed is not available")
    monkeypatch.setenv("RANK", "5")  # ignored: the process group wins
    monkeypatch.setenv("WORLD_SIZE", "9")
    distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0,
                                   world_size=1)
    try:
        assert sc.Dataset.range(4).to_torch().stream() == (0, 1)
    finally:
        distributed.destroy_process_group()


def test_batches_are_tensors_sharing_memory_with_writable_arrays(root):
    ds = sc.Dataset.range(8).map(lambda i: {"x": np.full((2, 2), i, np.float32),
                                            "name": f"n{i}", "b": b"raw"}).batch(4)
    [batch, _] = list(ds)
    tensors = to_tensors(batch)
    assert isinstance(tensors["x"], torch.Tensor) and tensors["x"].shape == (4, 2, 2)
    assert tensors["x"].data_ptr() == batch["x"].ctypes.data          # zero-copy
    assert tensors["name"] == ["n0", "n1", "n2", "n3"]                  # strings pass through
    assert tensors["b"] == [b"raw"] * 4


def test_read_only_snapshot_arrays_are_copied_without_warnings(root):
    ds = sc.Dataset.range(8).map(lambda i: {"x": np.full(3, i, np.int64)}).snapshot(
        root, progress=False, compression="none")
    list(ds)  # write
    read = list(ds.batch(4))  # the vectorized read: views of the memory-mapped shard
    assert not read[0]["x"].flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_tensors(read[0])["x"]
    tensor += 1  # safe: a copy, the shard is untouched
    assert [b["x"][:, 0].tolist() for b in ds.batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    scalar = to_tensors({"y": np.float32(2.5), "n": 3})
    assert scalar["y"].dtype == torch.float32 and scalar["n"] == 3


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int, scale: float = 1.0):
        self.n = n
        self.weights = torch.arange(n, dtype=torch.float32) * scale

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"id": i, "w": self.weights[i], "v": torch.full((2,), float(i * i))}


def test_from_torch_reads_by_index_as_numpy_and_splits_by_stride(root):
    ds = sc.Dataset.from_torch(Squares(10))
    examples = list(ds)
    assert [e["id"] for e in examples] == list(range(10))
    assert isinstance(examples[3]["v"], np.ndarray) and examples[3]["v"].tolist() == [9.0, 9.0]
    parts = [[e["id"] for e in ds.iterate(stream=(k, 3))] for k in range(3)]
    assert parts == [list(range(k, 10, 3)) for k in range(3)]
    snap = ds.snapshot(root, progress=False)
    assert [e["id"] for e in snap] == list(range(10))
    assert [e["id"] for e in snap] == list(range(10))  # read back


def test_from_torch_fingerprint_follows_the_dataset_state():
    a = sc.Dataset.from_torch(Squares(10)).fingerprint()
    assert a == sc.Dataset.from_torch(Squares(10)).fingerprint()
    assert a != sc.Dataset.from_torch(Squares(10, scale=2.0)).fingerprint()
    assert a != sc.Dataset.from_torch(Squares(11)).fingerprint()


class TextFiles(torch.utils.data.Dataset):
    """The usual torch dataset: file names held, each file read in __getitem__ (torchvision's
    ImageFolder holds (path, class) pairs in ``samples``)."""

    def __init__(self, folder, pairs=False):
        paths = sorted(str(p) for p in folder.iterdir())
        self.samples = [(p, k) for k, p in enumerate(paths)] if pairs else paths

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        sample = self.samples[i]
        with open(sample[0] if isinstance(sample, tuple) else sample) as f:
            return int(f.read())


@pytest.mark.parametrize("pairs", [False, True])
def test_from_torch_counts_the_files_its_dataset_names(tmp_path, pairs):
    folder = tmp_path / "data"
    folder.mkdir()
    for name, text in [("a.txt", "1"), ("b.txt", "2")]:
        (folder / name).write_text(text)

    def pipeline():
        return sc.Dataset.from_torch(TextFiles(folder, pairs)).map(lambda x: x * 10).snapshot(
            str(tmp_path / "snaps"), progress=False)

    first = pipeline()
    assert list(first) == [10, 20] and pipeline().fingerprint() == first.fingerprint()
    (folder / "a.txt").write_text("70")  # re-exported under the same name
    second = pipeline()
    assert second.fingerprint() != first.fingerprint()
    assert list(second) == [700, 20]


class Locked(torch.utils.data.Dataset):
    def __init__(self):
        self.lock = threading.Lock()

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return i


def test_from_torch_unhashable_dataset_points_to_key(root):
    ds = sc.Dataset.from_torch(Locked())
    with pytest.raises(sc.FingerprintError, match="key="):
        ds.fingerprint()
    assert list(ds.snapshot(root, key="locked-v1", progress=False)) == [0, 1, 2]
    with pytest.raises(TypeError, match="map-style"):
        sc.Dataset.from_torch(iter([1, 2]))


def test_from_torch_is_resumable():
    from snapcache.pipeline.ops import resumable

    assert resumable(sc.Dataset.from_torch(Squares(3)).map(lambda e: e)._op)


class RandomFlip:
    """Like torchvision's ``RandomHorizontalFlip``: a coin flip from torch's global generator."""

    def __call__(self, x):
        return x.flip(-1) if torch.rand(1) < 0.5 else x


class Reverse:
    def __call__(self, x):
        return x.flip(-1)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int, transform):
        self.data = torch.arange(n * 4.0).reshape(n, 4)
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"id": i, "x": self.transform(self.data[i])}


def test_from_torch_warns_for_a_random_transform_inside_the_dataset(tmp_path):
    """The torchvision way of augmenting: a random ``transform`` inside the dataset. Upstream
    of a snapshot its coin flips are frozen, like a random map's."""
    with pytest.warns(RandomnessWarning, match=r"source from_torch `Images.transform` reads "
                                               r"global random state \(`torch.rand`\)"):
        list(sc.Dataset.from_torch(Images(4, RandomFlip())).snapshot(str(tmp_path / "a"),
                                                                    progress=False))
    subset = torch.utils.data.Subset(Images(4, lambda x: x + torch.randn(4)), [0, 2])
    with pytest.warns(RandomnessWarning, match=r"`Subset.dataset.transform` reads global random "
                                               r"state \(`torch.randn`\)"):
        list(sc.Dataset.from_torch(subset).snapshot(str(tmp_path / "b"), progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomnessWarning)
        list(sc.Dataset.from_torch(Images(4, Reverse())).snapshot(str(tmp_path / "c"),
                                                                 progress=False))
        # the same dataset after the snapshot: random each epoch, as wanted
        list(sc.Dataset.from_torch(Squares(4)).snapshot(str(tmp_path / "d"), progress=False)
             .map(lambda e: {**e, "v": e["v"] + np.random.rand(2)}))


def test_set_epoch_validates():
    with pytest.raises(ValueError, match="epoch"):
        sc.Dataset.range(3).to_torch().set_epoch(-1)


def test_torch_dataset_pickles_its_op_graph():
    import pickle

    torch_ds = sc.Dataset.range(5).to_torch(rank=0, world_size=1)
    torch_ds.set_epoch(2)
    copy = pickle.loads(pickle.dumps(torch_ds))
    assert isinstance(copy, TorchDataset) and copy.epoch == 2
    assert [int(x) for x in copy] == list(range(5))
    json.dumps(copy.stream())


def test_a_dataset_given_to_a_dataloader_itself_points_to_to_torch(root):
    """DataLoader(ds) instead of DataLoader(ds.to_torch()): torch takes a Dataset (it has a
    length) for a map-style dataset and indexes it; that says what to pass instead."""
    ds = sc.Dataset.range(20).map(lambda i: {"x": np.zeros(2, np.float32)}).snapshot(
        root, progress=False).batch(4)
    with pytest.raises(TypeError, match=r"iterated, not indexed .* pass ds\.to_torch\(\)"):
        next(iter(DataLoader(ds, batch_size=None)))
    assert len(list(DataLoader(ds.to_torch(), batch_size=None))) == 5


def _guide_block(containing: str) -> str:
    guide = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide.md")
    with open(guide) as f:
        blocks = [part.split("```")[0] for part in f.read().split("```python\n")[1:]]
    [block] = [b for b in blocks if containing in b]
    return block


def test_the_guides_distributed_sampler_snippet_runs_outside_torchrun(root, monkeypatch):
    """The random-access snippet of docs/guide.md, as written, without a process group: the
    ranks' samplers split the rows."""
    assert not torch.distributed.is_initialized()
    ds = sc.Dataset.range(30).map(lambda i: {"i": i}).snapshot(root, progress=False)
    list(ds)
    block = _guide_block("DistributedSampler(").replace("range(10)", "range(1)")  # 1 epoch
    shares = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        namespace = {"ds": ds}
        exec(compile(block, "docs/guide.md", "exec"), namespace)
        shares.append(sorted(int(i) for batch in namespace["loader"] for i in batch["i"]))
    assert len(shares[0]) == len(shares[1]) == 15
    assert sorted(shares[0] + shares[1]) == list(range(30))


def _noisy(i):
    return {"x": np.float64(i + np.random.rand())}


def test_a_warning_met_inside_a_dataloader_points_at_the_users_loop(tmp_path):
    ds = sc.Dataset.range(4).map(_noisy).snapshot(str(tmp_path / "snaps"), progress=False)
    with pytest.warns(RandomnessWarning) as caught:
        line = sys._getframe().f_lineno + 1
        for _ in torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=0):
            pass
    [warning] = [w for w in caught if issubclass(w.category, RandomnessWarning)]
    assert (warning.filename, warning.lineno) == (__file__, line)  # not torch's fetch.py
