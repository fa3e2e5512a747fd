"""Interruptions of a writing epoch: Ctrl-C and SIGTERM keep the examples computed so far.

Ctrl-C raises KeyboardInterrupt in the main thread; SIGTERM (what a scheduler or ``kill``
sends) would end the process at once, without any cleanup, so while a writing epoch is open in
the main thread, and nobody else has set a SIGTERM handler, SIGTERM raises
``SystemExit(143)`` instead. Either way the exception unwinds the program; the writing
iterator is closed (by the consumer's ``with``/``finally``, or at interpreter exit by
:mod:`snapcache.lifecycle`) and its writer finishes the shard in progress and records it, so
the next run resumes after the examples already computed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

_lock = threading.Lock()
_depth = 0
_installed = False

EXIT_STATUS = 128 + int(signal.SIGTERM)
_exit_status = EXIT_STATUS


def exit_quietly_on_sigterm() -> None:
    """In this process, SIGTERM during a writing epoch exits with status 0 once the epoch is
    closed (its computed examples kept), not 143. For a process whose exit status only a parent
    reads that takes any other status for a crash: a DataLoader worker. At interpreter exit,
    ``multiprocessing`` terminates a parent's daemonic children (the workers of a loader still
    referenced) and joins them, and torch's SIGCHLD handler, run while it waits, reports a
    worker that exits with any status but 0 as ``exited unexpectedly``, and one that dies of
    the signal as ``killed by signal``. A worker ended this way from outside is still seen by
    its parent: torch checks that its workers are alive, not how they exited."""
    global _exit_status
    _exit_status = 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(_exit_status)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While open (nested: the outermost decides), SIGTERM raises SystemExit in the main
    thread, if SIGTERM had its default action and this is the main thread."""
    global _depth, _installed
    with _lock:
        _depth += 1
        if _depth == 1 and threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            try:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
                _installed = True
            except ValueError:  # not the main interpreter
                pass
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _installed and \
                    threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _installed = False


@contextlib.contextmanager
def keeps_written(writer: Any, source: Any) -> Iterator[None]:
    """A writing epoch's body: while open, SIGTERM exits (:func:`sigterm_exits`). On leaving,
    ``source`` is closed and ``writer`` aborted (a no-op after its commit or finish): its
    finished shards stay for a resume, and after an interruption (Ctrl-C, SIGTERM, a consumer
    that closes the epoch) the shard in progress too; after an error it is deleted."""
    keep = False
    with sigterm_exits():
        try:
            yield
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            keep = True
            raise
        finally:
            writer.abort(keep=keep)
            close = getattr(source, "close", None)
            if close is not None:
                close()
