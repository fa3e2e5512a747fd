"""A local, size-limited, least-recently-used cache of remote shard files.

When a snapshot lives on a remote filesystem (S3, ...), a reader can keep the shards it
downloads in a local folder, so later epochs read them from local disk (memory-mapped) instead
of the network::

    cache = ShardCache("/mnt/nvme/snapcache", limit_bytes=200 << 30)
    buffer = cache.get(f"{fingerprint}/{shard.path}", shard.bytes,
                       lambda: storage.read_bytes(shard.path))

Layout: the cache owns ``<directory>/snapcache-shards-v1/`` and, inside it, only the files named
``<key>.cached`` (complete copies), ``<key>.cached.<pid>-<space>-<id>.part`` (being written)
and ``locks/NN.lock`` (a fixed set of lock files, never removed, each holding the pid of its
last holder). It never touches anything else, so pointing it at a folder that holds other files
is harmless. A temporary file is removed by the next eviction once its writer is gone: a
process of this machine, pid namespace and boot (``<space>``,
:data:`~snapcache.store.cache_locks.PROCESS_SPACE`) that has exited, or anyone's after
:data:`STALE_PART_SECONDS`.

A copy's modification time is its last use: ``get`` sets it on every hit, and eviction removes
the oldest copies first. The folder is the only state, which makes the cache safe to share
between processes: copies are written to a temporary file and renamed into place, eviction
tolerates files that another process removed first, and every eviction pass re-reads the folder
so it counts what other processes added. Concurrent misses of the same key fetch once per node,
under the key's locks (:mod:`snapcache.store.cache_locks`): a lock per key in the process and an
exclusive ``flock`` on the key's lock file across processes, taken before the cache is checked
again and held until the copy is in place. A process that waits for another's lock too long (a
stopped holder) fetches the key itself without keeping a copy. Eviction removes the least
recently used copies; a process still reading a removed copy keeps its memory map (POSIX
semantics), and the copies are of remote files, so eviction never removes the only copy of
anything.

A copy that cannot be written (a full disk, ...) leaves nothing behind and costs the read
nothing: its bytes are returned from memory, and the failure is logged (a warning the first
time for each cause, then at debug level).

Copies are not fsynced: a copy truncated by a crash is caught by its size on the next ``get``
and fetched again; readers still verify checksums, and call :meth:`ShardCache.discard` to drop a
copy that fails them.

A reader on its critical path asks ``get(..., copy_in_background=True)``: a fetched file of up
to :data:`BACKGROUND_COPY_BYTES` is returned from memory at once and written into the folder
by a background thread of the cache, which holds the key's locks (in the process and on the
node) until the copy is in place, so every other user of the key still waits for it and finds
it. Nothing is left half-done by that: a process exiting waits for its copies (they are
bounded in size), a process killed leaves a temporary file that is cleaned like any other, and
a forked child starts with no lock of its parent's threads (see :func:`_after_fork_in_child`).
A process started by :mod:`multiprocessing` (a DataLoader worker) ends with ``os._exit``,
which would abandon copies still being written, so there a copy is written before ``get``
returns, as without ``copy_in_background``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import re
import threading
import time
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa

from snapcache.machine import pid_alive
from snapcache.store.cache_locks import PROCESS_SPACE, KeyLocks

log = logging.getLogger(__name__)

SUBDIR = "snapcache-shards-v1"
SUFFIX = ".cached"
PART_SUFFIX = ".part"
STALE_PART_SECONDS = 3600.0  # a temporary file this old belongs to a writer that died
_PART_RE = re.compile(r"\.(\d+)-([0-9a-f]{8})-[0-9a-f]{12}" + re.escape(PART_SUFFIX) + "$")
BACKGROUND_COPY_BYTES = 256 << 20
"""A fetched file up to this size may be returned from memory while its copy is written in the
background (``copy_in_background``); a larger one is copied first and memory-mapped, so that a
process does not keep a large file in its own memory while it reads it."""


@dataclass(frozen=True)
class _Copy:
    path: str
    size: int
    last_used_ns: int


def validate_key(key: str) -> list[str]:
    """The segments of ``key``, a relative ``/``-separated path; ValueError if it is not one."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a shard cache key must be a non-empty string, got {key!r}")
    if key.startswith("/") or "\\" in key or "\0" in key or ":" in key:
        raise ValueError(f"shard cache key {key!r} must be a relative '/'-separated path "
                         "like '<fingerprint>/<shard file name>'")
    segments = key.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError(f"shard cache key {key!r} has an empty, '.' or '..' segment")
        if segment.endswith((SUFFIX, PART_SUFFIX)):
            raise ValueError(f"shard cache key {key!r}: a segment may not end in {SUFFIX!r} or "
                             f"{PART_SUFFIX!r} (the cache's own file suffixes)")
    return segments


