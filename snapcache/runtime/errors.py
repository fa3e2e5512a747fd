"""How a user function's exception reaches the user: unchanged, with a note saying where (and,
for a write into a read-only array, why it is read-only and what to do).

Where: the runner of the op knows what its inputs are. Its ``locate(index, position)`` names
the example at input ``index`` of this run (by default "example #index of this epoch"): the
same number in the epoch whichever DataLoader worker, rank or Ray task ran it, where that is
known. Items that carry their own position (an ordered read's, see
:mod:`snapcache.pipeline.tagged`) have it recorded on the exception by the function's
wrapper (:func:`mark_position`), which works across processes too, and ``locate`` receives it.
Nothing of this runs until an exception does.
"""

from __future__ import annotations

from typing import Callable

Locate = Callable[[int, "int | None"], str]
"""``locate(index, position)``: the words naming the example at input ``index`` of an op's
run; ``position`` is what :func:`mark_position` recorded on the exception, or None."""

READ_ONLY_HINT = (
    ": it wrote into a read-only numpy array. The arrays a .snapshot() hands on are read-only "
    "in every epoch (later epochs read views of its stored shards; the writing epoch hands on "
    "read-only views too): copy an array before modifying it in place "
    "(x = np.array(e[\"x\"]) or e[\"x\"].copy()), or compute a new one "
    "(x = x + noise, not x += noise)")

_POSITION = "_snapcache_position"


def in_epoch(index: int, position: int | None = None) -> str:
    """The default :data:`Locate`: the input's index is its position in the epoch."""
    return f"example #{index} of this epoch"


def where(index: int, locate: Locate | None = None, error: BaseException | None = None) -> str:
    """The words naming the example at input ``index`` (see the module docstring)."""
    position = error.__dict__.pop(_POSITION, None) if error is not None else None
    return (locate or in_epoch)(index, position)


def mark_position(error: BaseException, position: int) -> None:
    """Record on ``error`` the position the failing item carried (read once, by
    :func:`annotate`). An attribute, so it is pickled with the exception from a worker
    process."""
    error.__dict__.setdefault(_POSITION, position)


def annotate(error: BaseException, label: str, index: int, locate: Locate | None = None
             ) -> BaseException:
    """Add "raised by <op> on <the example>" to ``error`` (Python 3.11+ notes) and return it;
    ``index`` is the failing input's index in this run of the op, named by ``locate``.

    The exception keeps its type and traceback, so ``except ValueError`` in user code still works.
    """
    note = f"snapcache: raised by {label} on {where(index, locate, error)}"
    if wrote_read_only(error):
        note += READ_ONLY_HINT
    if hasattr(error, "add_note") and note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error


def wrote_read_only(error: BaseException) -> bool:
    """Is ``error`` a refusal to write into a read-only numpy array: numpy's ValueError
    ("assignment destination is read-only", "output array is read-only", "array is read-only",
    "cannot set WRITEABLE flag to True of this array") or OpenCV's ("img marked as output
    argument, but provided NumPy array marked as readonly")?"""
    text = str(error)
    if isinstance(error, ValueError) and ("read-only" in text or "WRITEABLE flag" in text):
        return True
    return "NumPy array marked as readonly" in text
