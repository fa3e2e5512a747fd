"""What the admin subcommands share: the root option, consoles, cells, confirmation."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.text import Text

from snapcache.admin import SnapshotInfo
from snapcache.admin.units import format_age

STATE_STYLES = {"committed": "green", "writing": "yellow", "abandoned": "magenta",
                "corrupt": "bold red"}


def add_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", metavar="ROOT", default=None,
        help="snapshot root: a folder or fsspec URL such as s3://bucket/snaps "
             "(default: $SNAPCACHE_ROOT, else ~/.cache/snapcache)")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print machine-readable JSON on stdout instead of a table")


def console(stderr: bool = False) -> Console:
    """A rich console on a terminal; elsewhere (a pipe, a file) a plain one that wraps neither
    text nor tables and pads no line with trailing spaces."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(file=stream, highlight=False)
    return _PlainConsole(file=stream, width=200, highlight=False, color_system=None,
                         soft_wrap=True)


class _PlainConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:
        with self.capture() as captured:
            super().print(*objects, **kwargs)
        text = "\n".join(line.rstrip() for line in captured.get().splitlines())
        self.file.write(text + "\n")
        self.file.flush()


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def state_cell(snap: SnapshotInfo) -> Text:
    text = Text(snap.state, style=STATE_STYLES.get(snap.state, ""))
    if snap.live_leases and snap.state != "writing":
        kinds = sorted({lease.kind for lease in snap.live_leases})
        text.append(f" ({'/'.join('being ' + ('read' if k == 'read' else 'written') for k in kinds)})",
                    style="yellow")
    if snap.corrupt_leases:
        text.append(" (corrupt lease)", style="red")
    return text


def when(moment: datetime | None) -> str:
    """Local time to the minute."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else "?"


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "?"
    return format_age((datetime.now(timezone.utc) - moment).total_seconds())


def ratio(snap: SnapshotInfo) -> str:
    return f"{snap.compression_ratio:.1f}x" if snap.compression_ratio else "-"


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def confirm(question: str) -> bool:
    """Ask on the terminal; False on anything but yes (or end of input)."""
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
