"""PyTorch: a ``Dataset`` as a ``torch.utils.data.IterableDataset``, and torch values as numpy.

``ds.to_torch()`` splits every epoch into streams, one per DataLoader worker and rank::

    stream index = rank * num_workers + worker_id,   stream count = world_size * num_workers

so each example of an epoch is delivered exactly once across all workers of all ranks, and on
the first epoch the workers write a snapshot's shards as cooperating streams (one snapshot,
not one copy per worker). The rank comes from ``rank=``/``world_size=``, else from
``torch.distributed`` if it is initialized, else from the ``RANK``/``WORLD_SIZE`` environment
variables (set by ``torchrun``), else 0 of 1.

This module imports without torch (for :func:`numpy_example`); :func:`to_torch` needs it.
"""

from __future__ import annotations

import logging
import sys
import uuid
import warnings
from typing import Any, Iterator, Sequence

import numpy as np

from snapcache.adapters import torch_fork
from snapcache.adapters._imports import require
from snapcache.errors import CacheBypassedWarning, warn
from snapcache.options import distributed_env
from snapcache.pipeline import interrupt, queries

log = logging.getLogger(__name__)

try:
    import torch
    from torch.utils.data import Dataset as _MapBase, IterableDataset as _Base
except ImportError:  # to_torch() says what to install
    torch = None  # type: ignore[assignment]
    _Base = _MapBase = object  # type: ignore[assignment,misc]


