"""How a user function's exception reaches the user: unchanged, with a note saying where."""

from __future__ import annotations


def annotate(error: BaseException, label: str, position: int) -> BaseException:
    """Add "in <op> at example <position>" to ``error`` (Python 3.11+ notes) and return it.

    The exception keeps its type and traceback, so ``except ValueError`` in user code still works.
    """
    note = f"snapcache: raised by {label} on example #{position} of this epoch"
    if hasattr(error, "add_note") and note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error
