"""From op specs to running iterators, and from upstream ops to fingerprints.

``iterate(op, epoch)`` builds the generator chain for one epoch, each op by the runner its
module registered (see :mod:`snapcache.pipeline.ops`). At a snapshot op the graph is cut: the
upstream part is fingerprinted; if ``<root>/<fingerprint>/`` holds a committed snapshot it is
read instead of running the upstream ops, otherwise the upstream runs and its examples are
teed into a :class:`~snapcache.store.writer.SnapshotWriter`, committed when the epoch ends.

Fingerprints are taken once per pipeline object: the first time a snapshot op (or a
``Dataset``'s last op) is fingerprinted, the tree is kept on that op object and reused by its
later epochs, ``ds.fingerprint()`` and ``explain()``. A new pipeline built from changed code or
data is a new op object, fingerprinted afresh.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator

from snapcache.errors import StoreError
from snapcache.fingerprint import FingerprintNode
from snapcache.fingerprint.tree import combine, leaf, pipeline_root
from snapcache.pipeline import ops
from snapcache.pipeline.snapshot_exec import check_root, run_snapshot
from snapcache.pipeline.streams import StreamSpec
from snapcache.store.fs import normalized_url

if TYPE_CHECKING:
    from snapcache.store.fs import Storage
    from snapcache.store.manifest import Manifest


# -- fingerprints ------------------------------------------------------------------------------
def labelled_ops(op: ops.Op, after: ops.Op | None = None) -> list[tuple[str, ops.Op]]:
    """The content ops from the source to ``op`` with their human labels
    ("source", "map #1 `decode`", ...); with ``after`` (an op of the lineage), only those
    after it, numbered from there."""
    labelled = []
    position = 0
    lineage = ops.lineage(op)
    if after is not None:
        lineage = lineage[next(i for i, node in enumerate(lineage) if node is after) + 1:]
    for node in lineage:
        if not node.content:
            continue
        if node.traits.source:
            labelled.append(("source", node))
        else:
            position += 1
            labelled.append((f"{node.kind} #{position}" + _named(node), node))
    return labelled


def stage_labels(op: ops.Op) -> list[str]:
    """One label per op from the source to ``op``, what ``Dataset.stats()`` names its stages:
    a content op's label from :func:`labelled_ops` ("map #1 `decode`"), with its arguments
    when it applies no function ("batch #3 (16)"); the source and the ops that do not change
    the examples by their description ("range(0, 200)", "snapshot('/data/snaps')")."""
    labels = {node: label for label, node in labelled_ops(op) if not node.traits.source}
    described = []
    for node in ops.lineage(op):
        label = labels.get(node)
        if label is None:
            described.append(node.describe())
            continue
        arguments = node.describe()[len(node.kind):] if node.function is None else ""
        described.append(label + (f" {arguments}" if arguments not in ("", "()") else ""))
    return described


def _named(node: ops.Op) -> str:
    fn = node.function
    return f" `{ops.callable_name(fn)}`" if fn is not None else ""


def pipeline_fingerprint(op: ops.Op) -> FingerprintNode:
    """The fingerprint tree of everything up to and including ``op`` (taken once per op
    object, see the module docstring)."""
    if isinstance(op, ops.SnapshotOp):
        return snapshot_tree(op)  # a snapshot adds no content: its upstream's tree, or its key
    return op.memo("pipeline_fingerprint", lambda: _pipeline_fingerprint(op))


def _pipeline_fingerprint(op: ops.Op) -> FingerprintNode:
    """The tree of the content ops up to ``op``. A snapshot with a user's ``key`` below ``op``
    stands for everything up to it: the key names the version of its upstream (a new key, new
    data), which is not looked at (it may not be hashable at all, the reason for a key)."""
    keyed = next((node for node in reversed(ops.lineage(op))
                  if isinstance(node, ops.SnapshotOp) and node.options.key), None)
    nodes = []
    if keyed is not None:  # the keyed snapshot: its key, in its root (one key, two roots:
        # two datasets versioned alike, e.g. /snaps/train and /snaps/val, both key="v1")
        nodes.append(combine("snapshot key", [
            keyed_fingerprint(keyed.options.key),
            leaf("root", "root", normalized_url(keyed.path).encode(),
                 summary=os.fspath(keyed.path))],
            kind="keyed-below"))
    # the ops after it, numbered from it: ops added below it change nothing here
    nodes += [combine(label, node.fingerprint_children(label), kind=f"op:{node.kind}",
                      summary=node.describe())
              for label, node in labelled_ops(op, after=keyed)]
    return pipeline_root(nodes)


def keyed_fingerprint(key: str) -> FingerprintNode:
    """A user-named version replaces the computed fingerprint (``snapshot(path, key=...)``)."""
    return combine("snapshot key", [leaf("key", "user-key", key.encode(), summary=key)],
                   kind="keyed")


def snapshot_tree(op: ops.SnapshotOp) -> FingerprintNode:
    """What a snapshot op keys on: the user's ``key``, else its upstream pipeline (taken once
    per snapshot op object)."""
    if op.parent is None:
        raise TypeError("a snapshot op needs an upstream pipeline")
    if op.options.key:
        return keyed_fingerprint(op.options.key)
    return op.memo("snapshot_tree", lambda: _pipeline_fingerprint(op.parent))


def delta_source(op: ops.SnapshotOp) -> ops.Op | None:
    """The file source a delta snapshot op builds unit by unit, or None when ``op`` is an
    ordinary snapshot: ``delta=False``, a ``key``, an upstream that is not a unit source
    followed by element-wise ops, or (``delta=None``, the default) an ordinary snapshot of
    exactly this pipeline already committed by an earlier release (:func:`reads_legacy`)."""
    if op.options.delta is False or op.options.key or op.parent is None:
        return None
    source = ops.delta_source(op.parent)
    if source is None or op.options.delta is True:
        return source
    return None if reads_legacy(op, source) else source


def delta_units(op: ops.SnapshotOp, source: ops.Op) -> Any:
    """The units of a delta snapshot op's ``source`` (taken once per source op object;
    identities that cost reads, Parquet row groups, reuse the lineage's newest version's)."""
    from snapcache.pipeline.delta_plan import source_units
    from snapcache.store.fs import Storage

    return source_units(source, lambda: Storage(op.path, op.options.storage_options).child(
        lineage_tree(op).digest))


def reads_legacy(op: ops.SnapshotOp, source: ops.Op) -> bool:
    """Migration (docs/format.md, "Delta by default"): a pipeline that may be built as a delta
    snapshot but did not ask for it (``delta=None``) keeps reading the ordinary snapshot an
    earlier release committed for exactly its files (``<root>/<fingerprint>/manifest.json``),
    unless its lineage already holds a version of these files. Decided once per snapshot op
    object, like its fingerprint; only looked up when no version matches (the full per-file
    fingerprint is taken then)."""
    def decide() -> bool:
        from snapcache.store import layout
        from snapcache.store.fs import Storage
        from snapcache.store.protocol import versions

        root = Storage(op.path, op.options.storage_options)
        digest = lineage_tree(op).digest
        others = [n for n in root.listdir() if layout.is_fingerprint(n) and n != digest]
        if not others:  # nothing an earlier release made here
            return False
        if versions.find_version(root.child(digest), delta_units(op, source).digest):
            return False
        legacy = snapshot_tree(op).digest
        return legacy in others and root.child(legacy).exists(layout.MANIFEST)

    return op.memo("reads_legacy", decide)


def lineage_tree(op: ops.SnapshotOp) -> FingerprintNode:
    """What a delta snapshot's lineage folder is named by: the upstream's code, captured values
    and parameters, with its file source counted by kind, not by files (taken once per op)."""
    def compute() -> FingerprintNode:
        nodes = []
        for label, node in labelled_ops(op.parent):
            children = node.lineage_children(label) if node.traits.source else \
                node.fingerprint_children(label)
            nodes.append(combine(label, children, kind=f"op:{node.kind}", summary=(
                f"{node.kind}(files, by unit)" if node.traits.source else node.describe())))
        return pipeline_root(nodes)

    return op.memo("lineage_tree", compute)


def snapshot_id(op: ops.SnapshotOp) -> str:
    """The id iterator states record (``Manifest.snapshot_id`` of what ``op`` reads): cheap
    for a delta snapshot (its lineage and the digest of its files, no per-file tree)."""
    source = delta_source(op)
    if source is None:
        return snapshot_tree(op).digest
    return f"{lineage_tree(op).digest}:{delta_units(op, source).digest}"


def committed_snapshot(op: ops.SnapshotOp) -> "tuple[Storage, Manifest | None]":
    """Where ``op``'s snapshot lives and its committed manifest, if any: ``manifest.json`` of
    its fingerprint's folder, or for a delta snapshot the version built from exactly the
    pipeline's files."""
    from snapcache.store.protocol import versions
    from snapcache.store.manifest import load_manifest

    root = check_root(op)  # StoreError at once if the root is a file
    source = delta_source(op)
    if source is None:
        storage = root.child(snapshot_tree(op).digest)
        return storage, load_manifest(storage)
    storage = root.child(lineage_tree(op).digest)
    return storage, versions.find_version(storage, delta_units(op, source).digest)


