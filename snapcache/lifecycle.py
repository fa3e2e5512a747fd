"""Stopping background work before the interpreter stops.

Readers, prefetchers, writers and lease heartbeats run on threads. A daemon thread still inside
pyarrow while the interpreter finalizes aborts the process ("terminate called without an active
exception"), and a lease that is never released blocks other jobs until it expires. So every
piece of background work registers how to stop it here, and at exit, before the interpreter
joins its threads and before ``concurrent.futures`` shuts its pools down, the live ones are
stopped and joined, newest first: open iterators are closed (releasing their leases and
finishing or discarding their writes), then any thread still registered is stopped.

A leaf module (standard library only) so every layer may use it.

Example::

    stop = threading.Event()
    thread = lifecycle.background(lambda: work(stop), stop.set, "snapcache-work")
    # registered until work() returns; at exit, while it runs: stop.set(), then a join

or, for work whose end is not a thread's (an open iterator)::

    forget = lifecycle.at_exit(it.close)
    ...                    # when it is closed:
    forget()
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  its exit hook is registered before ours runs
import itertools
import logging
import os
import threading
import weakref
from typing import Any, Callable

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 60.0
"""Seconds to wait at exit for one thread to finish the item it is working on."""

_lock = threading.Lock()
_closers: dict[int, Callable[[], Any]] = {}
_ids = itertools.count()
_exiting = False


def exiting() -> bool:
    """True once the interpreter has started to shut down."""
    return _exiting


def at_exit(close: Callable[[], Any]) -> Callable[[], None]:
    """Run ``close()`` at interpreter exit unless the returned function is called first."""
    key = next(_ids)
    with _lock:
        _closers[key] = close

    def forget() -> None:
        with _lock:
            _closers.pop(key, None)

    return forget


def background(target: Callable[[], Any], stop: Callable[[], Any], name: str
               ) -> threading.Thread:
    """Start ``target()`` on a daemon thread that, while it runs, is stopped at interpreter
    exit (``stop()``, then joined for up to :data:`JOIN_TIMEOUT`). The thread forgets itself
    when ``target`` returns, so work its consumer abandoned leaves nothing registered once it
    ends, however long after the consumer left."""
    def run() -> None:
        try:
            target()
        finally:
            forget()

    thread = threading.Thread(target=run, name=name, daemon=True)
    forget = at_exit(lambda: (stop(), thread.join(JOIN_TIMEOUT)))
    thread.start()
    return thread


def close_at_exit(obj: Any) -> Callable[[], None]:
    """``obj.close()`` at exit while ``obj`` is alive (held weakly: registering does not keep it
    alive, and a collected object's own finalizer has already run)."""
    ref = weakref.ref(obj)

    def close() -> None:
        target = ref()
        if target is not None:
            target.close()

    return at_exit(close)


def _shutdown() -> None:
    global _exiting
    _exiting = True
    while True:
        with _lock:
            if not _closers:
                return
            key = max(_closers)
            close = _closers.pop(key)
        try:
            close()
        except BaseException as e:  # keep stopping the others
            log.debug("stopping background work at exit: %r", e)


def _forget_all_in_child() -> None:
    """A forked child has none of its parent's threads, and its parent's iterators, leases and
    writers are the parent's to stop: what the parent registered is not run at the child's
    exit (a DataLoader worker exiting would otherwise release its parent's leases)."""
    global _lock
    _lock = threading.Lock()  # (another thread may have held it when the parent forked)
    _closers.clear()


os.register_at_fork(after_in_child=_forget_all_in_child)

# Runs before threading joins non-daemon threads and, registered after concurrent.futures'
# hook, before that hook shuts the thread pools down (they run in reverse order).
threading._register_atexit(_shutdown)  # type: ignore[attr-defined]
