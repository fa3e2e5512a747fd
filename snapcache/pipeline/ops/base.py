"""What every op is: an immutable spec with declared traits, declared fingerprint fields, and a
registered runner.

An op never says what kind of op another one is: the rest of snapcache asks an op for its
:class:`Traits` (is it element-wise, one-in-one-out, order-preserving, how it changes the
length, ...) and derives every decision from them (stream splitting, resume, progress totals,
TF element specs, Ray's per-stream check). A new op declares its traits next to its spec and
every decision follows.

Fingerprints follow the same rule, like HF datasets' ``fingerprint_transform(use_kwargs=...)``:
each op class lists the fields that decide what it computes (``fingerprint_functions``,
``fingerprint_args``; ``fingerprint_args_if_set`` when not None) and the fields that only
decide how (``not_fingerprinted``:
``executor``, ``num_parallel_calls``, ...). ``tests/pipeline/test_ops_traits.py`` checks that
every field of every op is declared one way or the other.

Runners: ``RUNNERS`` maps an op type to ``run(op, epoch) -> Iterator``; each op module fills
it with :func:`runs`. :func:`run` dispatches through it, :func:`upstream` runs an op's parent.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

from snapcache.fingerprint import FingerprintNode, hash_function, hash_value
from snapcache.pipeline import streams
from snapcache.runtime import stats

LENGTH_RULES = ("keep", "rule", "unknown")


@dataclass(frozen=True)
class Traits:
    """What an op is, as far as the rest of snapcache needs to know.

    - ``source``: it starts a pipeline (no parent).
    - ``element_wise``: each output depends on one input alone, so running the pipeline as N
      streams, each on its share of the source, yields the same examples as one run.
    - ``one_to_one``: exactly one output per input.
    - ``order_preserving``: outputs come in the order of their inputs (a
      ``map(deterministic=False)`` is not).
    - ``keeps_copy``: it stores what passes through (cache, snapshot); a pass over part of the
      input would store a partial copy, so a resume cannot skip through it.
    - ``seekable`` (sources): the source can start at any example (resume skips by count).
    - ``strided`` (sources): stream ``i`` of ``n`` yields the examples at positions ``i``,
      ``i + n``, ``i + 2n``, ... of one stream's run (a take of the first ``k`` can then be
      split between the streams exactly).
    - ``prefix``: it passes a prefix of its input, unchanged (take): what passes keeps its
      position.
    - ``by_position``: it selects examples by their position in the epoch (take, shard): run as
      several streams after a :func:`strided` upstream, each stream selects its own exactly;
      elsewhere stream 0 selects alone.
    - ``length``: how the number of items changes: ``"keep"`` (same as upstream), ``"rule"``
      (the op's :meth:`Op.length` computes it) or ``"unknown"``.
    - ``structure_preserving``: the example structure (keys, dtypes, trailing shapes) is kept;
      ``batch_dims`` leading dimensions are added (1 for batch).
    - ``per_stream``: applied to each stream's share separately it would produce something
      else than applied once to everything (batch groups each stream's share; take and shard
      run by position instead, see ``by_position``).
    - ``content``: it changes the examples, so it counts towards fingerprints (prefetch, cache
      and snapshot do not).
    - ``per_input``: each output comes from one input alone, though outputs of several inputs
      may mix (interleave); with ``element_wise`` ops, what lets a delta snapshot compute a
      group of files on its own.
    - ``units`` (sources): made of files each computed on its own, so a delta snapshot can
      compute only the new and changed ones (the op offers ``unit_identities()``,
      ``with_units(urls)`` and ``lineage_children(where)``).
    """

    source: bool = False
    element_wise: bool = False
    one_to_one: bool = False
    order_preserving: bool = True
    keeps_copy: bool = False
    seekable: bool = False
    strided: bool = False
    prefix: bool = False
    by_position: bool = False
    length: str = "unknown"
    structure_preserving: bool = False
    batch_dims: int = 0
    per_stream: bool = False
    content: bool = True
    per_input: bool = False
    units: bool = False

    def __post_init__(self) -> None:
        if self.length not in LENGTH_RULES:
            raise ValueError(f"Traits.length must be one of {LENGTH_RULES}; got {self.length!r}")


def callable_name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


@dataclass(frozen=True, eq=False)
class Op:
    parent: "Op | None"
    kind: ClassVar[str] = "op"
    TRAITS: ClassVar[Traits] = Traits()
    fingerprint_functions: ClassVar[tuple[str, ...]] = ()
    """Fields holding code that decides the output (hashed by :func:`hash_function`)."""
    fingerprint_args: ClassVar[tuple[str, ...]] = ()
    """Fields holding values that decide the output (hashed by :func:`hash_value`)."""
    fingerprint_source: ClassVar[tuple[str, ...]] = ()
    """Fields of a source hashed by its own rule (:meth:`fingerprint_children`)."""
    fingerprint_args_if_set: ClassVar[tuple[str, ...]] = ()
    """Fields holding values that decide the output, hashed only when not None: fields added
    after fingerprints were first taken, so that a pipeline not using them keeps its
    fingerprint (and its snapshots)."""
    not_fingerprinted: ClassVar[tuple[str, ...]] = ()
    """Fields that decide how, not what (parallelism, executor, buffers, options)."""

    @property
    def traits(self) -> Traits:
        """This op's traits; an op whose traits depend on its arguments overrides this."""
        return self.TRAITS

    @property
    def content(self) -> bool:
        return self.traits.content

    @property
    def function(self) -> Any:
        """The user function this op applies, if any (for labels and randomness checks)."""
        return None

    def describe(self) -> str:
        return self.kind

    def length(self, upstream: int | None) -> int | None:
        """Items one epoch yields given ``upstream`` items (None: not knowable without
        running it). Sources receive None."""
        if self.traits.length == "keep":
            return upstream
        return None

    def randomness_problems(self) -> list[str]:
        """Why this op's output may differ from run to run (frozen into a snapshot)."""
        return []

    def order_varies(self) -> bool:
        """Whether two runs over the same input may yield in another order (a
        ``map(deterministic=False)`` yields as results complete; a shuffle without a seed)."""
        return not self.traits.order_preserving

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        children = [hash_function(getattr(self, name), f"function `{callable_name(getattr(self, name))}`",
                                  where=where) for name in self.fingerprint_functions]
        children += [hash_value(getattr(self, name), f"argument `{name}`", where=where)
                     for name in self.fingerprint_args]
        children += [hash_value(getattr(self, name), f"argument `{name}`", where=where)
                     for name in self.fingerprint_args_if_set if getattr(self, name) is not None]
        return children

    def memo(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time, the same value afterwards (per op object): what a
        pipeline object's fingerprint is taken with, once, at its first iteration.

        No lock is held while computing (a fork meanwhile must not leave a child waiting on
        it): two threads arriving first may both compute, and the first value stored is the
        one every caller gets."""
        memos = self.__dict__.setdefault("_memos", {})  # atomic: frozen fields are untouched
        if name in memos:
            return memos[name]
        return memos.setdefault(name, compute())

    def memos(self) -> dict[str, Any]:
        """What :meth:`memo` holds so far, by name (a copy)."""
        return dict(self.__dict__.get("_memos", {}))

    def adopt_memos(self, memos: dict[str, Any]) -> None:
        """Hold ``memos`` (:meth:`memos` of the op this one is a pickled copy of, taken as it
        was pickled) as if computed here; a value computed here already stays."""
        mine = self.__dict__.setdefault("_memos", {})
        for name, value in memos.items():
            mine.setdefault(name, value)

    def __getstate__(self) -> dict:
        # Memos stay in this process: another process (a Ray task on another node, a copy
        # loaded later) takes its own fingerprint, so a difference there is seen, not hidden.
        # The one exception is said where it is made: DataLoader workers being started with
        # the pipeline (``snapcache.adapters.torch``, ``queries.taken_fingerprints``).
        return {k: v for k, v in self.__dict__.items() if k != "_memos"}


def lineage(op: Op) -> list[Op]:
    """The ops from the source down to ``op``, in pipeline order."""
    chain = []
    node: Op | None = op
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain[::-1]


def keeps_positions(t: Traits) -> bool:
    """Each output is the input at the same position: one-to-one, in order, keeping no copy."""
    return t.one_to_one and t.order_preserving and not t.keeps_copy


def from_source(op: Op | None, source_ok: Callable[[Traits], bool],
                op_ok: Callable[[Traits], bool]) -> bool:
    """True if the pipeline up to ``op`` starts at a source whose traits ``source_ok`` accepts
    and every op after it has traits ``op_ok`` accepts."""
    if op is None:
        return False
    return all(source_ok(node.traits) if node.traits.source else op_ok(node.traits)
               for node in lineage(op))


def strided(op: Op | None) -> bool:
    """True if stream ``i`` of ``n`` of the pipeline up to ``op`` yields the examples at
    positions ``i``, ``i + n``, ... of one stream's run: a strided source, then only ops that
    keep each example's position (element-wise ones, or a prefix)."""
    return from_source(op, lambda t: t.strided,
                       lambda t: t.prefix or (t.element_wise and keeps_positions(t)))


def input_positions(op: Op) -> Callable[[int, int | None], str] | None:
    """How an error note names the example at input ``index`` of ``op``'s run in the current
    stream (a ``Locate`` of :mod:`snapcache.runtime.errors`; its runner passes it on, and it
    costs nothing until an exception): None, the default "example #index of this epoch", when
    the stream is the whole epoch; its position in the epoch when the stream takes the epoch's
    positions by stride (a :func:`strided` upstream: ``index + count * (skip + k)``); else its
    position in the stream's share, saying so (after a snapshot's read, a shuffle, a filter),
    or in the part of the epoch being run (:func:`streams.part`: a delta segment's files)."""
    part = streams.part()
    if part is not None:
        return functools.partial(_part_position, part)
    spec = streams.current()
    if spec.trivial:
        return None
    if strided(op.parent):
        return functools.partial(_strided_position, spec.index + spec.count * spec.skip,
                                 spec.count)
    return functools.partial(_share_position, spec.index, spec.count)


def _strided_position(first: int, step: int, index: int, position: int | None) -> str:
    return f"example #{first + step * index} of this epoch"


def _share_position(stream: int, count: int, index: int, position: int | None) -> str:
    return f"example #{index} of this stream's share (stream {stream} of {count})"


def _part_position(part: str, index: int, position: int | None) -> str:
    return f"example #{index} of {part}"


# -- runners -----------------------------------------------------------------------------------
Runner = Callable[[Any, int], Iterator[Any]]
RUNNERS: dict[type, Runner] = {}


def runs(op_type: type) -> Callable[[Runner], Runner]:
    """Register the decorated function as the runner of ``op_type``."""

    def register(fn: Runner) -> Runner:
        RUNNERS[op_type] = fn
        return fn

    return register


def run(op: Op, epoch: int, stream: streams.StreamSpec | None = None) -> Iterator[Any]:
    """A fresh iterator over one epoch of the pipeline ending at ``op``; with ``stream``,
    only that stream's share of the examples (see :mod:`snapcache.pipeline.streams`)."""
    runner = RUNNERS.get(type(op))
    if runner is None:
        raise TypeError(f"no runner is registered for {type(op).__name__}; its module must "
                        "register one with @runs")
    if stream is None:
        return counted(op, runner(op, epoch))
    token = streams.set_current(stream)
    try:
        return counted(op, runner(op, epoch))
    finally:
        streams.reset(token)


def counted(op: Op, iterator: Iterator[Any], *, size: Callable[[Any], int] | None = None,
            payload: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """``iterator``, counted as ``op``'s stage when ``Dataset.stats()`` is collecting (see
    :meth:`snapcache.runtime.stats.Recorder.wrap` for ``size`` and ``payload``). Every runner's
    iterator is; a runner that does the work of ops it does not run (a whole-column read of a
    snapshot) counts their stages with this."""
    recorder = stats.current.get()
    if recorder is None:
        return iterator
    return recorder.wrap(len(lineage(op)) - 1, iterator, size=size, payload=payload)


def upstream(op: Op, epoch: int) -> Iterator[Any]:
    """A fresh iterator over ``op``'s parent for ``epoch``."""
    if op.parent is None:
        raise TypeError(f"{op.describe()} has no upstream")
    return run(op.parent, epoch)


def closing(source: Iterator[Any], body: Iterator[Any]) -> Iterator[Any]:
    """Yield from ``body``; close ``source`` however this generator ends."""
    try:
        yield from body
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
