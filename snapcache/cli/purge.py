"""``snapcache purge``: delete snapshots by age, size budget, abandoned writes or id."""

from __future__ import annotations

import argparse
import sys

from rich.table import Table
from rich.text import Text

from snapcache.admin import PurgeReport, parse_duration, parse_size, purge
from snapcache.cli import common
from snapcache.units import format_size


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "purge", help="delete snapshots: old, over a size budget, abandoned, or by id",
        description="Delete the snapshots selected by any of the options or ids. Snapshots "
                    "being read or written (a live lease) are kept unless --force. Exit status: "
                    "0 when everything selected was deleted, 1 when something selected was "
                    "kept or the size budget cannot be met, 2 on bad input.")
    common.add_root_option(parser, ids="many")
    parser.add_argument("--older-than", metavar="AGE",
                        help="snapshots not used for AGE, e.g. 7d, 12h, 30m, 90s")
    parser.add_argument("--max-size", metavar="SIZE",
                        help="delete least recently used snapshots until the root holds at "
                             "most SIZE, e.g. 200GB, 1.5TiB, 500MB")
    parser.add_argument("--abandoned", "--incomplete", action="store_true", dest="incomplete",
                        help="abandoned writes: no manifest and no live lease (state "
                             "'abandoned' in `snapcache ls`)")
    parser.add_argument("--old-versions", action="store_true",
                        help="delta snapshots: delete every version but the newest (shards "
                             "the newest version shares stay)")
    parser.add_argument("--dry-run", action="store_true",
                        help="show what would be deleted and the space it frees; delete nothing")
    parser.add_argument("--force", action="store_true",
                        help="delete even snapshots with a live read or write lease")
    parser.add_argument("-y", "--yes", action="store_true",
                        help="do not ask before deleting more than one snapshot")
    common.add_json_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.older_than is not None:
        parse_duration(args.older_than)  # fail on a bad value before touching storage
    if args.max_size is not None:
        parse_size(args.max_size)
    if not (args.ids or args.older_than or args.max_size or args.incomplete or
            args.old_versions):
        raise ValueError("say what to purge: snapshot ids, --older-than AGE, --max-size SIZE, "
                         "--incomplete or --old-versions (add --dry-run to see what would go)")
    criteria = dict(ids=args.ids, older_than=args.older_than, max_size=args.max_size,
                    incomplete=args.incomplete, old_versions=args.old_versions,
                    force=args.force)
    plan = purge(args.root, storage_options=args.storage_options, dry_run=True, **criteria)
    if args.dry_run:
        show(plan, json_output=args.json)
        return 0
    count = len(plan.deleted)
    if count > 1 and not args.yes:
        if not sys.stdin.isatty():
            raise ValueError(f"this would delete {count} snapshots "
                             f"({format_size(plan.freed_bytes)}); pass --yes to confirm, or "
                             "--dry-run to list them")
        show(plan, json_output=False)
        if not common.confirm(f"Delete these {count} snapshots?"):
            print("nothing deleted", file=sys.stderr)
            return 1
    # Exactly what was planned (and confirmed), each still selected, leases checked again:
    # never what was selected only since (a writer that died while the question was asked).
    report = purge(args.root, storage_options=args.storage_options, plan=plan, **criteria)
    show(report, json_output=args.json)
    return 0 if not report.kept and report.budget_met is not False else 1


def show(report: PurgeReport, *, json_output: bool) -> None:
    if json_output:
        def items(seq):
            return [{**item.snapshot.to_json(), "reason": item.reason} for item in seq]

        common.print_json({
            "root": report.root, "dry_run": report.dry_run,
            "deleted": items(report.deleted), "kept": items(report.kept),
            "tidied": list(report.tidied), "freed_bytes": report.freed_bytes,
            "size_before": report.size_before, "size_after": report.size_after,
            "max_size": report.max_size, "budget_met": report.budget_met,
            "aborted_uploads": list(report.aborted_uploads),
            "old_versions": [{"id": old.snapshot.id, "name": old.snapshot.name,
                              "versions": list(old.versions), "newest": old.newest,
                              "files": list(old.files), "bytes": old.bytes}
                             for old in report.old_versions]})
        return
    out = common.console()
    verb = "would delete" if report.dry_run else "deleted"
    if report.deleted:
        out.print(f"{verb} {common.plural(len(report.deleted), 'snapshot')} from {report.root}",
                  markup=False)
        out.print(table(report.deleted))
    if report.kept:
        out.print(f"kept {common.plural(len(report.kept), 'selected snapshot')}")
        out.print(table(report.kept))
    remove = "would remove" if report.dry_run else "removed"
    for old in report.old_versions:
        s = old.snapshot
        numbers = ", ".join(str(v) for v in old.versions)
        out.print(f"{remove} {'version' if len(old.versions) == 1 else 'versions'} {numbers} "
                  f"of {s.short_id}" + (f" ({s.name})" if s.name else "") +
                  f": {common.plural(len(old.files), 'file')}, {format_size(old.bytes)}; "
                  f"version {old.newest}, the newest, stays", markup=False)
    versions_bytes = sum(old.bytes for old in report.old_versions)
    leftovers = len(report.tidied) - sum(len(old.files) for old in report.old_versions)
    if leftovers:
        out.print(f"{remove} {common.plural(leftovers, 'leftover file')} of committed "
                  f"snapshots ({format_size(report.tidied_bytes - versions_bytes)})")
    for upload in report.aborted_uploads:
        out.print(f"{'would abort' if report.dry_run else 'aborted'} abandoned upload {upload}",
                  markup=False)
    if not report.deleted and not report.tidied:
        if not report.kept and not report.aborted_uploads:
            out.print(f"nothing to purge in {report.root}", markup=False)
    else:
        freed = report.freed_bytes
        out.print(f"{'would free' if report.dry_run else 'freed'} {format_size(freed)} "
                  f"({freed:,} bytes): {format_size(report.size_before)} -> "
                  f"{format_size(report.size_after)}")
    if report.budget_met is False:
        out.print(f"[bold red]cannot get under {format_size(report.max_size)}[/]: "
                  f"{format_size(report.size_after)} would remain (snapshots in use are kept; "
                  "--force deletes them too)")


def table(items) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "NAME", "STATE", "SIZE", "LAST USED", "WHY"):
        t.add_column(column, no_wrap=column != "WHY",
                     justify="right" if column == "SIZE" else "left")
    for item in items:
        s = item.snapshot
        t.add_row(s.short_id, Text(s.name or "-"), common.state_cell(s),
                  format_size(s.size_bytes), common.ago(s.last_used), Text(item.reason))
    return t
