"""``snapcache info ID``: one snapshot's manifest in human form."""

from __future__ import annotations

import argparse
import sys

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from snapcache.admin import SnapshotInfo, info
from snapcache.admin.inventory import delta_versions, parse_time, source_files
from snapcache.admin.purge import describe_leases
from snapcache.cli import common
from snapcache.store.protocol.versions import shard_bytes
from snapcache.store.schema import Schema
from snapcache.units import format_size

MAX_SHARD_ROWS = 20


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "info", help="show one snapshot: schema, shards, fingerprint tree",
        description="Show one snapshot's manifest. ID is any unique prefix of its id (or its "
                    "name); without ID, ROOT may be one snapshot's folder or a root holding "
                    "only one snapshot.")
    common.add_root_option(parser, ids="one")
    parser.add_argument("--files", action="store_true",
                        help="delta snapshots: list the source files of the newest version")
    common.add_json_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    snap = info(args.root, args.ids[0] if args.ids else None,
                storage_options=args.storage_options)
    asked = getattr(args, "files", False)
    files = source_files(snap, args.storage_options) if asked else None
    if args.json:
        doc = snap.to_json()
        doc["manifest"] = snap.manifest.to_json() if snap.manifest is not None else None
        if asked:  # null: the snapshot records no source files (see the line on stderr)
            doc["files"] = files
        common.print_json(doc)
        if asked and files is None:
            print(no_files(snap), file=sys.stderr)
        return 0
    common.console().print(render(snap, args.storage_options))
    if files is not None:
        common.console().print(files_table(files))
    elif asked:
        common.console().print(no_files(snap), markup=False)
    return 0


def no_files(snap: SnapshotInfo) -> str:
    """Why ``--files`` lists nothing for ``snap``."""
    if snap.versions:  # a delta snapshot whose newest version cannot be read
        return (f"--files: snapshot {snap.short_id} has no readable version to list the source "
                f"files of (it is {snap.state})")
    return (f"--files: snapshot {snap.short_id} has no source file list: it is not a delta "
            "snapshot (only snapshots of from_files / from_parquet sources, built by file, "
            "record their source files)")


def files_table(files: list[dict]) -> Table:
    t = Table(title=f"source files ({len(files):,})", title_justify="left", box=None,
              header_style="bold", pad_edge=False)
    for column in ("FILE", "SIZE", "SEGMENT"):
        t.add_column(column, justify="right" if column != "FILE" else "left")
    for f in files:
        where = str(f["path"]) + (f"#{f['row_group']}" if f.get("row_group") is not None
                                  else "")
        t.add_row(Text(where), format_size(int(f.get("size") or 0)), str(f["segment"]))
    return t


def delta_rows(facts: Table, snap: SnapshotInfo, storage_options: dict | None) -> None:
    """A delta snapshot: its versions, the bytes they share, and its source in brief."""
    on_disk, shared = shard_bytes(delta_versions(snap, storage_options))
    numbers = ", ".join(str(v) for v in snap.versions)
    unreadable = [str(u.version) for u in snap.unreadable_versions]
    if unreadable:
        numbers += (f" (newest {snap.versions[-1]}; "
                    f"{'version' if len(unreadable) == 1 else 'versions'} "
                    f"{', '.join(unreadable)} unreadable: see problem)")
    else:
        numbers += f" (newest {snap.versions[-1]})"
    facts.add_row("versions", f"{numbers}; shards {format_size(on_disk)} on disk, "
                              f"{format_size(shared)} of them shared by several versions")
    m = snap.manifest
    source = (m.source or {}) if m is not None else {}
    segments = len(m.segments or ()) if m is not None else 0
    units = common.plural(int(source.get('units', 0)), 'file')
    if isinstance(source.get("files"), int):  # Parquet row groups as units
        units = (f"{common.plural(source['files'], 'file')}, "
                 f"{common.plural(int(source.get('units', 0)), 'row group')}")
    facts.add_row("source", f"{source.get('kind', '?')}: {units}, "
                            f"{format_size(int(source.get('bytes', 0)))}, "
                            f"{snap.num_examples or 0:,} examples in "
                            f"{common.plural(segments, 'segment')} (--files lists them)")


