"""``snapcache verify [ID...]``: re-read every shard and check every checksum."""

from __future__ import annotations

import argparse
import sys
import time

from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

from snapcache.admin import VerifyProgress, VerifyReport, verify
from snapcache.cli import common
from snapcache.units import format_size


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "verify", help="re-read every shard and check sizes, checksums, rows and schema",
        description="Check every byte of the given snapshots (default: all committed ones) "
                    "against their manifests (of a delta snapshot: every version, with its "
                    "source record). Exit status: 0 if all match, 1 on any mismatch. A "
                    "snapshot that cannot be checked (being written, abandoned, or written by "
                    "a newer snapcache) is reported as skipped, not failed. A missing or "
                    "damaged page checksum file beside a sound shard (an index for reading "
                    "rows alone, not data) is reported without failing; --repair-index "
                    "rewrites it from the verified shard.")
    common.add_root_option(parser, ids="many")
    parser.add_argument("--repair-index", action="store_true",
                        help="rewrite missing or damaged page checksum files of sound shards")
    common.add_json_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if sys.stderr.isatty():
        with Progress(TextColumn("verifying {task.description}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(),
                      console=common.console(stderr=True), transient=True) as bar:
            task = bar.add_task("", total=None)

            def show(p: VerifyProgress) -> None:
                bar.update(task, completed=p.bytes_done, total=p.bytes_total,
                           description=p.snapshot.short_id)

            report = verify(args.root, args.ids, progress=show,
                            storage_options=args.storage_options,
                            repair_index=args.repair_index)
    else:
        report = verify(args.root, args.ids, progress=_PlainProgress(),
                        storage_options=args.storage_options, repair_index=args.repair_index)
    if args.json:
        common.print_json({
            "root": report.root, "ok": report.ok,
            "snapshots": [{"id": c.snapshot.id, "name": c.snapshot.name,
                           "ok": c.ok if c.checked else None, "skipped": c.skipped or None,
                           "shards_checked": c.shards_checked,
                           "bytes_checked": c.bytes_checked, "problems": list(c.problems),
                           "advice": c.advice or None,
                           "index_problems": list(c.index_problems),
                           "repaired": list(c.repaired)}
                          for c in report.checks]})
    else:
        print_report(report)
    return 0 if report.ok else 1


class _PlainProgress:
    """Progress as plain lines on stderr (at most one a second) when it is not a terminal."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, p: VerifyProgress) -> None:
        now = time.monotonic()
        if now - self._last < 1.0 and p.bytes_done < p.bytes_total:
            return
        self._last = now
        share = p.bytes_done / p.bytes_total if p.bytes_total else 1.0
        print(f"verifying {p.snapshot.short_id} {p.shard}: {format_size(p.bytes_done)} of "
              f"{format_size(p.bytes_total)} ({share:.0%})", file=sys.stderr, flush=True)


def print_report(report: VerifyReport) -> None:
    out = common.console()
    if not report.checks:
        out.print(f"nothing to verify: no committed snapshot in {report.root}")
        return
    several = len(report.failed) > 1
    for check in report.checks:
        snap = check.snapshot
        name = escape(f" ({snap.name})") if snap.name else ""
        if check.skipped:
            out.print(f"[yellow]skipped[/] {snap.short_id}{name}: {escape(check.skipped)}")
            continue
        status = "[green]ok[/]    " if check.ok else "[bold red]FAILED[/]"
        out.print(f"{status} {snap.short_id}{name}: {common.plural(check.shards_checked, 'shard')}, "
                  f"{format_size(check.bytes_checked)}")
        for problem in check.problems:
            out.print(f"         - {problem}", markup=False)
        if several and check.advice:
            out.print(f"         way out: {check.advice}", markup=False)
        for problem in check.index_problems:
            out.print(f"         [yellow]index[/] {escape(problem)}")
        for repair in check.repaired:
            out.print(f"         [green]repaired[/] {escape(repair)}")
    checked = [c for c in report.checks if c.checked]
    total = sum(c.bytes_checked for c in checked)
    skipped = len(report.skipped)
    not_checked = f"{common.plural(skipped, 'snapshot')} not checked (see above)"
    if report.ok:
        n = len(checked)
        if not n:
            out.print(f"nothing verified: {not_checked}")
            return
        what = "the snapshot matches its" if n == 1 else f"all {n:,} snapshots match their"
        out.print(f"{what} checksums ({format_size(total)} read)" +
                  (f"; {not_checked}" if skipped else ""))
        damaged = sum(len(c.index_problems) for c in report.checks)
        if damaged:
            out.print(f"[yellow]{common.plural(damaged, 'page checksum file')} missing or "
                      "damaged[/]: the data is sound; `snapcache verify --repair-index` "
                      "rewrites them from the verified shards")
    else:
        n = len(checked)
        what = "the snapshot failed" if n == 1 else f"{len(report.failed)} of {n:,} snapshots failed"
        if several:
            way = "the way out is under each"
        else:
            way = report.failed[0].advice or "see the problems above"
        out.print(f"[bold red]{what} verification[/]: {escape(way)}" +
                  (f"; {not_checked}" if skipped else ""))
