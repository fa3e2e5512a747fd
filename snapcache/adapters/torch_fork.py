"""What a process does just before it forks the workers of a DataLoader over a ``to_torch``
dataset: find the loader starting them on the stack, get the epoch ready for them (manifests
checked, read leases held, shards fetched into a node-local cache) so that each worker makes
no request of its own, and warn when ``cache()`` will be bypassed.

Registered with ``os.register_at_fork``; it never fails a fork (the workers then do the work
themselves)."""

from __future__ import annotations

import logging
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any

from snapcache.pipeline import queries

if TYPE_CHECKING:
    from snapcache.adapters.torch import TorchDataset

log = logging.getLogger(__name__)


_live: "weakref.WeakSet[TorchDataset]" = weakref.WeakSet()  # every loader dataset made here
_not_held: "weakref.WeakSet[TorchDataset]" = weakref.WeakSet()  # their snapshots not yet held
_checked_for: str | None = None  # the epoch token the last check before a fork was made for


def track(torch_dataset: "TorchDataset") -> None:
    """Get ``torch_dataset`` (made by ``to_torch``) ready for the DataLoaders that will fork
    workers over it: its snapshots' read leases held here once they are committed."""
    _live.add(torch_dataset)
    if not queries.hold_for_workers(torch_dataset.dataset):  # not committed yet
        _not_held.add(torch_dataset)


def _hold_before_fork() -> None:
    """Before this process forks (a DataLoader starting its workers): hold, here, the read
    lease of each loader dataset's snapshots that were not committed when ``to_torch`` was
    called and are now (after the writing epoch), so that workers started afresh every epoch
    take no lease of their own. Nothing happens once they are held."""
    for torch_dataset in list(_not_held):
        try:
            if queries.hold_for_workers(torch_dataset.dataset):
                _not_held.discard(torch_dataset)
        except Exception as e:  # never fail a fork; the workers then take their own leases
            log.debug("snapshot read lease not taken before fork: %r", e)


def _check_before_fork(starting: "tuple[TorchDataset, int, int, bool, Any] | None"
                       ) -> "TorchDataset | None":
    """Before a DataLoader forks the workers of an epoch, get them ready here, once
    (:func:`queries.prepare_workers <snapcache.pipeline.queries.prepare_workers>`): the
    snapshots' manifests checked under the epoch token the workers will compute
    (``_epoch_token``), so that they find the check and make no request; with a node-local
    cache, the shards they will read fetched into it here, in their order; s3fs imported
    here if they will still fetch some. A forked worker cannot use this process's obstore
    runtime: each would otherwise start s3fs (~0.5 CPU s) for one HEAD, and fetch its shards
    through it. Found on the stack: the loader's iterator starting its workers holds the
    dataset, the base seed and the number of workers. Anything else (another fork, spawned
    workers, a loader of another kind) leaves the workers to do it all themselves, as before.
    ``starting``: :func:`starting_loader`. The dataset if its snapshots are committed and
    their read leases held here."""
    global _checked_for
    if starting is None:
        return None
    dataset, base_seed, workers, persistent, _ = starting
    token = dataset._token(base_seed, dataset._epochs + 1)
    if token == _checked_for:  # the epoch's second worker
        return None
    _checked_for = token
    try:
        rank, world_size = dataset._rank()
        held = queries.prepare_workers(
            dataset.dataset, token, epoch=dataset.epoch, balance=dataset.balance,
            streams=[(rank * workers + w, world_size * workers) for w in range(workers)],
            persistent=persistent)
    except Exception as e:  # never fail a fork; the workers then do it themselves
        log.debug("workers not prepared before fork: %r", e)
        return None
    return dataset if held else None


def starting_loader() -> tuple[TorchDataset, int, int, bool, dict | None] | None:
    """(dataset, base seed, number of workers, whether they are persistent, the loader state
    they resume) of the DataLoader iterator on this thread's stack that is starting its worker
    processes, if any (torch's and torchdata's hold them as ``_dataset``, ``_base_seed``,
    ``_num_workers`` and ``_persistent_workers``; torchdata's ``__init__`` has the state it
    resumes as ``next_iter_state``, None when it starts an epoch)."""
    frame = sys._getframe(1)
    for _ in range(24):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        dataset = getattr(owner, "_dataset", None)
        if any(live is dataset for live in _live):
            base_seed = getattr(owner, "_base_seed", None)
            workers = getattr(owner, "_num_workers", None)
            if isinstance(base_seed, int) and isinstance(workers, int) and workers > 0:
                loaded = frame.f_locals.get("next_iter_state")
                return dataset, base_seed, workers, \
                    bool(getattr(owner, "_persistent_workers", True)), \
                    loaded if isinstance(loaded, dict) else None
            return None
        frame = frame.f_back
    return None


def before_fork() -> None:
    starting = starting_loader() if _live else None
    if starting is not None:
        starting[0]._workers_starting(starting[1])
        starting[0]._resuming(starting[4])  # before the check: it may start the next epoch
    prepared = _check_before_fork(starting)  # holds the read leases too (one manifest check)
    if prepared is not None:
        _not_held.discard(prepared)
    _hold_before_fork()
    if starting is not None:  # last: under -W error it raises (reported, the fork goes on)
        starting[0]._warn_if_cache_bypassed(starting[2], starting[3])


os.register_at_fork(before=before_fork)
