"""The ``snapcache`` command line. The only place in snapcache that prints."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args: argparse.Namespace) -> int:
    from snapcache.cli import demo

    demo.run(root=args.root, num_examples=args.examples)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from snapcache import __version__

    parser = argparse.ArgumentParser(
        prog="snapcache", description="Persistent preprocessing cache for ML input pipelines.")
    parser.add_argument("--version", action="version", version=f"snapcache {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="build a snapshot of a small pipeline and read it back, timing both epochs")
    demo.add_argument("--root", help="snapshot root to use (default: a temporary folder)")
    demo.add_argument("--examples", type=int, default=2000, help="number of examples")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
