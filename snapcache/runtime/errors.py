"""How a user function's exception reaches the user: unchanged, with a note saying where (and,
for a write into a read-only array, why it is read-only and what to do)."""

from __future__ import annotations

READ_ONLY_HINT = (
    ": it wrote into a read-only numpy array. The arrays a .snapshot() hands on are read-only "
    "in every epoch (later epochs read views of its stored shards; the writing epoch hands on "
    "read-only views too): copy an array before modifying it in place "
    "(x = np.array(e[\"x\"]) or e[\"x\"].copy()), or compute a new one "
    "(x = x + noise, not x += noise)")


def annotate(error: BaseException, label: str, position: int) -> BaseException:
    """Add "in <op> at example <position>" to ``error`` (Python 3.11+ notes) and return it.

    The exception keeps its type and traceback, so ``except ValueError`` in user code still works.
    """
    note = f"snapcache: raised by {label} on example #{position} of this epoch"
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
