"""Which positions of an epoch each stream reads (its :class:`~snapcache.store.order.Share`),
fresh or resumed from an iterator state, and the order in which cooperating streams first need
the snapshot's shards (to fetch them for DataLoader workers)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from snapcache.pipeline import streams
from snapcache.store.manifest import Manifest
from snapcache.store.order import PIECE_ROWS, EpochOrder, Share
from snapcache.store.protocol import stream_shards


def resume_ranges(state: dict) -> list[list[int]]:
    """What remains of the state's epoch for the whole job, assuming every stream consumed
    as much as the state's (lockstep), or ``state["consumed_by_stream"]`` when given."""
    share = share_of_state(state)
    consumed = state.get("consumed_by_stream") or [state["consumed"]] * share.streams
    return [list(r) for r in share.remaining([min(c, share.count(k))
                                              for k, c in enumerate(consumed)])]


def positions_left(state: dict) -> int | None:
    """Positions of its epoch that a state (``OrderedIterator.state_dict``) has not consumed:
    of its stream's share, or of the whole job's with ``consumed_by_stream``. None for a state
    saved while the snapshot was being written (its shares are known once it is complete)."""
    if state.get("writing"):
        return None
    if state.get("consumed_by_stream"):
        return sum(b - a for a, b in resume_ranges(state))
    return max(0, share_of_state(state).count() - state["consumed"])


def share_of_state(state: dict) -> Share:
    """The share a state (``OrderedIterator.state_dict``) was saved with."""
    bounds = state.get("bounds")
    return Share(tuple(tuple(r) for r in state["ranges"]), state["streams"], state["stream"],
                 state["chunk"], state["unit"], state.get("balance"),
                 tuple(bounds) if bounds is not None else None)


def resumed_share(state: dict, spec: streams.StreamSpec, *, window: int, unit: int,
                  balance: str | None) -> tuple[Share, int]:
    """Stream ``spec``'s share and its position in it (positions already consumed), resuming
    ``state``: a stream's (``OrderedIterator.state_dict``) or the whole job's (with
    ``consumed_by_stream``, from ``job_state``). With as many streams each continues its own
    share; with another number the rest of the epoch is shared anew. Raises ``ValueError``
    when the state does not say where the other streams are."""
    same = state["streams"] == spec.count and state.get("balance") == balance
    if state.get("consumed_by_stream") is None and state["streams"] > 1 and not (
            state.get("rows_per_item_fixed", True) or same and state["stream"] == spec.index):
        raise ValueError(
            f"this iterator state is stream {state['stream']}'s of {state['streams']}, and "
            "the pipeline filters between the snapshot and the batch: streams that took as "
            "many items have read different numbers of examples, so it does not say where "
            "the others are. Resume each stream with its own state, or give the whole job's "
            "(snapcache.adapters.torch.job_state with every rank's loader state)")
    if same:  # each stream continues its own share (lockstep: as far as the state's)
        return (dataclasses.replace(share_of_state(state), index=spec.index),
                own_position(state, spec.index))
    return Share.of(resume_ranges(state), spec.count, spec.index, window=window, unit=unit,
                    balance=balance), 0


def own_position(state: dict, index: int) -> int:
    """Positions stream ``index`` consumed of its own share, resuming ``state`` with as many
    streams: its entry of ``consumed_by_stream`` in a whole job's state, else (lockstep) the
    state's own."""
    by_stream = state.get("consumed_by_stream")
    return by_stream[index] if by_stream else state["consumed"]


