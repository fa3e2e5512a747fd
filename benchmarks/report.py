"""What every benchmark shares: its command line, its section of docs/benchmarks.md, and how a
target reads.

Each benchmark owns one section of the doc, between ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` (:func:`markers`); it prints the section and writes it there when asked
(:func:`command_line` adds the flag, :func:`publish` does both). A target is one row of a
``| target | measured | |`` table whose last cell is :func:`verdict`.

    parser = command_line(__doc__, scale=1.0)
    args = parser.parse_args(argv)
    ...
    publish(section, *markers("codecs-benchmark"), write=args.write)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md")


def markers(name: str) -> tuple[str, str]:
    """The (start, end) markers of section ``name`` in docs/benchmarks.md."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def command_line(doc: str | None, *, scale: float | None = None,
                 writes_by_default: bool = False) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc`` with the options every benchmark has:
    ``--scale`` (when ``scale`` is a default size) and either ``--write-doc`` or, for
    benchmarks that write their section unless told not to, ``--no-write``; both set
    ``args.write``."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0]
                                     if doc else None)
    if scale is not None:
        parser.add_argument("--scale", type=float, default=scale,
                            help=f"size of the workloads against the documented run (default "
                                 f"{scale:g})")
    if writes_by_default:
        parser.add_argument("--no-write", dest="write", action="store_false",
                            help="print the section instead of writing docs/benchmarks.md")
    else:
        parser.add_argument("--write-doc", dest="write", action="store_true",
                            help="write the section into docs/benchmarks.md")
    return parser


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**MISSED**"


def target_rows(targets: Iterable[tuple[str, str, bool | None]]) -> list[str]:
    """A target table: one ``(target, measured, ok)`` a row; ``ok`` None when it could not be
    measured (a run failed or a peer is missing), which reads as missed."""
    lines = ["| target | measured | |", "|---|---|---|"]
    for what, measured, ok in targets:
        lines.append(f"| {what} | {measured} | {verdict(bool(ok))} |")
    return lines


def load_average() -> str:
    """The 1-minute load average, to print next to numbers measured on a shared machine."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def write_doc(section: str, start: str, end: str) -> None:
    """Put ``section`` (which begins with ``start`` and ends with ``end``) in docs/benchmarks.md,
    replacing the one there, or append it."""
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(DOC, "w") as f:
        f.write(text)


def publish(section: str, start: str, end: str, *, write: bool) -> None:
    """Print ``section`` and, if ``write``, put it in docs/benchmarks.md."""
    print(section)
    if write:
        write_doc(section, start, end)