def snapshot_folder(op: ops.SnapshotOp) -> "Storage":
    """Where ``op``'s snapshot lives (a delta snapshot: its lineage folder), without reading
    its manifest."""
    from snapcache.pipeline.snapshot_exec import check_root

    root = check_root(op)
    source = delta_source(op)
    return root.child((snapshot_tree(op) if source is None else lineage_tree(op)).digest)


def commit_name(op: ops.SnapshotOp) -> str | None:
    """The name of the manifest a read of ``op``'s snapshot reads: ``manifest.json``, or a
    delta snapshot's version ``manifest-<v>.json``; None while it is not committed."""
    from snapcache.store import layout
    from snapcache.store.protocol import versions

    _, manifest = committed_snapshot(op)
    if manifest is None:
        return None
    return layout.MANIFEST if manifest.version is None else versions.manifest_name(
        manifest.version)


def known_length(op: ops.Op) -> int | None:
    """Items one epoch of the pipeline up to ``op`` yields, when knowable without running it:
    each op's length rule (:func:`ops.known_length`) from the source down, except that a
    committed snapshot gives its example count in place of its upstream's. An epoch reads the
    committed snapshot, not the upstream: with ``key=`` the source may have grown or shrunk
    since it was written, and an upstream with a filter has no length rule at all. Reads the
    committed manifest of such snapshots only (fingerprinting its upstream first, as its first
    epoch would)."""
    n: int | None = None
    for node in ops.lineage(op):
        # Without a key a committed snapshot holds what its upstream's rules count: its
        # manifest is read only where they count nothing (a filter) or a key stands in.
        if isinstance(node, ops.SnapshotOp) and (n is None or node.options.key):
            try:
                _, manifest = committed_snapshot(node)
            except StoreError:  # damaged, newer, unreachable: the epoch says (or rebuilds it)
                manifest = None
            if manifest is not None:
                n = manifest.num_examples
                continue
        n = node.length(n)
    return n


