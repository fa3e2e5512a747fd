"""The ``snapcache`` command line. The only place in snapcache that prints."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from snapcache.cli import common, info, ls, purge, verify
from snapcache.errors import SnapcacheError


def _cmd_demo(args: argparse.Namespace) -> int:
    from snapcache.cli import demo

    demo.run(root=args.root, num_examples=args.examples,
             storage_options=args.storage_options)
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from snapcache.cli.pipeline_ref import committed_since, import_warning, load_pipeline

    started = datetime.now(timezone.utc)
    dataset = load_pipeline(args.pipeline)  # imports the module: its top-level code runs
    explanation = dataset.explain(args.root, storage_options=args.storage_options or None)
    built = committed_since(explanation.root, started, args.storage_options or None)
    if built:
        print(f"snapcache explain: {import_warning(args.pipeline, built)}", file=sys.stderr)
    print(explanation)
    return 0 if explanation.hit else 1


def build_parser() -> argparse.ArgumentParser:
    from snapcache import __version__

    parser = argparse.ArgumentParser(
        prog="snapcache", description="Persistent preprocessing cache for ML input pipelines.")
    parser.add_argument("--version", action="version", version=f"snapcache {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an unexpected error")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (ls, info, verify, purge):
        module.add_parser(commands)
    demo = commands.add_parser(
        "demo", help="build a snapshot of a small pipeline and read it back, timing both epochs")
    common.add_root_option(demo)
    demo.add_argument("--examples", type=int, default=2000, help="number of examples")
    demo.set_defaults(handler=_cmd_demo)
    explain = commands.add_parser(
        "explain", help="say whether a pipeline hits a snapshot and, if not, what differs",
        description="Imports the module named by --pipeline (its top-level code runs: keep a "
                    "training loop under `if __name__ == \"__main__\":`). Exit status: 0 if "
                    "the pipeline hits a committed snapshot, 1 if it misses.")
    common.add_root_option(explain)
    explain.add_argument("--pipeline", required=True, metavar="MODULE:ATTR",
                         help="the Dataset to explain, e.g. train:dataset or train.py:build")
    explain.set_defaults(handler=_cmd_explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        if hasattr(args, "targets"):
            common.resolve_targets(args)
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (SnapcacheError, ValueError, OSError, ImportError) as e:
        return _error(args, common.root_hint(args, e))
    except Exception as e:  # e.g. a cloud client's credential error: one line, not a traceback
        if args.debug:
            raise
        return _error(args, f"{type(e).__name__}: {e} (--debug shows the traceback)")


def _error(args: argparse.Namespace, message: str) -> int:
    """Report ``message`` on one line of stderr; exit status 2."""
    line = " ".join(message.split())
    print(f"snapcache {args.command}: error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