class ShardCache:
    """Keeps up to ``limit_bytes`` of fetched files under ``directory``, evicting the least
    recently used first.

    Example::

        cache = ShardCache(os.path.expanduser("~/.cache/snapcache-shards"), 50 << 30)
        buf = cache.get("3fa2.../a1b2-0000-000003.arrow", size, fetch=download)
    """

    def __init__(self, directory: str | os.PathLike, limit_bytes: int):
        if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be a positive int, got {limit_bytes!r}")
        self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        self.limit_bytes = limit_bytes
        self._root = os.path.join(self.directory, SUBDIR)
        os.makedirs(self._root, exist_ok=True)
        # re-entrant: a fork holds it (_before_fork), and another fork hook running after that
        # one on the forking thread may still use the cache
        self._lock = threading.RLock()
        self._locks = KeyLocks(self._root)  # a key's in the process and on the node
        self._copier: ThreadPoolExecutor | None = None
        self._copier_pid = 0
        self._copies_pending: list[Future] = []
        self._last_stamp_ns = 0
        self._copy_failures: set[int | None] = set()  # the causes (errno) already warned of
        with self._lock:
            self._evict()  # and temporary files whose writers are gone
        _CACHES.add(self)

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, limit_bytes={self.limit_bytes})"

    # -- public API ----------------------------------------------------------------------------
    def get(self, key: str, size: int, fetch: Callable[[], bytes], *,
            copy_in_background: bool = False) -> pa.Buffer:
        """The bytes of ``key``: the cached copy if there is one of ``size`` bytes, else
        ``fetch()``'s result, kept for next time if it has ``size`` bytes and fits the limit.
        ``copy_in_background``: a fetched file of up to :data:`BACKGROUND_COPY_BYTES` is
        returned at once, its copy written by a background thread (not in processes started
        by multiprocessing; see the module's notes)."""
        path = self._path(key)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"size must be a non-negative int, got {size!r}")
        entry = self._locks.lock_key(key)
        fd = None
        try:
            buffer = self._open_copy(path, size)
            if buffer is not None:
                return buffer
            # another process may be fetching it right now
            fd = self._locks.lock_node(key, self._copy_failed)
            if fd is None:  # for too long (stopped?): fetch it without keeping a copy
                return pa.py_buffer(fetch())
            buffer = self._open_copy(path, size)
            if buffer is not None:
                return buffer
            data = fetch()
            if len(data) != size:
                # the remote file is not what the caller expected (it will say so): not cached
                log.debug("shard cache: %s fetched %d bytes, expected %d; not cached",
                          key, len(data), size)
                return pa.py_buffer(data)
            if size > self.limit_bytes:
                return pa.py_buffer(data)
            if copy_in_background and size <= BACKGROUND_COPY_BYTES and \
                    multiprocessing.parent_process() is None:
                self._copy_later(key, path, data, entry, fd)
                entry = fd = None  # the copy releases them
                return pa.py_buffer(data)
            buffer = self._open_copy(path, size) if self._keep(key, path, data) else None
            # not kept (logged), or evicted at once by a concurrent process filling the cache:
            # serve from memory
            return buffer if buffer is not None else pa.py_buffer(data)
        finally:
            if fd is not None:
                self._locks.unlock_node(fd)
            if entry is not None:
                self._locks.unlock_key(key, entry)

    def _keep(self, key: str, path: str, data: bytes) -> bool:
        """Write the copy of ``key`` and evict down to the limit; False if the copy could not
        be written (logged): the copy is an optimisation, the caller reads on without it."""
        try:
            self._store(path, data)
            with self._lock:
                self._evict()
            return True
        except Exception as e:  # noqa: BLE001 - the copy is an optimisation: reads go on
            self._copy_failed(key, e)
            return False

    def _copy_failed(self, key: str, error: Exception) -> None:
        """Log a copy that could not be written: a warning the first time for each cause."""
        cause = getattr(error, "errno", None)
        with self._lock:
            first = cause not in self._copy_failures
            self._copy_failures.add(cause)
        way_out = ("free space on that disk or lower local_cache_limit"
                   if cause in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)) else
                   "make the folder writable or drop local_cache")
        if first:
            log.warning("shard cache: could not keep a copy of %s in the node-local cache "
                        "(local_cache=%r): %s; reading on without it (%s; the same failure "
                        "again is logged at debug level)", key, self.directory, error, way_out)
        else:
            log.debug("shard cache: could not keep a copy of %s in %s: %s", key,
                      self.directory, error)

    def _copy_later(self, key: str, path: str, data: bytes, entry: list, fd: int) -> None:
        """Write the copy of ``key`` on the cache's background thread, then release the key's
        locks (taken by the caller and handed over)."""
        def copy() -> None:
            try:
                self._keep(key, path, data)
            finally:
                self._locks.unlock_node(fd)
                self._locks.unlock_key(key, entry)

        with self._lock:
            if self._copier is None or self._copier_pid != os.getpid():
                self._copier = ThreadPoolExecutor(1, thread_name_prefix="snapcache-cache-copy")
                self._copier_pid = os.getpid()
            copier = self._copier
            self._copies_pending = [f for f in self._copies_pending if not f.done()]
        try:
            future = copier.submit(copy)
        except RuntimeError:  # the interpreter is shutting down: copy now
            copy()
            return
        with self._lock:
            self._copies_pending.append(future)

    def wait_for_copies(self, timeout: float | None = None) -> bool:
        """Wait until the copies being written in the background are in place; False on
        timeout."""
        with self._lock:
            pending = list(self._copies_pending)
        return not futures_wait(pending, timeout).not_done

    def peek(self, key: str, size: int) -> pa.Buffer | None:
        """The cached copy of ``key`` if there is a complete one, without fetching it."""
        return self._open_copy(self._path(key), size)

    def discard(self, key: str) -> None:
        """Drop the copy of ``key`` (e.g. one that failed its checksum), if there is one."""
        path = self._path(key)
        with self._locks.key_locked(key):
            _remove(path)

    def clear(self) -> None:
        """Remove every copy (and temporary file) the cache made; nothing else."""
        self.wait_for_copies()
        with self._lock:
            for copy in self._copies():
                _remove(copy.path)
            for entry in _walk_files(self._root):
                if _abandoned(entry, max_age=0.0):
                    _remove(entry.path)
            self._remove_empty_dirs()

    @property
    def size(self) -> int:
        """Bytes held by complete copies in the cache folder, by any process."""
        return sum(copy.size for copy in self._copies())

    # -- internals -----------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return os.path.join(self._root, *validate_key(key)) + SUFFIX

    def _after_fork_in_child(self) -> None:
        """A forked child has none of its parent's other threads: drop the locks they held
        (the node's lock files stay locked by the parent, whose descriptors are its own) and
        the background copier (the parent finishes its copies)."""
        self._lock = threading.RLock()
        self._locks.after_fork_in_child()
        self._copier, self._copier_pid, self._copies_pending = None, 0, []

    def _open_copy(self, path: str, size: int) -> pa.Buffer | None:
        """A memory map of the copy at ``path`` if it is complete, marked as just used."""
        try:
            with pa.memory_map(path, "r") as mm:
                buffer = mm.read_buffer()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if buffer.size != size:  # truncated or stale: fetch it again
            _remove(path)
            return None
        self._touch(path)
        return buffer

    def _touch(self, path: str) -> None:
        with self._lock:
            # strictly increasing within the process, so uses in quick succession stay ordered
            stamp = max(time.time_ns(), self._last_stamp_ns + 1)
            self._last_stamp_ns = stamp
        try:
            os.utime(path, ns=(stamp, stamp))
        except FileNotFoundError:
            pass

    def _store(self, path: str, data: bytes) -> None:
        writer = f"{os.getpid()}-{PROCESS_SPACE}" if PROCESS_SPACE else str(os.getpid())
        part = f"{path}.{writer}-{uuid.uuid4().hex[:12]}{PART_SUFFIX}"
        try:
            for attempt in range(2):  # another process's clear() may remove the folder between
                os.makedirs(os.path.dirname(path), exist_ok=True)
                try:
                    with open(part, "wb") as f:
                        f.write(data)
                    break
                except FileNotFoundError:
                    if attempt:
                        raise
            os.replace(part, path)
        except BaseException:
            with contextlib.suppress(OSError):
                _remove(part)  # a partial copy must not stay (on a full disk, least of all)
            raise
        self._touch(path)

    def _copies(self, *, remove_abandoned: bool = False) -> list[_Copy]:
        """The complete copies in the folder; ``remove_abandoned``: removing on the way the
        temporary files whose writers are gone (:func:`_abandoned`)."""
        copies = []
        for entry in _walk_files(self._root):
            if remove_abandoned and _abandoned(entry):
                _remove(entry.path)
            if not entry.name.endswith(SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            copies.append(_Copy(entry.path, st.st_size, st.st_mtime_ns))
        return copies

    def _evict(self) -> None:
        """Remove the temporary files whose writers are gone, and least recently used copies
        until the folder holds at most the limit. Call with ``self._lock`` held."""
        copies = self._copies(remove_abandoned=True)
        total = sum(c.size for c in copies)
        for copy in sorted(copies, key=lambda c: (c.last_used_ns, c.path)):
            if total <= self.limit_bytes:
                break
            if _remove(copy.path):  # removed by us or by another process: gone either way
                log.debug("shard cache: evicted %s (%d bytes)", copy.path, copy.size)
                total -= copy.size

    def _remove_empty_dirs(self) -> None:
        for dirpath, _, _ in sorted(os.walk(self._root), reverse=True):
            if dirpath != self._root:
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)  # fails, harmlessly, unless empty


