"""Which positions of an epoch each stream reads (its :class:`~snapcache.store.order.Share`),
fresh or resumed from an iterator state, and the order in which cooperating streams first need
the snapshot's shards (to fetch them for DataLoader workers)."""

from __future__ import annotations

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
