"""DataLoader workers started with "spawn" (or "forkserver") receive their dataset pickled: a
pipeline travels as its op graph, with the fingerprints ``to_torch()`` took in the loader's
process, so that workers started afresh every epoch do not fingerprint it again (hash its
in-memory sources, state every file a ``from_torch`` dataset names), as forked workers
inherit them. Nothing else carries fingerprints to another process."""

from __future__ import annotations

import os
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import snapcache as sc  # noqa: E402
from snapcache.adapters.torch import TorchDataset  # noqa: E402

from spawned_data import NamedFiles, doubled, fingerprinted  # noqa: E402

FILES = 8


def pipeline(tmp_path, root) -> sc.Dataset:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(FILES):
        paths.append(str(folder / f"{i}.txt"))
        (folder / f"{i}.txt").write_text(str(i))
    named = NamedFiles(paths, str(tmp_path / "fingerprinted"))
    return sc.Dataset.from_torch(named).map(doubled).snapshot(root, progress=False)


def values_of(loader) -> list[int]:
    return sorted(int(example["value"]) for example in loader)


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_spawned_workers_start_with_the_fingerprint_the_loader_took(tmp_path, root, start):
    ds = pipeline(tmp_path, root)
    torch_ds = ds.to_torch()
    log = tmp_path / "fingerprinted"
    assert fingerprinted(log) == [os.getpid()]  # taken here, once
    loader = DataLoader(torch_ds, batch_size=None, num_workers=2,
                        multiprocessing_context=start)
    for epoch in range(2):  # the first writes the snapshot, the second reads it
        torch_ds.set_epoch(epoch)
        assert values_of(loader) == [2 * i for i in range(FILES)]
    assert fingerprinted(log) == [os.getpid()], "a spawned worker fingerprinted the pipeline"
    # the workers wrote and read the snapshot the loader's process fingerprinted
    assert os.listdir(root) == [ds.open_snapshot().id]
    assert ds.explain().hit


class StartingWorkers:
    """Stands for a DataLoader iterator starting its workers (what the adapter finds on the
    stack when the dataset is pickled: its ``_dataset``, ``_base_seed``, ``_num_workers``)."""

    def __init__(self, dataset: TorchDataset) -> None:
        self._dataset, self._base_seed, self._num_workers = dataset, 7, 2
        self._persistent_workers = False

    def start(self) -> TorchDataset:
        return pickle.loads(pickle.dumps(self._dataset))


def test_a_worker_copy_fingerprints_for_itself_when_the_parent_took_nothing(tmp_path, root):
    ds = pipeline(tmp_path, root)
    log = tmp_path / "fingerprinted"
    torch_ds = TorchDataset(ds)  # not through to_torch(): nothing fingerprinted here
    assert fingerprinted(log) == []
    copy = StartingWorkers(torch_ds).start()
    assert copy.dataset.open_snapshot().id == ds.open_snapshot().id
    assert len(fingerprinted(log)) == 2  # the copy's own, then this pipeline object's


def test_only_workers_being_started_receive_the_fingerprint(tmp_path, root):
    """Pickled outside a loader starting its workers (saved, sent to Ray), the copy takes its
    own fingerprint: it may be loaded later, elsewhere, after the files changed."""
    ds = pipeline(tmp_path, root)
    torch_ds = ds.to_torch()
    log = tmp_path / "fingerprinted"
    assert len(fingerprinted(log)) == 1
    worker = StartingWorkers(torch_ds).start()
    assert worker.dataset.open_snapshot().id == ds.open_snapshot().id
    assert len(fingerprinted(log)) == 1  # the worker's copy: the parent's fingerprint
    copy = pickle.loads(pickle.dumps(torch_ds))
    assert copy.dataset.open_snapshot().id == ds.open_snapshot().id
    assert len(fingerprinted(log)) == 2  # a plain copy: its own