def _walk_files(root: str) -> Iterator[os.DirEntry]:
    """Regular files under ``root``, recursively, not following symlinks."""
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk_files(entry.path)
            elif entry.is_file(follow_symlinks=False):
                yield entry
        except FileNotFoundError:
            continue


def _abandoned(entry: os.DirEntry, max_age: float = STALE_PART_SECONDS) -> bool:
    """Whether ``entry`` is a temporary file of the cache whose writer is gone: a process of
    this machine, pid namespace and boot (:data:`~snapcache.store.cache_locks.PROCESS_SPACE`)
    that has exited, or any writer, ``max_age`` seconds after its last write."""
    if not entry.name.endswith(PART_SUFFIX) or SUFFIX + "." not in entry.name:
        return False
    writer = _PART_RE.search(entry.name)
    if writer and PROCESS_SPACE and writer[2] == PROCESS_SPACE and \
            not pid_alive(int(writer[1])):
        return True
    try:
        return entry.stat(follow_symlinks=False).st_mtime <= time.time() - max_age
    except FileNotFoundError:
        return False


def _remove(path: str) -> bool:
    """Delete one file; True if it is gone (also when it already was), False if it cannot be
    removed now (e.g. mapped on Windows: the next eviction tries again)."""
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return True
    except PermissionError:
        log.debug("shard cache: cannot remove %s now", path)
        return False


