"""Planning a delta build: which segments of the newest version stay, what is computed or
copied, cut into tasks.

The source's units (:class:`SourceUnits`: its files or Parquet row groups, by identity and
key) are compared with the segments of the lineage's newest version (:func:`plan_build`): a
segment whose units are all still in the source, unchanged, is kept in place; a segment that
lost units has its other units' rows copied when each unit's rows are known, else those units
are computed again; new and changed units are computed. What is to compute or copy is cut into
tasks (:class:`Task`) of at most :data:`SEGMENT_UNITS` units, the same way by every builder, so
stream ``i`` of ``n`` owns tasks ``i, i + n, ...``. :func:`survey` says where a build stands:
its plan, its tasks and those already recorded (by any stream, or by a build that died);
:func:`explain_delta` gives ``explain`` the plan of the next build.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from snapcache.errors import CorruptSnapshotError
from snapcache.fingerprint.units import (
    UnitDiff, describe_delta, diff_units, occurrence_keys, unit_key, unit_label, units_digest)
from snapcache.pipeline import ops
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest
from snapcache.store.protocol import StreamRecord, progress_by_task, versions
from snapcache.store.protocol.versions import SegmentRecord as Segment

log = logging.getLogger("snapcache")

SEGMENT_UNITS = 256
"""Files per segment: what a removed or changed file costs its segment-mates (their rows are
copied, or recomputed when each file's rows are not known)."""
MAX_SEGMENTS_PER_BUILD = 9_000


@dataclass(frozen=True)
class SourceUnits:
    """A unit source's files as the delta build sees them: identity of each, in order; their
    keys are computed when a build or ``explain`` compares them with a version."""

    kind: str
    identities: tuple[dict, ...]

    @functools.cached_property
    def digest(self) -> str:
        return units_digest(self.identities)

    @functools.cached_property
    def keys(self) -> tuple[str, ...]:
        return tuple(occurrence_keys([unit_key(i) for i in self.identities]))

    @property
    def size(self) -> int:
        """Bytes of the source: its files' (each counted once for row groups)."""
        files = {str(i["path"]): i.get("file_size", i.get("size")) for i in self.identities}
        return sum(int(size or 0) for size in files.values())

    @functools.cached_property
    def row_groups(self) -> bool:
        return versions.has_row_groups(self.identities)

    @property
    def noun(self) -> str:
        return "row group" if self.row_groups else "file"


def source_units(source: ops.Op, lineage: Callable[[], Storage] | None = None) -> SourceUnits:
    """The units of ``source`` (taken once per source op object). Sources whose identities
    cost reads (Parquet row groups) reuse those of the newest version of the lineage folder
    (``lineage()``) for the files that did not change."""
    def known() -> list[dict]:
        folder = lineage() if lineage is not None else None
        try:
            base = versions.newest(folder) if folder is not None else None
            return [u.identity for u in versions.read_units(folder, base)] if base else []
        except CorruptSnapshotError as e:
            log.warning("not reusing the unit identities of %s: %s", folder.url, e)
            return []

    def compute() -> SourceUnits:
        identities = tuple(source.unit_identities(known))
        return SourceUnits(source.kind, identities)

    return source.memo("source_units", compute)


def base_segments(storage: Storage, base: Manifest | None) -> list[Segment]:
    """The segments of a committed version, with their units."""
    if base is None:
        return []
    units = versions.read_units(storage, base)
    keys = occurrence_keys([unit_key(u.identity) for u in units])  # numbered as the source's
    grouped: list[list[tuple[str, versions.Unit]]] = [[] for _ in base.segments or ()]
    for key, unit in zip(keys, units):
        grouped[unit.segment].append((key, unit))
    segments, start = [], 0
    for spec, members in zip(base.segments or (), grouped):
        shards = tuple(base.shards[start:start + spec["shards"]])
        start += spec["shards"]
        rows = [u.rows for _, u in members]
        known = None not in rows and sum(rows) == sum(s.rows for s in shards)  # type: ignore
        segments.append(Segment(tuple((key, u.identity) for key, u in members),
                                shards, base.schema if shards else None,
                                tuple(rows) if known else None))  # type: ignore[arg-type]
    return segments


@dataclass(frozen=True)
class Plan:
    """What a build will do: segments reused in place, units computed."""

    base: Manifest | None
    diff: UnitDiff
    reused: tuple[Segment, ...]
    compute: tuple[int, ...]          # indices into the source's units, in source order
    total: int
    copied: tuple[tuple[Segment, tuple[int, ...]], ...] = ()
    """Segments with removed or changed files whose other files' rows are copied (their
    indices in the segment), not recomputed: the rows of each file are known."""

    @property
    def reused_rows(self) -> int:
        return sum(s.rows for s in self.reused) + sum(
            s.unit_rows[i] for s, kept in self.copied for i in kept)  # type: ignore[index]

    @property
    def reused_units(self) -> int:
        return sum(len(s.units) for s in self.reused) + sum(len(k) for _, k in self.copied)

    def reused_share(self) -> float:
        """Reused examples over the examples expected (units computed are estimated at the
        base version's mean examples per unit)."""
        base_units = self.base.source.get("units", 0) if self.base is not None else 0
        per_unit = self.base.num_examples / base_units if base_units else 1.0
        expected = self.reused_rows + per_unit * len(self.compute)
        return self.reused_rows / expected if expected else 1.0

    noun: str = "file"

    def describe(self) -> str:
        return describe_delta(self.diff, computing=len(self.compute), total=self.total,
                              reusing=self.reused_units, reused_share=self.reused_share(),
                              noun=self.noun)


def plan_build(units: SourceUnits, base: Manifest | None, segments: Sequence[Segment]) -> Plan:
    """Which segments of the base version stay, which units to compute. A segment stays when
    every one of its units is still in the source, unchanged; a segment that lost some, whose
    rows per unit are known, has its other units' rows copied. (Segments a build that died
    recorded are found again by :func:`survey`: the next build cuts the same tasks.)"""
    current = set(units.keys)
    old = [(unit_label(identity), key) for seg in segments for key, identity in seg.units]
    diff = diff_units(old, list(zip((unit_label(i) for i in units.identities), units.keys)))
    reused: list[Segment] = []
    copied: list[tuple[Segment, tuple[int, ...]]] = []
    covered: set[str] = set()
    for seg in segments:
        keys = {key for key, _ in seg.units}
        if keys and keys <= current and not keys & covered:
            reused.append(seg)
            covered |= keys
    for seg in segments:  # then what can be salvaged from the base version's other segments
        if seg in reused or seg.unit_rows is None:
            continue
        kept = tuple(i for i, (key, _) in enumerate(seg.units)
                     if key in current and key not in covered)
        if kept:
            copied.append((seg, kept))
            covered |= {seg.units[i][0] for i in kept}
    compute = tuple(i for i, key in enumerate(units.keys) if key not in covered)
    return Plan(base, diff, tuple(reused), compute, len(units.keys), tuple(copied), units.noun)


# -- tasks -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One segment a build produces: source units computed (``compute``: indices into the
    source's units), or the units ``kept`` of a base segment ``copy`` copied. Tasks are cut the
    same way by every stream of a build (from the newest version and the source), so stream
    ``i`` of ``n`` owns tasks ``i, i + n, ...`` and a finished task is recognised by its units'
    keys whoever recorded it."""

    seq: int
    compute: tuple[int, ...] = ()
    copy: Segment | None = None
    kept: tuple[int, ...] = ()

    def keys(self, units: SourceUnits) -> tuple[str, ...]:
        if self.copy is not None:
            return tuple(self.copy.units[i][0] for i in self.kept)
        return tuple(units.keys[i] for i in self.compute)


@dataclass
class Work:
    """Where the build of the version of ``units`` stands: the plan against the newest
    version, its tasks, and the segments already recorded for them (by any stream, or by a
    build that died)."""

    plan: Plan
    segments: list[Segment]
    tasks: list[Task]
    done: dict[tuple[str, ...], Segment]
    units: SourceUnits
    storage: Storage | None = None
    names: list[str] = field(default_factory=list)  # the lineage folder's listing

    @functools.cached_property
    def progress(self) -> dict[str, StreamRecord]:
        """Interrupted runs' progress on tasks, by task digest
        (:func:`snapcache.pipeline.delta_segment.task_digest`)."""
        if self.storage is None or not any(n.startswith("progress-") for n in self.names):
            return {}
        return progress_by_task(self.storage, self.names)

    def pending(self, stream: int, count: int) -> list[Task]:
        return [t for t in self.tasks if t.seq % count == stream
                and t.keys(self.units) not in self.done]

    @property
    def complete(self) -> bool:
        return all(t.keys(self.units) in self.done for t in self.tasks)


def survey(storage: Storage, units: SourceUnits, previous: Work | None = None) -> Work:
    """The plan of the next version and which of its tasks are recorded already (the plan of
    ``previous`` is kept when no version was committed since)."""
    names = storage.listdir()
    numbers = versions.versions(storage, names)
    base_version = previous.plan.base.version if previous and previous.plan.base else None
    if previous is not None and (numbers[-1] if numbers else None) == base_version:
        plan, segments, tasks = previous.plan, previous.segments, previous.tasks
    else:
        base = versions.load_version(storage, numbers[-1]) if numbers else None
        segments = base_segments(storage, base)
        plan = plan_build(units, base, segments)
        chunks = _chunks(plan.compute, units)
        tasks = [Task(seq, compute=tuple(chunk)) for seq, chunk in enumerate(chunks)]
        tasks += [Task(len(chunks) + n, copy=seg, kept=kept)
                  for n, (seg, kept) in enumerate(plan.copied)]
    wanted = {t.keys(units) for t in tasks}
    done = {}
    for record in versions.finished_segments(storage, names):
        keys = tuple(key for key, _ in record.units)
        if keys in wanted:
            done.setdefault(keys, record)
    return Work(plan, segments, tasks, done, units, storage, names)


def _chunks(indices: Sequence[int], units: SourceUnits) -> list[list[int]]:
    size = max(SEGMENT_UNITS, -(-len(indices) // MAX_SEGMENTS_PER_BUILD))
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def explain_delta(storage: Storage, units: SourceUnits) -> tuple[Manifest | None, Plan | None]:
    """For ``explain``: the version matching the source (a hit), else the plan of the next build
    against the newest version (None when the lineage has no version yet)."""
    names = storage.listdir()
    hit = versions.find_version(storage, units.digest, names)
    if hit is not None:
        return hit, None
    base = versions.newest(storage, names)
    if base is None:
        return None, None
    return None, plan_build(units, base, base_segments(storage, base))
