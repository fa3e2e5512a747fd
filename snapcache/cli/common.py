"""What the admin subcommands share: the root option, consoles, cells, confirmation."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.text import Text

from snapcache.admin import SnapshotInfo
from snapcache.units import format_age

STATE_STYLES = {"committed": "green", "writing": "yellow", "abandoned": "magenta",
                "corrupt": "bold red", "newer format": "bold yellow"}


ROOT_HELP = ("snapshot root: a folder or fsspec URL such as s3://bucket/snaps "
             "(default: $SNAPCACHE_ROOT, else ~/.cache/snapcache)")


def add_root_option(parser: argparse.ArgumentParser, ids: str | None = None) -> None:
    """The root, the same way in every command: first positional or ``--root``; then the ids
    (``ids``: None for none, "one" (at most one) or "many"); and ``-o KEY=VALUE`` storage
    options.
    :func:`resolve_targets` sorts them out after parsing."""
    usage = {None: "[ROOT]", "one": "[ROOT] [ID]", "many": "[ROOT] [ID ...]"}[ids]
    parser.add_argument("targets", nargs="*", metavar=usage,
                        help=ROOT_HELP + ("" if ids is None else
                                          "; then snapshot id prefixes or names"))
    parser.add_argument("--root", metavar="ROOT", default=None, help="same as ROOT")
    parser.add_argument("-o", "--storage-option", metavar="KEY=VALUE", action="append",
                        default=[], dest="storage_option",
                        help="an fsspec storage option, repeatable: -o anon=true, "
                             "-o client_kwargs.endpoint_url=http://localhost:9000")
    parser.set_defaults(ids_kind=ids)


def looks_like_root(text: str) -> bool:
    """A path or URL rather than a snapshot id prefix or name."""
    return ("://" in text or "/" in text or os.sep in text or text.startswith(("~", "."))
            or os.path.isdir(text))


def resolve_targets(args: argparse.Namespace) -> None:
    """Set ``args.root``, ``args.ids`` and ``args.storage_options`` from the positionals,
    ``--root`` and ``-o`` (ValueError with a one-line hint on a mix-up)."""
    targets = list(args.targets)
    command, kind = args.command, args.ids_kind
    if targets and args.root is not None and targets[0] == args.root:
        targets.pop(0)  # the same root both ways
    elif targets and args.root is None and (kind is None or looks_like_root(targets[0])):
        args.root = targets.pop(0)
    if kind is None and targets:
        raise ValueError(f"two roots given: {targets[0]!r} and --root {args.root!r}; give "
                         "it once")
    for text in targets:
        if looks_like_root(text):
            raise ValueError(f"{text!r} looks like a path, not a snapshot id: the root comes "
                             f"first, once (`snapcache {command} ROOT {'ID' if kind == 'one' else '[ID ...]'}`"
                             " or --root ROOT)")
    if kind == "one" and len(targets) > 1:
        raise ValueError(f"`snapcache {command}` takes one snapshot id (or name) after the "
                         f"root; got {len(targets)} (see `snapcache ls`)")
    args.ids = targets
    args.storage_options = parse_storage_options(args.storage_option)


def root_hint(args: argparse.Namespace, error: Exception) -> str:
    """``error``'s message, and when the first id was looked up in the default root because
    it did not look like a path (``snapcache verify snpas``), the other reading: a root
    folder that does not exist (the unknown id's message is :func:`admin.inventory.find`'s)."""
    message = str(error) or type(error).__name__
    ids = getattr(args, "ids", None)
    if not ids or getattr(args, "root", "") is not None:
        return message
    first = ids[0]
    if isinstance(error, FileNotFoundError) or message.startswith(f"no snapshot {first!r}"):
        return f"{message}; if {first!r} is meant as a root folder, it does not exist"
    return message


def parse_storage_options(pairs: list[str]) -> dict:
    """``["anon=true", "client_kwargs.endpoint_url=http://h:9000"]`` -> nested options; values
    are JSON where they parse as JSON (true, 3, "x", {...}), else strings."""
    options: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-o takes KEY=VALUE; got {pair!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, last = key.strip().split(".")
        node = options
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"-o {pair!r}: {part!r} was already given a value")
        node[last] = value
    return options


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


def state_word(snap: SnapshotInfo) -> str:
    """The state as the tables show it: a manifest that a newer snapcache wrote is not damaged,
    so it shows as ``newer format``, not ``corrupt`` (``--json`` gives state ``corrupt`` and
    ``newer_format``: true, as :class:`SnapshotInfo` does)."""
    return "newer format" if snap.newer_format else snap.state


def state_cell(snap: SnapshotInfo) -> Text:
    word = state_word(snap)
    text = Text(word, style=STATE_STYLES.get(word, ""))
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