class TorchDataset(_Base):  # type: ignore[misc,valid-type]
    """An ``IterableDataset`` over a snapcache ``Dataset``; made by ``ds.to_torch()``.

    Example::

        loader = DataLoader(ds.batch(64).to_torch(), batch_size=None, num_workers=4)
        for epoch in range(10):
            loader.dataset.set_epoch(epoch)
            for batch in loader:
                ...

    It is *stateful* in the sense of ``torchdata.stateful_dataloader``: a
    ``StatefulDataLoader``'s ``state_dict()`` / ``load_state_dict()`` resume the epoch at
    exactly the next example, in every worker, for pipelines of the shape
    ``snapshot -> map / filter / shuffle / batch / prefetch``; a state saved after the end of
    an epoch resumes for every pipeline, with the next epoch. To resume with another number
    of workers or ranks, pass ``state=job_state(loader.state_dict())`` to ``to_torch``: it
    applies to the first iteration of its epoch.
    """

    def __init__(self, dataset: Any, *, rank: int | None = None,
                 world_size: int | None = None, drop_remainder: bool = False,
                 pad: bool = False, state: dict | None = None) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither (then they come from "
                             "torch.distributed or the RANK/WORLD_SIZE environment variables)")
        if world_size is not None and not (isinstance(world_size, int) and world_size >= 1 and
                                           isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, world_size) with world_size >= 1; got "
                             f"rank={rank!r}, world_size={world_size!r}")
        if drop_remainder and pad:
            raise ValueError("pass drop_remainder=True or pad=True, not both")
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.epoch = state["epoch"] if state is not None else 0
        if state is not None and state.get("finished"):  # job_state of an ended epoch
            self.epoch, state = state["epoch"] + 1, None
        self.balance = "drop" if drop_remainder else "pad" if pad else None
        # Where the whole job resumes (job_state): for the first iteration of its epoch only,
        # by the first DataLoader workers started (see _workers_starting).
        self._resume = state
        self._resume_workers: int | None = None  # their base seed (main process)
        self._loaded: dict | None = None   # this worker's state from load_state_dict
        # Whether the loader state the workers being started resume had ended its epoch in
        # every worker (set in the main process as they start; None: not known).
        self._loaded_ended: bool | None = None
        self._epoch_set = False            # set_epoch was called
        # The current (or last) iteration: its epoch, iterator, items yielded, whether it ran
        # to the end of its epoch; the state it resumes (loaded, or its stream's share of the
        # job state), until its iterator starts: what state_dict reports until then.
        self._run_epoch = self.epoch
        self._iterator: Any = None
        self._yielded = 0
        self._ended = False
        self._pending: dict | None = None
        self._loader_id = uuid.uuid4().hex  # the same in every worker of its loaders
        self._cache_warned = False
        self._epochs = 0                    # epochs this copy (this worker) has started

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s shuffle order from the next iteration on (call it before each epoch,
        as with ``DistributedSampler``; without it every epoch has epoch 0's order)."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0; got {epoch!r}")
        self.epoch, self._epoch_set = epoch, True

    def stream(self) -> tuple[int, int]:
        """``(index, count)`` of the stream this process reads: from the rank and the worker."""
        rank, world_size = self._rank()
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world_size * workers

    def _rank(self) -> tuple[int, int]:
        if self.world_size is not None:
            return self.rank, self.world_size  # type: ignore[return-value]
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(), distributed.get_world_size()
        return distributed_env()

    def __iter__(self) -> Iterator[Any]:
        # What this iteration resumes is decided here, when it is created, not at its first
        # item: a StatefulDataLoader(num_workers=0) loading a state creates an iterator, and
        # drops it for another one when the saved epoch had ended.
        loaded, self._loaded = self._loaded, None
        resume, self._resume = self._resume, None
        if loaded is not None:
            epoch, state = loaded["epoch"], loaded["iterator"]
        elif resume is not None and resume["epoch"] == self.epoch:
            epoch, state = self.epoch, resume
        else:  # a job state applies to its own epoch only: set_epoch gave another
            epoch, state = self.epoch, None
        self._run_epoch, self._iterator, self._yielded, self._ended = epoch, None, 0, False
        self._pending = loaded
        if resume is not None and state is resume:  # this stream's share of the job's state
            own = queries.stream_state(resume, self.stream(), self.balance)
            if own is not None:
                self._pending = {"epoch": epoch, "iterator": own, "yielded": 0}
        token = self._epoch_token()
        if token is None:  # read in this process: by ranks, a warning if cache() never replays
            self._warn_if_cache_bypassed(0, True)
        if loaded is not None and loaded.get("finished"):  # nothing left of its epoch here
            self._ended = True
            return iter(())
        if loaded is not None and state is None:  # mid-epoch, not resumable (in a worker)
            return _refuse()
        return self._examples(epoch, state, token)

    def _examples(self, epoch: int, state: dict | None, token: str | None) -> Iterator[Any]:
        if token is not None:  # in a DataLoader worker
            interrupt.exit_quietly_on_sigterm()
        with queries.shared_epoch(token):
            iterator = self.dataset.iterate(epoch=epoch, stream=self.stream(), state=state,
                                            balance=self.balance)
            self._iterator, self._pending = iterator, None
            try:
                for example in iterator:
                    self._yielded += 1
                    yield to_tensors(example)
                self._ended = True
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()

    def _warn_if_cache_bypassed(self, workers: int, persistent: bool) -> None:
        """In the main process, as an epoch starts with ``workers`` DataLoader workers (0:
        read here): once per dataset, a :class:`CacheBypassedWarning` if the pipeline's
        ``cache()`` will never replay, read this way."""
        if self._cache_warned or not queries.has_cache(self.dataset):
            return
        _, world_size = self._rank()
        streams = world_size * max(workers, 1)
        if streams > 1:
            how = " x ".join(part for part in (
                f"{world_size} ranks" if world_size > 1 else "",
                f"{workers} DataLoader workers" if workers > 1 else "") if part)
            why = (f"read as {streams} streams ({how}) it passes its examples through, and "
                   "each stream computes its share every epoch (a cache replays only an epoch "
                   "read whole, as one stream)")
        elif workers and not persistent:
            why = ("it fills in the DataLoader's worker, which ends with the epoch "
                   "(persistent_workers=False), so every epoch computes again")
        else:
            return
        self._cache_warned = True
        warn(f"cache() never replays here: {why}. To share the computed examples between "
             "workers, ranks and runs, use .snapshot() in its place"
             + ("" if streams > 1 else ", or pass persistent_workers=True"),
             CacheBypassedWarning)

    def _epoch_token(self) -> str | None:
        """In a DataLoader worker: a name for this epoch of this loader, the same in each of
        its workers and never again, so the workers check the snapshot's manifest once between
        them. Workers started together share the loader's base seed (a new one each time a
        loader starts workers), and persistent workers each count the epochs they start."""
        info = torch.utils.data.get_worker_info()
        if info is None:
            return None
        self._epochs += 1
        return self._token(info.seed - info.id, self._epochs)

    def _token(self, base_seed: int, epochs: int) -> str:
        return f"{self._loader_id}-{base_seed}-{epochs}"

    def _workers_starting(self, base_seed: int) -> None:
        """In the main process, before a DataLoader forks workers that share ``base_seed`` (a
        new one each time a loader starts workers): the job state (``to_torch(state=...)``)
        goes to the first workers started, never to a later epoch's."""
        if self._resume is None:
            return
        if self._resume_workers is None:
            self._resume_workers = base_seed
        elif self._resume_workers != base_seed:
            self._resume = None

    def _resuming(self, loader_state: dict | None) -> None:
        """In the main process, as a ``StatefulDataLoader`` starts its workers to resume
        ``loader_state`` (None: to start an epoch): if every worker's share of the saved epoch
        had ended (a loop that stopped after the last batch without asking for more leaves the
        loader unfinished), the epoch ended, and the workers run the next one, as without
        workers (the one ``set_epoch`` gave, else the next)."""
        states = _worker_states(loader_state) if loader_state else []
        self._loaded_ended = bool(states) and all(_worker_ended(d) for d in states)
        if self._loaded_ended and not self._epoch_set:
            self.epoch = max(d["epoch"] for d in states) + 1

    def state_dict(self) -> dict:
        """This worker's place in the epoch (``StatefulDataLoader`` calls it in each worker):
        ``finished`` once the iteration ran to the end of its epoch."""
        if self._pending is not None:  # a resumed stream not started yet: still where it is
            return dict(self._pending)
        state = None
        get = getattr(self._iterator, "state_dict", None)
        if get is not None:
            try:
                state = get()
            except ValueError:  # not resumable: load_state_dict says why if it is used
                state = None
        started = self._iterator is not None or self._ended
        out = {"epoch": self._run_epoch if started else self.epoch, "iterator": state,
               "yielded": self._yielded}
        if self._ended:
            out["finished"] = True
        return out

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state`` (from :meth:`state_dict`) on the next iteration.

        A state saved after its epoch ended (``finished``, or nothing left of its share)
        resumes for every pipeline, as nothing left of that epoch; the iteration after it
        runs the epoch ``set_epoch`` gave, else the next one. Without workers, or when every
        worker's share had ended (:meth:`_resuming`), the loader's epoch had ended and its
        resumed iteration is that next epoch; otherwise the others' rest of the epoch comes
        first. A state in the middle of an epoch is refused when the pipeline cannot resume
        there: here, or in a DataLoader worker (which cannot tell whether its loader's epoch
        ended) when its iteration starts."""
        if not isinstance(state, dict) or "epoch" not in state:
            raise ValueError(f"not a to_torch() worker state: {state!r}")
        iterator = state.get("iterator")
        ended = _worker_ended(state)
        info = torch.utils.data.get_worker_info()
        if iterator is None and state.get("yielded") and not ended and info is None:
            raise ValueError(_NOT_RESUMABLE)
        if ended:
            if not self._epoch_set:
                self.epoch = state["epoch"] + 1
            if info is None or self._loaded_ended:  # the loader's epoch ended: the next runs
                self._loaded = None
                return
            if self._loaded_ended is None:
                warnings.warn(
                    f"DataLoader worker {info.id}: its share of epoch {state['epoch']} had "
                    "ended when the loader state was saved, and its loader was not seen "
                    "starting its workers, so whether the others' had is not known: if "
                    "theirs had too, this iteration yields nothing. Then call set_epoch and "
                    "iterate again, or save the loader's state after the loop has ended",
                    RuntimeWarning, stacklevel=2)
            self._loaded = {**state, "finished": True}  # the others' rest of the epoch
            return
        self.epoch = state["epoch"]
        self._loaded = state if iterator is not None or state.get("yielded") else None

    def __getstate__(self) -> dict:
        # DataLoader workers started with "spawn" or "forkserver" pickle the dataset: a Dataset
        # pickles as its op graph only (its functions must then be picklable, i.e. defined at
        # module level). To workers being started, with the fingerprints to_torch() took here
        # of that very graph: they start with them as forked workers inherit them, instead of
        # each taking them again every epoch (hashing in-memory sources, stating the files a
        # from_torch dataset names). Any other copy takes its own.
        starting = torch_fork.starting_loader()
        if starting is not None and starting[0] is not self:
            starting = None  # another loader's workers: this is some other copy
        if starting is not None:  # spawned workers: see torch_fork.before_fork
            self._resuming(starting[4])
        state = dict(self.__dict__)
        state["_iterator"] = None  # a running iteration stays in its process
        if starting is not None:
            state["_fingerprints"] = queries.taken_fingerprints(self.dataset)
        return state

    def __setstate__(self, state: dict) -> None:
        taken = state.pop("_fingerprints", ())
        self.__dict__.update(state)
        queries.adopt_fingerprints(taken)


_NOT_RESUMABLE = (
    "this loader's state cannot be resumed exactly: the pipeline is not of the shape "
    "snapshot -> map / filter / shuffle(seed=...) / batch / prefetch, or the snapshot was being "
    "written (a state saved after the end of an epoch resumes for every pipeline)")


def _refuse() -> Iterator[Any]:
    raise ValueError(_NOT_RESUMABLE)
    yield  # a generator: raises at its first item


class MapStyleDataset(_MapBase):  # type: ignore[misc,valid-type]
    """A map-style ``torch.utils.data.Dataset`` over the rows of a committed snapshot (anything
    with ``len`` and ``[i]``), examples as torch tensors: bring your own sampler.

    Example::

        train = snap.to_torch_map_style()
        loader = DataLoader(train, batch_size=64, sampler=DistributedSampler(train))
    """

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        return to_tensors(self.rows[index])

    def __getitems__(self, indices: list[int]) -> list:
        """A batch of rows at once (DataLoader's batched fetch): each record batch read once."""
        take = getattr(self.rows, "take", None)
        if take is None:
            return [self[i] for i in indices]
        return [to_tensors(example) for example in take(indices)]


def to_torch_map_style(rows: Any) -> MapStyleDataset:
    require("torch", "to_torch_map_style()")
    return MapStyleDataset(rows)


def to_torch(dataset: Any, *, rank: int | None = None, world_size: int | None = None,
             drop_remainder: bool = False, pad: bool = False, state: dict | None = None
             ) -> TorchDataset:
    require("torch", "ds.to_torch()")
    queries.take_fingerprints(dataset)  # once, here: workers started each epoch get it
    torch_dataset = TorchDataset(dataset, rank=rank, world_size=world_size,
                                 drop_remainder=drop_remainder, pad=pad, state=state)
    torch_fork.track(torch_dataset)
    return torch_dataset


def job_state(loader_state: dict | Sequence[dict]) -> dict | None:
    """The rest of the epoch, for the whole job, from ``StatefulDataLoader.state_dict()``: a
    job with any number of ranks and workers resumed with ``ds.to_torch(state=job_state(saved))``
    sees each remaining example once. None if the epoch had not started; for a state saved
    after the epoch ended, or right after its last batch (every share used up), in every rank
    given (lockstep ranks end it together),
    ``{"epoch": e, "finished": True}``, from which ``to_torch`` starts epoch ``e + 1``, whatever
    the pipeline.

    ``loader_state`` is rank 0's state, or every rank's in rank order (a list, e.g. gathered
    with ``torch.distributed.all_gather_object``). Rank 0's alone describes the job when every
    rank consumed as much as rank 0 (lockstep training, as with DDP) and an item always takes
    as many examples, which a filter between the snapshot and the batch breaks: then every
    rank's state is needed, and rank 0's alone is refused.
    """
    ranks = [loader_state] if isinstance(loader_state, dict) else list(loader_state)
    if all(_ended(state) for state in ranks):
        epochs = {d["epoch"] for state in ranks for d in _worker_states(state)
                  if isinstance(d, dict)}
        if len(epochs) == 1:
            return {"epoch": epochs.pop(), "finished": True}
    per_rank = None
    consumed: list[int] = []
    known: list[dict] = []
    yielded = False
    for rank, state in enumerate(ranks):
        steps = state.get("_steps_since_snapshot") or 0
        if steps:
            whose = "the" if len(ranks) == 1 else f"rank {rank}'s"
            raise ValueError(
                f"{whose} loader state was saved {steps} batches after its workers' last "
                "snapshot (StatefulDataLoader(snapshot_every_n_steps > 1)): the workers' "
                "positions lag what the loader "
                "yielded, and only the loader's own load_state_dict replays those batches, with "
                "the same workers. For job_state (another world size or worker count), create "
                "the loader with snapshot_every_n_steps=1 (the default)")
        datasets = _worker_states(state)
        yielded |= any(isinstance(d, dict) and d.get("yielded") for d in datasets)
        workers = [d.get("iterator") if isinstance(d, dict) else None for d in datasets]
        if per_rank is None:
            per_rank = len(workers)
        elif len(workers) != per_rank:
            raise ValueError(f"rank {rank}'s loader state has {len(workers)} workers, rank 0's "
                             f"{per_rank}: not the states of one job")
        for w, s in enumerate(workers):
            if s is not None and s["stream"] != rank * per_rank + w and len(ranks) > 1:
                raise ValueError(f"the loader states are not in rank order: state {rank} is "
                                 f"rank {s['stream'] // per_rank}'s")
        consumed += [s["consumed"] if s is not None else 0 for s in workers]
        known += [s for s in workers if s is not None]
    if not known:
        if yielded:
            raise ValueError("this loader's state cannot be resumed: its pipeline is not "
                             "resumable (see TorchDataset.load_state_dict)")
        return None
    streams = known[0]["streams"]
    if streams % per_rank:  # type: ignore[operator]
        raise ValueError(f"the loader has {per_rank} workers but its epoch is shared by "
                         f"{streams} streams: not a to_torch() loader state")
    if len(consumed) == streams:
        by_stream = consumed
    elif len(ranks) == 1:
        if not all(s.get("rows_per_item_fixed", True) for s in known):
            raise ValueError(
                "rank 0's loader state alone does not say where the other ranks are: the "
                "pipeline filters between the snapshot and the batch, so ranks "
                "that took as many batches have read different numbers of examples. Pass every "
                "rank's loader state, in rank order: job_state([state_rank0, state_rank1, ...]) "
                "(gathered with torch.distributed.all_gather_object, or saved per rank)")
        by_stream = consumed * (streams // per_rank)  # type: ignore[operator]  # lockstep
    else:
        raise ValueError(f"{len(ranks)} ranks' loader states with {per_rank} workers each, but "
                         f"the epoch is shared by {streams} streams: pass every rank's state")
    job = dict(known[0])
    job["consumed_by_stream"] = by_stream
    job["consumed"] = 0
    return job


def _ended(loader_state: dict) -> bool:
    """Whether a ``StatefulDataLoader.state_dict()`` was saved after its epoch ended: the loader
    says so, or every worker's share had ended."""
    return bool(loader_state.get("_iterator_finished")) or all(
        _worker_ended(d) for d in _worker_states(loader_state))


def _worker_ended(state: Any) -> bool:
    """Whether a worker's dataset state (:meth:`TorchDataset.state_dict`) has nothing left of
    its epoch: it ran to the end, or it yielded its whole share and was not asked for more."""
    if not isinstance(state, dict):
        return False
    iterator = state.get("iterator")
    return bool(state.get("finished")) or (
        iterator is not None and queries.positions_left(iterator) == 0)


def _worker_states(loader_state: dict) -> list[Any]:
    """Each worker's dataset state in a ``StatefulDataLoader.state_dict()`` (one for
    ``num_workers=0``), in worker order."""
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:  # num_workers=0: the dataset's own state
        return [loader_state.get("dataset_state")]
    by_key = snapshot["_worker_snapshots"]
    return [by_key[k].get("dataset_state") for k in sorted(
        by_key, key=lambda k: int(k.rsplit("_", 1)[-1]))]


def to_tensors(value: Any) -> Any:
    """numpy arrays and scalars as torch tensors, recursively through dicts, tuples and lists;
    ``str``/``bytes`` (and batches of them) as Python values.

    Writable arrays (batches stacked by ``.batch()``, outputs of maps) are shared with the
    tensor, zero-copy. Read-only arrays are views of a snapshot's Arrow buffers, which may be
    a read-only memory map of the shard file: those are copied, since a tensor is writable and
    writing through it would corrupt (or crash on) the shared buffer.
    """
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return value.tolist()
        if not value.flags.writeable:
            value = np.array(value)
        try:
            return torch.from_numpy(value)
        except TypeError as e:
            raise TypeError(f"to_torch: torch has no dtype for numpy {value.dtype}; convert the "
                            "field in a map() after the snapshot") from e
    if isinstance(value, (np.bool_, np.number)):
        return torch.from_numpy(np.array(value))
    if isinstance(value, dict):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_tensors(v) for v in value)
    if isinstance(value, list):
        return [to_tensors(v) for v in value]
    return value


# -- torch values into a pipeline (Dataset.from_torch) ---------------------------------------------
def numpy_example(value: Any) -> Any:
    """An example of a torch dataset with its tensors as numpy arrays (what snapshots store)."""
    module = sys.modules.get("torch")
    if module is None:
        return value
    if isinstance(value, module.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: numpy_example(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(numpy_example(v) for v in value)
    if isinstance(value, list):
        return [numpy_example(v) for v in value]
    return value


def register_tensor_fingerprint() -> None:
    """Let fingerprints hash torch values (tensors by dtype, shape and content) now, when torch
    is loaded; otherwise they are registered when a torch value is first fingerprinted
    (:mod:`snapcache.fingerprint.forms`)."""
    from snapcache.fingerprint.forms import load_forms

    load_forms("torch")
