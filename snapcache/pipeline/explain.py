"""Why a pipeline hits or misses the snapshots in a root, in words a user understands."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from snapcache.fingerprint import FingerprintNode, diff_trees
from snapcache.fingerprint.explain import closeness
from snapcache.store.catalog import Entry, scan
from snapcache.store.fs import Storage


@dataclass(frozen=True)
class Explanation:
    """The answer of :meth:`snapcache.Dataset.explain`. ``str()`` gives the report."""

    root: str
    fingerprint: str
    hit: bool
    state: str                   # one of snapcache.store.catalog.STATES
    closest: str | None = None   # fingerprint of the most alike committed snapshot, on a miss
    closest_name: str | None = None
    similarity: float = 0.0
    differences: list[str] = field(default_factory=list)
    num_examples: int | None = None
    delta: str | None = None     # delta snapshots: what the next build computes and reuses
    version: int | None = None   # delta snapshots: the version hit, or the one built on
    problem: str = ""            # state "corrupt": why its manifest cannot be read
    newer: bool = False          # ... because a newer snapcache wrote it (not damaged)

    def __str__(self) -> str:
        short = self.fingerprint[:12]
        if self.hit:
            which = f" version {self.version}" if self.version is not None else ""
            return (f"hit: the pipeline matches committed snapshot {short}{which} in "
                    f"{self.root} ({self.num_examples} examples); it will be read, not "
                    "recomputed")
        if self.delta is not None:
            return (f"delta: snapshot {short} in {self.root} has version {self.version}, built "
                    f"from other files; the next run builds version {self.version + 1}:\n"
                    f"  {self.delta}")
        lines = [f"miss: no committed snapshot {short} in {self.root}"]
        if self.state == "writing":
            lines.append(f"  snapshot {short} is being written (no manifest yet); iterating "
                         "waits for its commit")
        elif self.state == "abandoned":
            lines.append(f"  snapshot {short} was abandoned by its writer (no manifest); the "
                         "next run resumes it")
        elif self.state == "corrupt" and self.newer:
            lines.append(f"  snapshot {short} was written by a newer snapcache: {self.problem}. "
                         "It is not damaged: this release neither reads nor rebuilds it, and "
                         "the newer release reads it as it is")
        elif self.state == "corrupt":
            lines.append(f"  snapshot {short} exists but its manifest cannot be read: "
                         f"{self.problem or 'unreadable'}")
        if self.closest is None:
            lines.append("  the root holds no committed snapshot to compare with")
            return "\n".join(lines)
        name = f" ({self.closest_name})" if self.closest_name else ""
        lines.append(f"  closest: snapshot {self.closest[:12]}{name}, {alike(self.similarity)}; "
                     "it differs in:")
        lines.extend(f"  - {line}" for line in self.differences)
        return "\n".join(lines)


def alike(similarity: float) -> str:
    """How alike two different trees are, never "100%": they differ."""
    if similarity >= 1.0:
        return "the same values in another order or place"
    return f"{min(math.floor(similarity * 100), 99)}% alike"


def explain(tree: FingerprintNode, root: Storage) -> Explanation:
    """Compare the fingerprint ``tree`` of a pipeline with every snapshot in ``root``."""
    entries = scan(root)
    mine: Entry | None = next((e for e in entries if e.fingerprint == tree.digest), None)
    if mine is not None and mine.manifest is not None:
        return Explanation(root.url, tree.digest, hit=True, state="committed",
                           num_examples=mine.manifest.num_examples)
    best: tuple[float, Entry, FingerprintNode] | None = None
    for entry in entries:
        if entry.manifest is None or not entry.manifest.fingerprint_tree:
            continue
        try:
            other = FingerprintNode.from_json(entry.manifest.fingerprint_tree)
        except (KeyError, TypeError, ValueError):
            continue  # a tree we cannot read cannot explain anything
        score = closeness(other, tree)
        if best is None or score > best[0]:
            best = (score, entry, other)
    state = mine.state if mine is not None else "absent"
    why = dict(problem=mine.problem, newer=mine.newer) if mine is not None else {}
    if best is None:
        return Explanation(root.url, tree.digest, hit=False, state=state, **why)
    score, entry, other = best
    return Explanation(root.url, tree.digest, hit=False, state=state,
                       closest=entry.fingerprint,
                       closest_name=entry.manifest.name if entry.manifest else None,
                       similarity=score, differences=diff_trees(other, tree), **why)


def explain_delta(lineage: FingerprintNode, root: Storage, units) -> Explanation:
    """A delta snapshot (its ``lineage`` tree, the source's ``units``): a hit when a version was
    built from exactly these files; otherwise, if the lineage has a version, what the next run
    computes and reuses; otherwise the ordinary comparison with the root's snapshots."""
    from snapcache.pipeline.delta_plan import explain_delta as plan_delta

    storage = root.child(lineage.digest)
    hit, plan = plan_delta(storage, units)
    if hit is not None:
        return Explanation(root.url, lineage.digest, hit=True, state="committed",
                           num_examples=hit.num_examples, version=hit.version)
    if plan is not None:
        return Explanation(root.url, lineage.digest, hit=False, state="committed",
                           delta=plan.describe(), version=plan.base.version)
    return explain(lineage, root)
