"""``snapcache ls [ROOT]``: one row per snapshot folder, totals at the bottom."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from snapcache.admin.inventory import describe, locate, scan
from snapcache.cli import common
from snapcache.units import format_names, format_size


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "ls", help="list the snapshots in a root: state, size, last use, pipeline",
        description="List every snapshot folder in ROOT: committed snapshots, most recently "
                    "used first, then writes in progress, abandoned writes and corrupt ones. "
                    "One snapshot's folder given as ROOT lists that snapshot.")
    common.add_root_option(parser)
    common.add_json_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    storage, own = locate(args.root, args.storage_options)
    snaps = [describe(storage.child(own), own)] if own else scan(storage)
    if args.json:
        common.print_json({
            "root": storage.url,
            "snapshots": [s.to_json() for s in snaps],
            "totals": {"snapshots": len(snaps),
                       "num_examples": sum(s.num_examples or 0 for s in snaps),
                       "num_shards": sum(s.num_shards for s in snaps),
                       "size_bytes": sum(s.size_bytes for s in snaps),
                       "tmp_files": sum(s.tmp_files for s in snaps)},
        })
        return 0
    out = common.console()
    if own:
        out.print(f"{storage.url}/{own} is the folder of one snapshot, in root {storage.url}",
                  markup=False)
    elif not snaps:
        out.print(f"no snapshots in {storage.url}", markup=False)
        return 0
    else:
        out.print(f"snapshots in {storage.url}", markup=False)
    out.print(table(snaps))
    garbage = [s for s in snaps if s.state == "abandoned" and not s.leased and
               not (s.foreign_files and s.link_target is None)]
    if garbage:
        size = format_size(sum(s.size_bytes for s in garbage))
        out.print(f"abandoned writes hold {size} ({common.plural(len(garbage), 'folder')}): "
                  "`snapcache purge --incomplete` reclaims it")
    tmp = sum(s.tmp_files for s in snaps)
    if tmp:
        out.print(f"{common.plural(tmp, 'temporary file')} (being written, or left by a killed "
                  "writer): `snapcache purge --incomplete` removes the stale ones")
    for snap in snaps:
        if snap.link_target is not None:
            out.print(f"{snap.short_id} is a symbolic link to {snap.link_target}: its bytes are "
                      "outside the root (purge removes only the link)", markup=False)
        elif snap.foreign_files:
            names = snap.foreign_files
            out.print(f"{snap.short_id} holds {common.plural(len(names), 'file')} snapcache "
                      f"does not write ({format_names(names)}): purge leaves it alone",
                      markup=False)
    corrupt = [s for s in snaps if s.state == "corrupt"]
    for snap in corrupt:
        if snap.newer_format:  # unreadable here, not damaged
            out.print(Text.assemble(("newer format", "bold yellow"),
                                    f" {snap.short_id}: {snap.problem}. It is not damaged: "
                                    "purging it would delete the newer release's snapshot"))
        else:
            out.print(Text.assemble(("corrupt", "bold red"),
                                    f" {snap.short_id}: {snap.problem}"))
    for snap in snaps:  # a delta snapshot whose newest version reads, but an old one does not
        for old in snap.unreadable_versions:
            if old.newer:  # unreadable here, not damaged
                out.print(Text.assemble(("newer format", "bold yellow"),
                                        f" version {old.version} of {snap.short_id}: "
                                        f"{old.problem}. It is not damaged"))
            else:
                out.print(Text.assemble(("unreadable version", "bold red"),
                                        f" {old.version} of {snap.short_id}: {old.problem}"))
    return 0


def table(snaps) -> Table:
    states = {}
    for snap in snaps:
        word = common.state_word(snap)
        states[word] = states.get(word, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in states.items())
    t = Table(show_footer=True, box=None, header_style="bold", footer_style="bold", pad_edge=False)
    t.add_column("ID", footer=f"{len(snaps)} total", no_wrap=True)
    t.add_column("NAME", no_wrap=True, max_width=24, overflow="ellipsis")
    t.add_column("STATE", footer=summary, no_wrap=True)
    t.add_column("EXAMPLES", justify="right",
                 footer=common.count(sum(s.num_examples or 0 for s in snaps)))
    t.add_column("SHARDS", justify="right", footer=common.count(sum(s.num_shards for s in snaps)))
    t.add_column("SIZE", justify="right", footer=format_size(sum(s.size_bytes for s in snaps)),
                 no_wrap=True)
    t.add_column("RATIO", justify="right")
    t.add_column("CREATED", no_wrap=True)
    t.add_column("LAST USED", no_wrap=True)
    t.add_column("PIPELINE", no_wrap=True, max_width=48, overflow="ellipsis")
    for s in snaps:
        t.add_row(s.short_id, Text(s.name or "-"), common.state_cell(s), common.count(s.num_examples),
                  str(s.num_shards), format_size(s.size_bytes), common.ratio(s),
                  common.when(s.created_at), common.ago(s.last_used), Text(s.pipeline or "-"))
    return t
