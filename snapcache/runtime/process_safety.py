"""What keeps a process-pool map safe when things go wrong (used by :mod:`.process`).

- **Workers die with their parent.** Each worker watches the process that started the map
  (a pidfd on Linux, else polling) from a daemon thread; when it is gone (even SIGKILLed) the
  worker removes the shared-memory segments of that map and exits. The fork server exits by
  itself when its parent's end of its "alive" pipe closes, and the resource tracker when the
  last process holding its pipe is gone, so nothing of a map outlives its parent.
- **A failure names its example.** The worker catches what the user function raises and
  sends back its position, its traceback as text, and the exception itself when it survives a
  pickle round trip; when it does not (an exception class that cannot be rebuilt, or one that
  holds a lock), the parent raises :class:`~snapcache.errors.UserFunctionError` with the type,
  message and traceback, saying why the exception itself could not travel. Before each example
  a worker writes its position into a small status file, so a worker killed by a signal is
  reported as "worker died: signal N while computing example #K".
- **A script without a main guard** is refused before any worker starts, with the fix: with
  the fork server (and spawn) each worker imports the main script, which would start the map
  again at import and fail with multiprocessing's bootstrapping error.
"""

from __future__ import annotations

import ast
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback

from snapcache.errors import UserFunctionError
from snapcache.machine import pid_alive
from snapcache.runtime.errors import Locate, annotate, where

SHM_DIR = "/dev/shm"


# -- main guard ------------------------------------------------------------------------------
def check_main_guard() -> None:
    """Raise RuntimeError if the main thread is running the top level of a ``__main__`` script
    outside ``if __name__ == "__main__":``: every worker would run the script again."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or getattr(main, "__spec__", None) is not None:
        return  # interactive, -c, -m: nothing is re-imported by path
    frame = sys._current_frames().get(threading.main_thread().ident)
    line = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return
    if not _inside_main_guard(tree, line):
        raise RuntimeError(
            f"map(executor='process') was started from the top level of the script {path} "
            f"(line {line}), outside `if __name__ == \"__main__\":`. Each worker process "
            "imports the script, which would start the map again; put the code that runs the "
            "pipeline under `if __name__ == \"__main__\":` (or use executor='thread')")


def _is_main_test(node: ast.expr) -> bool:
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or \
            not isinstance(node.ops[0], ast.Eq):
        return False
    sides = [node.left, node.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _inside_main_guard(tree: ast.Module, line: int) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
                return True
    return False


# -- worker side -----------------------------------------------------------------------------
_status: dict[str, int] = {}   # map prefix -> fd of this worker's status file


def watch_parent(parent: int, prefix: str) -> None:
    """Worker initializer: exit (removing the map's segments) once ``parent`` is gone."""
    threading.Thread(target=_watch, args=(parent, prefix), name="snapcache-parent-watch",
                     daemon=True).start()


def _watch(parent: int, prefix: str) -> None:
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])     # readable when the process has exited
    else:
        while pid_alive(parent):
            time.sleep(1.0)
    sweep(prefix)
    os._exit(70)


def mark(prefix: str, position: int) -> None:
    """Record that this worker is computing example ``position`` (read if it dies)."""
    fd = _status.get(prefix)
    if fd is None:
        if not os.path.isdir(SHM_DIR):
            return
        fd = _status[prefix] = os.open(os.path.join(SHM_DIR, f"{prefix}status_{os.getpid()}"),
                                       os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, position.to_bytes(8, "little"), 0)


def failure(error: BaseException, position: int) -> dict:
    """What crosses back to the parent for an exception raised on example ``position``."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    payload, why = None, ""
    try:
        payload = pickle.dumps(error)
    except Exception as e:
        why = f"it cannot be pickled ({type(e).__name__}: {e})"
    else:
        try:
            pickle.loads(payload)
        except Exception as e:
            payload, why = None, f"it cannot be unpickled ({type(e).__name__}: {e})"
    module = type(error).__module__.replace("__mp_main__", "__main__")
    kind = f"{module}.{type(error).__qualname__}"
    return {"position": position, "type": kind, "message": str(error), "traceback": text,
            "payload": payload, "why": why}


# -- parent side -----------------------------------------------------------------------------
class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker process (the ``__cause__``)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def rebuild(report: dict, label: str, locate: Locate | None = None) -> BaseException:
    """The exception to raise in the parent for a worker's failure report."""
    cause = WorkerTraceback(report["traceback"])
    if report["payload"] is not None:
        error = pickle.loads(report["payload"])
        error.__cause__ = cause
        return annotate(error, label, report["position"], locate)
    error = UserFunctionError(
        f"{label} raised {report['type']}: {report['message']} on "
        f"{where(report['position'], locate)}, in a worker process; the exception itself could "
        f"not be sent back because {report['why']} (its traceback follows). Make the "
        "exception picklable, or use executor='thread' to get it unchanged")
    error.__cause__ = cause
    return error


def died(prefix: str, processes: list, label: str, first: int, locate: Locate | None = None
         ) -> BaseException:
    """The error for a worker that died without a word (a signal, os._exit, OOM killer)."""
    dead = [p for p in processes if p.exitcode is not None and p.exitcode != 0]
    parts = []
    for p in dead:
        code = p.exitcode
        how = f"signal {-code} ({_signal_name(-code)})" if code < 0 else f"exit status {code}"
        index = _position(prefix, p.pid)
        parts.append(f"worker died: {how}" + (f" while computing {where(index, locate)}"
                                               if index is not None else ""))
    if not parts:
        parts = [f"a worker process died (from {where(first, locate)} on, examples were "
                 "being computed)"]
    hint = " (SIGKILL is often the out-of-memory killer)" if any(
        p.exitcode == -signal.SIGKILL for p in dead) else ""
    return UserFunctionError(f"{label}: " + "; ".join(parts) + hint)


def _position(prefix: str, pid: int | None) -> int | None:
    try:
        with open(os.path.join(SHM_DIR, f"{prefix}status_{pid}"), "rb") as f:
            data = f.read(8)
    except OSError:
        return None
    return int.from_bytes(data, "little") if len(data) == 8 else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def sweep(prefix: str) -> None:
    """Remove every segment and status file of one map."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
