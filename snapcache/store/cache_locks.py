"""The locks that make concurrent misses of one key of the node-local shard cache
(:mod:`snapcache.store.cache`) fetch it once per node, and the records of who holds them.

:class:`KeyLocks` gives each key two locks: one in the process (a lock per key, taken by every
thread that uses the key) and one on the node, an exclusive ``flock`` on the key's lock file
(``<cache folder>/locks/NN.lock``, one of :data:`LOCK_STRIPES`, picked by a hash of the key; a
fixed set, never removed), taken before the cache is checked again and held until the copy is
in place. A process waits for another's lock at most :data:`NODE_LOCK_WAIT_SECONDS`: a holder
that is stopped (Ctrl-Z, a debugger, a frozen container) must not stop every reader of the
node. Past that the cache fetches the key itself without keeping a copy (a second download
instead of a wait without end); this module logs once which process holds the lock (each
holder writes ``<pid> <space>`` into the lock file, :data:`PROCESS_SPACE`), and does not wait
for that same holder again.

A fork must not split the opening of a lock file from its recording: the cache holds
:meth:`KeyLocks.before_fork` across every fork, and a forked child drops what its parent's
other threads held (:meth:`KeyLocks.after_fork_in_child`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from typing import Callable, Iterator

import xxhash

from snapcache.machine import BOOT, HOST, PIDNS

log = logging.getLogger("snapcache.store.cache")  # the cache's messages, under its name

PROCESS_SPACE = f"{xxhash.xxh3_64_intdigest(f'{HOST}|{PIDNS}|{BOOT}'.encode()):016x}"[:8] \
    if PIDNS and BOOT else ""
"""Where this process's pid means this process (its machine, pid namespace and boot), in the
holder records of the lock files it holds and in the names of the cache's temporary files:
another process of the same space that finds the pid gone removes such a file; one of another
space (another container sharing the folder) waits for
:data:`~snapcache.store.cache.STALE_PART_SECONDS`. Empty where the platform does not say."""
LOCK_STRIPES = 64
"""Lock files shared by all keys (a key's is picked by a hash): bounded, never deleted."""
NODE_LOCK_WAIT_SECONDS = 30.0
"""How long a process waits for another process of the node to fetch a key before fetching it
itself, uncached: a 64 MiB shard takes seconds to download, and one waited for longer than
this comes sooner fetched again (or its holder is stopped)."""
_HOLDER_BYTES = 32


class KeyLocks:
    """The locks of the keys of one cache folder ``root``: :meth:`lock_key` in the process,
    :meth:`lock_node` among the processes of the machine."""

    def __init__(self, root: str):
        self._lock_dir = os.path.join(root, "locks")
        # re-entrant: a fork holds it (before_fork), and another fork hook running after that
        # one on the forking thread may still use the cache
        self._lock = threading.RLock()
        self._key_locks: dict[str, list] = {}   # key -> [lock, number of users]
        self._node_fds: set[int] = set()         # lock files held (flock) by this process
        self._stuck: dict[int, str] = {}  # lock stripe -> the holder waited for in vain

    def lock_node(self, key: str, unusable: Callable[[str, OSError], None]) -> int | None:
        """Take an exclusive lock on ``key`` among the processes of this machine (``flock``
        on one of the lock files); the descriptor to give :meth:`unlock_node`, or None if
        another process holds it longer than :data:`NODE_LOCK_WAIT_SECONDS` (logged once per
        holder; a holder waited for in vain is not waited for again) or if the lock file
        cannot be opened (a folder this process cannot write: told to ``unusable``)."""
        stripe = xxhash.xxh3_64_intdigest(key.encode()) % LOCK_STRIPES
        lock_dir = self._lock_dir
        # Opened and recorded in one step that a fork cannot split (see before_fork): a
        # child closes every descriptor recorded here. One it inherited unrecorded would keep
        # the lock this process then takes on it held after this process lets go (a flock
        # belongs to the open file, which the child's copy shares), and every user of the
        # stripe on the node, the child too, would wait for that child to exit.
        try:
            os.makedirs(lock_dir, exist_ok=True)
            with self._lock:
                fd = os.open(os.path.join(lock_dir, f"{stripe:02d}.lock"),
                             os.O_RDWR | os.O_CREAT, 0o666)
                self._node_fds.add(fd)
        except OSError as e:  # a folder this process cannot write: no copy either
            unusable(key, e)
            return None
        try:
            if not self._wait_for_lock(fd, stripe, lock_dir):
                self.unlock_node(fd)
                return None
            with contextlib.suppress(OSError):  # (a full disk): only a message needs it
                # who holds it, for the message of a process that waits in vain
                os.pwrite(fd, _holder().ljust(_HOLDER_BYTES).encode(), 0)
        except BaseException:
            self.unlock_node(fd)
            raise
        return fd

    def _wait_for_lock(self, fd: int, stripe: int, lock_dir: str) -> bool:
        """``flock`` ``fd``, waiting at most :data:`NODE_LOCK_WAIT_SECONDS`, or not at all
        for a holder this process waited for in vain before (a stopped process may hold
        several lock files); False if not taken."""
        deadline = time.monotonic() + NODE_LOCK_WAIT_SECONDS
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with self._lock:
                    self._stuck.pop(stripe, None)
                return True
            except BlockingIOError:
                pass
            holder = os.pread(fd, _HOLDER_BYTES, 0).decode(errors="replace").strip()
            with self._lock:
                stuck = holder in self._stuck.values()
            if stuck or time.monotonic() >= deadline:
                break
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 0.1)
        with self._lock:
            warned = holder in self._stuck.values()
            self._stuck[stripe] = holder
        if not warned:
            log.warning("shard cache: %s has held a lock of the node-local cache "
                        "(%s) for over %g s: stopped (Ctrl-Z, a debugger, a frozen "
                        "container) or very slow? Until it lets go, this process reads the "
                        "shards whose locks it holds straight from the store, without keeping "
                        "copies", _describe(holder),
                        os.path.join(lock_dir, f"{stripe:02d}.lock"), NODE_LOCK_WAIT_SECONDS)
        return False

    def unlock_node(self, fd: int) -> None:
        with self._lock:  # closed with the set updated, so a fork sees both or neither
            if fd in self._node_fds:  # (else closed by a fork's reset: not ours any more)
                self._node_fds.discard(fd)
                os.close(fd)  # releases the lock

    def lock_key(self, key: str) -> list:
        """Take ``key``'s lock in this process; the entry to give :meth:`unlock_key` (from
        any thread)."""
        with self._lock:
            entry = self._key_locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        entry[0].acquire()
        return entry

    def unlock_key(self, key: str, entry: list) -> None:
        entry[0].release()
        with self._lock:
            entry[1] -= 1
            if entry[1] == 0 and self._key_locks.get(key) is entry:
                del self._key_locks[key]

    @contextlib.contextmanager
    def key_locked(self, key: str) -> Iterator[None]:
        entry = self.lock_key(key)
        try:
            yield
        finally:
            self.unlock_key(key, entry)

    def before_fork(self) -> None:
        """Held across a fork, so that the child's copy of the set of lock descriptors is
        complete (see :meth:`lock_node`)."""
        self._lock.acquire()

    def after_fork_in_parent(self) -> None:
        self._lock.release()

    def after_fork_in_child(self) -> None:
        """A forked child has none of its parent's other threads: drop the locks they held
        (the node's lock files stay locked by the parent, whose descriptors are its own)."""
        self._lock = threading.RLock()
        self._key_locks = {}
        for fd in self._node_fds:
            try:
                os.close(fd)  # the child's duplicate only: the parent's lock is untouched
            except OSError:
                pass
        self._node_fds = set()


def _holder() -> str:
    """This process, as written into a lock file it holds: ``<pid> <space>``."""
    return f"{os.getpid()} {PROCESS_SPACE}"


def _describe(holder: str) -> str:
    """The process that wrote ``holder`` (:func:`_holder`) into a lock file, for a message."""
    pid, _, space = holder.partition(" ")
    if not pid.isdigit():
        return "another process (it did not write its pid)"
    return f"process {pid}" + ("" if space == PROCESS_SPACE else
                               " (of another pid namespace or machine)")