def last_snapshot(op: ops.Op) -> ops.SnapshotOp | None:
    """The snapshot op closest to ``op`` in its lineage, if any."""
    for node in reversed(ops.lineage(op)):
        if isinstance(node, ops.SnapshotOp):
            return node
    return None


def describe_pipeline(op: ops.Op) -> str:
    return " -> ".join(node.describe() for node in ops.lineage(op))


# -- execution ---------------------------------------------------------------------------------
def iterate(op: ops.Op, epoch: int, stream: StreamSpec | None = None) -> Iterator[Any]:
    """A fresh iterator over one epoch of the pipeline ending at ``op``; with ``stream``,
    only that stream's share of the examples (see :mod:`snapcache.pipeline.streams`)."""
    return ops.run(op, epoch, stream)


@ops.runs(ops.SnapshotOp)
def _run_snapshot(op: ops.SnapshotOp, epoch: int) -> Iterator[Any]:
    check_root(op)  # StoreError at once for a root that is a file or lies under one
    source = delta_source(op)
    if source is not None:
        from snapcache.pipeline.delta_exec import run_delta

        return run_delta(op, epoch, source=source, lineage=lineage_tree(op),
                         describe=describe_pipeline(op.parent))
    return run_snapshot(op, epoch, iterate, tree=snapshot_tree(op),
                        labelled=labelled_ops(op), describe=describe_pipeline(op.parent))


# The snapshot-aware runners of batch and shuffle (whole-column reads of a committed snapshot).
from snapcache.pipeline import runners  # noqa: E402