_shared: dict[tuple[str, int], ShardCache] = {}
_unusable: set[str] = set()  # folders warned of by shared_cache
_shared_lock = threading.Lock()
_CACHES: "weakref.WeakSet[ShardCache]" = weakref.WeakSet()


_FORKING: list["ShardCache"] = []


def _before_fork() -> None:
    """Hold every cache's lock and its key locks across a fork, so that the child's copy of
    each cache's set of lock descriptors is complete (:meth:`KeyLocks.lock_node
    <snapcache.store.cache_locks.KeyLocks.lock_node>`)."""
    caches = list(_CACHES)
    for cache in caches:
        cache._lock.acquire()
        cache._locks.before_fork()
    _FORKING[:] = caches


def _after_fork_in_parent() -> None:
    for cache in _FORKING:
        cache._locks.after_fork_in_parent()
        cache._lock.release()
    _FORKING.clear()


def _after_fork_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    _FORKING.clear()
    for cache in list(_CACHES):
        cache._after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def shared_cache(directory: str | os.PathLike, limit_bytes: int) -> ShardCache | None:
    """One :class:`ShardCache` object per folder and limit in a process (it holds the per-key
    locks, so every reader of the process must share it); None if the folder cannot be used
    (read-only, another user's, not a folder): the cache is an optimisation, so reads go on
    without it, warned of once per folder (and the folder is tried again next time)."""
    key = (os.path.abspath(os.path.expanduser(os.fspath(directory))), limit_bytes)
    with _shared_lock:
        if key not in _shared:
            try:
                _shared[key] = ShardCache(directory, limit_bytes)
            except OSError as e:
                if key[0] not in _unusable:
                    _unusable.add(key[0])
                    log.warning("local_cache=%r cannot be used (%s): reading remote snapshots "
                                "without a node-local cache. Point local_cache at a folder "
                                "this process can write (on a local disk), or drop the option",
                                key[0], e)
                return None
        return _shared[key]
