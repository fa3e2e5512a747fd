"""What the faces (adapters, CLI) may ask about a pipeline without reading its ops
(``Dataset._op`` stays inside ``pipeline/``): how many items an epoch yields, its last
snapshot, and the structure of its elements as recorded by that snapshot.

Derived from the ops' traits (``length``, ``structure_preserving``, ``batch_dims``).
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from snapcache.pipeline import ops, plan, shares, streams
from snapcache.store.schema import Schema


def known_length(dataset: Any) -> int | None:
    """Items one epoch of ``dataset`` yields, when knowable without running it (a committed
    snapshot's count in place of its upstream's: :func:`plan.known_length`); what ``len()``
    says."""
    return plan.known_length(dataset._op)


def last_snapshot(dataset: Any) -> ops.SnapshotOp | None:
    """The last ``.snapshot()`` of the pipeline, if any."""
    return plan.last_snapshot(dataset._op)


def has_cache(dataset: Any) -> bool:
    """Whether the pipeline holds a ``cache()``: it replays only whole epochs run as one
    stream, in the process that filled it (:class:`ops.CacheOp`)."""
    return any(isinstance(node, ops.CacheOp) for node in ops.lineage(dataset._op))


def take_fingerprints(dataset: Any) -> None:
    """Fingerprint the pipeline's snapshots now, in this process, and keep the result on the
    pipeline object: processes forked from here later (DataLoader workers, started afresh each
    epoch) inherit it instead of each hashing the sources again (spawned ones receive it:
    :func:`taken_fingerprints`), and a function whose memo cache fills while they run cannot
    change it."""
    for node in ops.lineage(dataset._op):
        if isinstance(node, ops.SnapshotOp):
            plan.snapshot_id(node)  # a delta snapshot: its lineage and files, no per-file tree


def taken_fingerprints(dataset: Any) -> list[tuple[ops.Op, dict[str, Any]]]:
    """What this process has taken once of the pipeline's ops (fingerprints, file identities,
    decisions; see :meth:`ops.Op.memo`), per op: for DataLoader workers started by pickling
    the pipeline ("spawn", "forkserver"), to start with it as forked workers do instead of
    taking it again every epoch. Pickled in the same pickle as the pipeline, each op here is
    unpickled as the very op of the worker's copy that :func:`adopt_fingerprints` gives it
    to: it goes to no other pipeline. Only a copy of the same pipeline object made at that
    moment may receive it (it is what that object holds: a copy loaded later, after its files
    changed, must take its own)."""
    return [(node, memos) for node in ops.lineage(dataset._op) if (memos := node.memos())]


def adopt_fingerprints(taken: list[tuple[ops.Op, dict[str, Any]]]) -> None:
    """Hold, on the ops of an unpickled pipeline, what :func:`taken_fingerprints` took of
    them in the process that pickled it."""
    for node, memos in taken:
        node.adopt_memos(memos)


def hold_for_workers(dataset: Any) -> bool:
    """Hold, in this process, a read lease on each committed snapshot of the pipeline while
    the pipeline object lives: the DataLoader workers forked from here to read it then take
    none of their own (no lease requests per worker and epoch). True if every snapshot of the
    pipeline is committed and held (False: call again later, e.g. after the writing epoch)."""
    from snapcache.pipeline.snapshot_exec import hold_for_workers as hold

    return all([hold(node) is not None for node in ops.lineage(dataset._op)
                if isinstance(node, ops.SnapshotOp)])


def prepare_workers(dataset: Any, token: str, *, epoch: int,
                    streams: Sequence[tuple[int, int]], balance: str | None = None,
                    persistent: bool = False) -> bool:
    """Get this process ready to fork DataLoader workers that read the epoch ``token`` of the
    pipeline as ``streams`` (``(index, count)`` each); a fork hook of the torch adapter:

    - each snapshot's manifest is checked here under the workers' token, so that they find
      that check and make no request (:func:`shared_epoch`), and its read lease held
      (:func:`hold_for_workers`);
    - with a node-local cache (``local_cache=``), the shards the workers will read, not there
      yet, are fetched into it on a background thread here, in the order the streams first
      need them and the first ones started before this returns: a worker waits for a shard
      being fetched rather than fetching it again, and one that finds everything cached
      makes no request and starts no S3 client (a forked child cannot use this process's
      obstore runtime and would start s3fs);
    - where the workers will still make requests themselves (they fetch shards: no cache, or
      more than half of it; they are ``persistent``: they check the manifest of each later
      epoch), s3fs is imported here once, for them all to inherit.

    True if every snapshot is committed and held."""
    from snapcache.pipeline.ordered import shards_in_read_order
    from snapcache.pipeline.snapshot_exec import check_root, open_reader
    from snapcache.pipeline.snapshot_exec import hold_for_workers as hold
    from snapcache.pipeline.streams import StreamSpec
    from snapcache.store import checks

    last = plan.last_snapshot(dataset._op)
    held, covered = True, False
    with checks.for_children(token):
        for node in ops.lineage(dataset._op):
            if not isinstance(node, ops.SnapshotOp):
                continue
            committed = hold(node)
            held = held and committed is not None
            if node is last and committed is not None:
                reader = open_reader(*committed, node.options)
                if not reader.cached:  # local, or no node-local cache: nothing to fetch
                    continue
                order = shards_in_read_order(
                    dataset._op, reader, epoch,
                    [StreamSpec(index, count) for index, count in streams], balance)
                covered = reader.prefetch([reader.manifest.shards[i] for i in order],
                                          started=len(streams))
                _prefetching[node] = reader  # until the next epoch's, or the pipeline's end
    if persistent or not covered:
        for node in ops.lineage(dataset._op):
            if isinstance(node, ops.SnapshotOp):
                check_root(node).before_fork()
    return held


_prefetching: "weakref.WeakKeyDictionary[ops.SnapshotOp, Any]" = weakref.WeakKeyDictionary()
"""The reader filling the node-local cache for a loader's workers, per snapshot op: it lives
as long as the pipeline does (a sweep that drops its pipelines drops their readers and the
readers' fetch threads)."""


def shared_epoch(token: str | None) -> Any:
    """A context in which this process reads one epoch together with the other processes of
    this node that use the same ``token`` (a DataLoader's workers): they check each snapshot's
    manifest once between them (see :mod:`snapcache.store.checks`). None: no sharing."""
    from snapcache.store import checks

    return checks.shared_epoch(token)


def positions_left(state: dict) -> int | None:
    """Examples of its epoch an iterator state (``state_dict()``) has still to yield; None if
    not known before the snapshot is complete (:func:`.shares.positions_left`)."""
    return shares.positions_left(state)


def stream_state(state: dict, stream: tuple[int, int], balance: str | None) -> dict | None:
    """The iterator state stream ``(index, count)`` resumes ``state`` (a whole job's, from
    ``job_state``, or a stream's) from, as its iterator would report it before its first item:
    its own share of the job's state. None if resuming ``state`` with it is refused, or it is
    not an iterator state: the iteration then says why."""
    try:
        return shares.stream_state(state, streams.StreamSpec(*stream), balance)
    except (ValueError, KeyError):
        return None


def batch_dims(dataset: Any) -> int:
    """Leading batch dimensions the pipeline adds to its examples (one per ``batch``)."""
    return sum(node.traits.batch_dims for node in ops.lineage(dataset._op))


def pads(dataset: Any) -> bool:
    """Whether a ``padded_batch`` of the pipeline may change its arrays' trailing shapes."""
    return any(isinstance(node, ops.BatchOp) and node.padding is not None
               for node in ops.lineage(dataset._op))


def snapshot_structure(dataset: Any) -> tuple[Schema, int] | None:
    """The schema of the pipeline's last snapshot and the batch dimensions added after it,
    when only structure-preserving ops follow the snapshot; building the snapshot first if it
    is not committed yet (the first epoch's work, done once). None when the pipeline has no
    snapshot, when ops after it change the structure, or when nothing was written."""
    op = dataset._op
    snap = plan.last_snapshot(op)
    if snap is None:
        return None
    tail = ops.lineage(op)[len(ops.lineage(snap)):]
    if not all(node.traits.structure_preserving for node in tail):
        return None
    schema = _committed_schema(type(dataset), snap)
    if schema is None:
        return None
    return schema, sum(node.traits.batch_dims for node in tail)


def _committed_schema(dataset_type: type, snap: ops.SnapshotOp) -> Schema | None:
    _, manifest = plan.committed_snapshot(snap)
    if manifest is None:  # build it: the work of the first epoch, done once
        for _ in dataset_type(snap).iterate(epoch=0):
            pass
        _, manifest = plan.committed_snapshot(snap)
    if manifest is None or manifest.schema is None:  # computed without writing, or empty
        return None
    return Schema.from_json(manifest.schema)