def stream_state(state: dict, spec: streams.StreamSpec, balance: str | None) -> dict:
    """The state stream ``spec`` resumes ``state`` (a whole job's or a stream's) from, as its
    iterator would report it before yielding anything: where a stream not started yet is.
    Raises ``ValueError`` where resuming ``state`` with ``spec`` is refused."""
    out = {k: v for k, v in state.items() if k != "consumed_by_stream"}
    if state.get("writing"):  # positions are known once the snapshot is complete
        if state["streams"] != spec.count:
            raise ValueError("a state saved while the snapshot was being written resumes only "
                             "with the same streams")
        return {**out, "stream": spec.index, "consumed": own_position(state, spec.index)}
    share, skip = resumed_share(state, spec, window=state["window"], unit=state["unit"],
                                balance=balance)
    return {**out, "ranges": [list(r) for r in share.ranges], "streams": share.streams,
            "stream": share.index, "chunk": share.chunk, "unit": share.unit,
            "balance": share.balance, "consumed": skip,
            "bounds": list(share.bounds) if share.bounds is not None else None}


def read_share(manifest: Manifest, spec: streams.StreamSpec, *, shuffled: bool, window: int = 1,
               unit: int = 1, balance: str | None = None) -> Share:
    """Stream ``spec``'s share of a fresh epoch. Shuffled: chunks of the epoch's order,
    round-robin. In order: one contiguous part per stream (whole units but the last's),
    and when the snapshot was written by as many streams, the rows each wrote: in one epoch
    some streams may still replay their own shards while others read the committed one."""
    total = manifest.num_examples
    if shuffled or spec.count == 1 or balance is not None:
        return Share.of([(0, total)], spec.count, spec.index, window=window, unit=unit,
                        balance=balance)
    own = [stream_shards(manifest, k, spec.count) for k in range(spec.count)]
    if all(o is not None for o in own):
        bounds = [0]
        for shards in own:
            bounds.append(bounds[-1] + sum(s.rows for s in shards))  # type: ignore[union-attr]
    else:
        units = total // unit
        bounds = [unit * (units * k // spec.count) for k in range(spec.count)] + [total]
    return Share(((0, total),), spec.count, spec.index, unit=unit,
                 chunk=max(unit, total // unit * unit), bounds=tuple(bounds))


def piece_rows(unit: int) -> int:
    """Positions a read of a share of ``unit`` takes at a time (``ordered_pieces``' ``piece``):
    its first batch comes once that many are decoded."""
    return max(PIECE_ROWS, unit)


def first_shard(order: EpochOrder, share: Share, skip: int = 0) -> int | None:
    """The shard of the first position ``share`` reads after ``skip``; None if it reads
    nothing."""
    for a, b in share.pieces(skip):
        if a < b:
            return int(order.layout.shard[int(order.locate(a, a + 1)[0][0])])
    return None


EXACT_READ_ORDER = 1 << 16
"""Positions of each stream's share that :func:`first_needs` follows one by one; past them, a
shuffle window's shards come in the window's block sequence (all are needed within the
window's span)."""


def first_needs(order: EpochOrder, shares: Sequence[Share], count: int) -> list[int]:
    """The ``count`` shards of ``order``'s layout, in the order streams reading ``shares`` of
    it together first need them: each stream's first uses, taken in turn (exact over the first
    :data:`EXACT_READ_ORDER` positions of each), then the shards no share reads."""
    shard_of = order.layout.shard
    firsts: list[list[int]] = []
    for share in shares:
        seen: dict[int, None] = {}
        exact = EXACT_READ_ORDER
        for a, b in share.pieces():
            if exact > 0:  # position by position
                stop = min(b, a + exact)
                exact -= stop - a
                seen.update(dict.fromkeys(shard_of[order.locate(a, stop)[0]].tolist()))
                a = stop
            if a < b:  # the blocks of the windows the rest of the piece reads, in sequence
                seen.update(dict.fromkeys(shard_of[order.blocks_in(a, b)].tolist()))
        firsts.append(list(seen))
    out: dict[int, None] = {}
    for turn in itertools.zip_longest(*firsts):
        out.update(dict.fromkeys(shard for shard in turn if shard is not None))
    out.update(dict.fromkeys(range(count)))
    return list(out)