def render(snap: SnapshotInfo, storage_options: dict | None = None) -> Group:
    title = Text.assemble("snapshot ", (snap.short_id, "bold"),
                          f" ({snap.name})" if snap.name else "")
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("id", snap.id)
    facts.add_row("state", common.state_cell(snap))
    facts.add_row("location", Text(snap.url))
    if snap.problem:
        facts.add_row("problem", Text(snap.problem, style="red"))
    for old in snap.unreadable_versions:
        facts.add_row("problem", Text(f"version {old.version}: {old.problem}", style="red"))
    if snap.live_leases:
        facts.add_row("in use", describe_leases(snap.live_leases))
    m = snap.manifest
    size = format_size(snap.size_bytes)
    if m is None:
        facts.add_row("on disk", f"{size} in {common.plural(len(snap.files), 'file')}, "
                                 f"{common.plural(snap.num_shards, 'shard')}")
        facts.add_row("last change", common.when(snap.last_used))
        return Group(title, facts)
    facts.add_row("pipeline", Text(m.pipeline or "-"))
    if snap.versions:
        delta_rows(facts, snap, storage_options)
    facts.add_row("examples", f"{m.num_examples:,} in {common.plural(len(m.shards), 'shard')}")
    facts.add_row("on disk", f"{size} (shards {format_size(m.total_bytes)}, "
                             f"{m.compression}, ratio {common.ratio(snap)})")
    facts.add_row("created", f"{common.when(snap.created_at)}, committed "
                             f"{common.when(parse_time(m.committed_at))}")
    facts.add_row("last used", common.ago(snap.last_used))
    if m.key:
        facts.add_row("key", Text(m.key))
    writer = m.writer
    facts.add_row("writer", f"{writer.get('host', '?')} pid {writer.get('pid', '?')} "
                            f"run {writer.get('run_id', '?')}")
    facts.add_row("format", f"version {m.format_version}, snapcache {m.library_version}")
    parts: list = [title, facts, "", schema_table(m.schema), "", shard_table(m.shards)]
    if m.fingerprint_tree:
        parts += ["", fingerprint_tree(m.fingerprint_tree)]
    return Group(*parts)


def schema_table(schema_doc: dict | None) -> Table | str:
    if schema_doc is None:
        return "[bold]schema[/]: none (the snapshot is empty)"
    schema = Schema.from_json(schema_doc)
    t = Table(title=f"schema ({schema.structure})", title_justify="left", box=None,
              header_style="bold", pad_edge=False)
    for column in ("FIELD", "KIND", "DTYPE", "SHAPE"):
        t.add_column(column)
    for f in schema.fields:
        if f.kind == "tensor":
            dims = f.shape if f.shape is not None else (None,) * f.ndim
            shape = "(" + ", ".join("?" if d is None else str(d) for d in dims) + \
                ("," if len(dims) == 1 else "") + ")"
        else:
            shape = "-"
        kind = f.kind + (" (python)" if f.python else "")
        t.add_row(Text(f.name), kind, f.dtype or "-", shape)
    return t


def shard_table(shards) -> Table:
    t = Table(title=f"shards ({len(shards)})", title_justify="left", box=None,
              header_style="bold", pad_edge=False)
    t.add_column("#", justify="right")
    t.add_column("FILE")
    t.add_column("ROWS", justify="right")
    t.add_column("SIZE", justify="right")
    t.add_column("CHECKSUM")
    shown = list(enumerate(shards))
    if len(shown) > MAX_SHARD_ROWS:
        shown = shown[:MAX_SHARD_ROWS // 2] + [None] + shown[-MAX_SHARD_ROWS // 2:]
    for row in shown:
        if row is None:
            t.add_row("…", f"{len(shards) - MAX_SHARD_ROWS} more (--json lists all)", "", "", "")
            continue
        i, s = row
        t.add_row(str(i), s.path, f"{s.rows:,}", format_size(s.bytes), s.checksum)
    return t


def fingerprint_tree(doc: dict) -> Tree:
    def label(node: dict) -> str:
        summary = node.get("summary") or ""
        digest = str(node.get("digest", ""))[:8]
        text = f"{node.get('label', '?')}"
        if summary and summary != node.get("label"):
            text += f": {summary}"
        return f"{escape(text)} [dim]{digest}[/]"

    def grow(branch: Tree, node: dict) -> None:
        for child in node.get("children") or []:
            if isinstance(child, dict):
                grow(branch.add(label(child)), child)

    tree = Tree(f"[bold]fingerprint[/] {label(doc)}")
    grow(tree, doc)
    return tree

