"""``snapshot``: the cut point where examples are persisted and read back.

Its runner lives in :mod:`snapcache.pipeline.plan` (fingerprint the upstream, then read, write
or compute through :mod:`snapcache.pipeline.snapshot_exec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from snapcache.options import SnapshotOptions
from snapcache.pipeline.ops.base import Op, Traits
from snapcache.pipeline.ops.shuffle import ShuffleOp


@dataclass(frozen=True, eq=False)
class SnapshotOp(Op):
    path: str = ""
    options: SnapshotOptions = field(default_factory=SnapshotOptions)
    kind: ClassVar[str] = "snapshot"
    TRAITS: ClassVar = Traits(element_wise=True, one_to_one=True, keeps_copy=True,
                              length="keep", structure_preserving=True, content=False)
    not_fingerprinted: ClassVar = ("path", "options")

    def describe(self) -> str:
        return f"snapshot({self.path!r})"


def copied_snapshot(op: Op) -> "tuple[SnapshotOp, list[Op]] | None":
    """The snapshot below ``op`` when the ops between compute nothing of an example (they
    reorder, select, repeat or buffer: shuffle, take, shard, repeat, prefetch, cache), with
    those ops in pipeline order: a snapshot at ``op`` would store its examples again."""
    between: list[Op] = []
    node = op
    while not isinstance(node, SnapshotOp):
        t = node.traits
        if t.source or not t.structure_preserving or (t.element_wise and t.content):
            return None
        between.append(node)
        node = node.parent
    return node, between[::-1]


def snapshot_below(op: Op) -> "tuple[SnapshotOp, ShuffleOp | None] | None":
    """The snapshot directly below ``op``, with the shuffle between them if there is one:
    what the column-wise fast reads of :mod:`snapcache.pipeline.runners` can serve."""
    parent = op.parent
    shuffle = None
    if isinstance(parent, ShuffleOp):
        shuffle, parent = parent, parent.parent
    if isinstance(parent, SnapshotOp):
        return parent, shuffle
    return None
