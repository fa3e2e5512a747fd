"""The local LRU cache of remote shard files."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import OrderedDict

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcache.store import cache as cache_module
from snapcache.store import cache_locks
from snapcache.store.cache import PART_SUFFIX, SUBDIR, SUFFIX, ShardCache, shared_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Fetcher:
    """A fetch function for one key that counts its calls."""

    def __init__(self, data: bytes):
        self.data = data
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        with self._lock:
            self.calls += 1
        return self.data


def payload(key: str, size: int) -> bytes:
    seed = key.encode() + b"|"
    return (seed * (size // len(seed) + 1))[:size]


def get(cache: ShardCache, key: str, size: int) -> tuple[pa.Buffer, Fetcher]:
    fetch = Fetcher(payload(key, size))
    return cache.get(key, size, fetch), fetch


def bytes_on_disk(directory) -> int:
    """Bytes of the copies and temporary files (not of the fixed set of lock files)."""
    root = os.path.join(directory, SUBDIR)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root)
               for f in files if d != os.path.join(root, "locks"))


def cached_keys(cache: ShardCache) -> set[str]:
    root = os.path.join(cache.directory, SUBDIR)
    return {os.path.relpath(os.path.join(d, f), root)[:-len(SUFFIX)]
            for d, _, files in os.walk(root) for f in files if f.endswith(SUFFIX)}


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "100"])
def test_the_limit_must_be_a_positive_int(tmp_path, limit):
    with pytest.raises(ValueError, match="limit_bytes"):
        ShardCache(tmp_path, limit)


def test_a_miss_fetches_and_a_hit_does_not(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    first, fetch = get(cache, "abc123/s-0.arrow", 1000)
    assert fetch.calls == 1 and first.to_pybytes() == fetch.data
    again = cache.get("abc123/s-0.arrow", 1000, fetch)
    assert fetch.calls == 1 and again.to_pybytes() == fetch.data
    assert cache.size == 1000
    # a second cache on the same folder (another process) sees the copy
    other = ShardCache(tmp_path, 1 << 20)
    assert other.get("abc123/s-0.arrow", 1000, fetch).to_pybytes() == fetch.data
    assert fetch.calls == 1


def test_empty_files_are_cached_too(tmp_path):
    cache = ShardCache(tmp_path, 10)
    _, fetch = get(cache, "fp/empty.arrow", 0)
    assert cache.get("fp/empty.arrow", 0, fetch).size == 0
    assert fetch.calls == 1


def test_least_recently_used_copies_go_first(tmp_path):
    cache = ShardCache(tmp_path, 300)
    for key in ("fp/a", "fp/b", "fp/c"):
        get(cache, key, 100)
    _, fetch_a = get(cache, "fp/a", 100)          # a hit: a is now the most recently used
    assert fetch_a.calls == 0
    get(cache, "fp/d", 100)
    assert cached_keys(cache) == {"fp/a", "fp/c", "fp/d"}
    get(cache, "fp/e", 150)                       # needs two evictions: c, then a
    assert cached_keys(cache) == {"fp/d", "fp/e"}
    assert cache.size == 250


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(1, 400),
       requests=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 160)), max_size=30))
def test_the_limit_is_never_exceeded_and_eviction_is_lru(limit, requests):
    model: OrderedDict[str, int] = OrderedDict()  # key -> size, least recently used first
    with tempfile.TemporaryDirectory() as directory:
        cache = ShardCache(directory, limit)
        for index, size in requests:
            key = f"{index:02x}/shard-{index}.arrow"
            buffer, fetch = get(cache, key, size)
            assert buffer.to_pybytes() == payload(key, size)
            hit = model.get(key) == size
            assert fetch.calls == (0 if hit else 1)
            if hit:
                model.move_to_end(key)
            else:
                model.pop(key, None)
                if size <= limit:
                    model[key] = size
                    while sum(model.values()) > limit:
                        model.popitem(last=False)
            assert bytes_on_disk(directory) == cache.size == sum(model.values()) <= limit
            assert cached_keys(cache) == set(model)


def test_copies_already_on_disk_count_towards_the_limit(tmp_path):
    big = ShardCache(tmp_path, 10_000)
    for i in range(10):
        get(big, f"fp/{i}", 1000)
    assert big.size == 10_000
    small = ShardCache(tmp_path, 3500)
    assert small.size <= 3500 and bytes_on_disk(tmp_path) <= 3500
    assert cached_keys(small) == {"fp/7", "fp/8", "fp/9"}


def test_files_that_are_not_its_own_copies_are_never_deleted(tmp_path):
    foreign = [
        tmp_path / "precious.arrow",
        tmp_path / "looks-like-a-copy.arrow.cached",       # beside, not inside, the cache folder
        tmp_path / "fp" / "s-0.arrow.cached",
        tmp_path / SUBDIR / "notes.txt",
        tmp_path / SUBDIR / "fp" / "s-0.arrow",
        tmp_path / SUBDIR / "fp" / "s-0.arrow.cached.bak",
        tmp_path / SUBDIR / "fp" / "s-0.arrow.part",        # not the cache's temporary naming
    ]
    for path in foreign:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 500)
    old = time.time() - 10 * 24 * 3600
    for path in foreign:
        os.utime(path, (old, old))  # older than anything: first in line if it were a copy
    cache = ShardCache(tmp_path, 1000)
    for i in range(20):
        get(cache, f"fp/s-{i}.arrow", 400)
    get(cache, "fp/s-0.arrow", 400)
    cache.clear()
    assert all(path.read_bytes() == b"x" * 500 for path in foreign)
    assert cache.size == 0


def test_a_file_bigger_than_the_limit_is_returned_but_not_cached(tmp_path):
    cache = ShardCache(tmp_path, 1000)
    get(cache, "fp/small", 600)
    buffer, fetch = get(cache, "fp/huge", 1001)
    assert buffer.to_pybytes() == fetch.data
    cache.get("fp/huge", 1001, fetch)
    assert fetch.calls == 2
    assert cached_keys(cache) == {"fp/small"}, "an uncacheable file must not evict others"


def test_a_truncated_copy_is_fetched_again(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    _, fetch = get(cache, "fp/s.arrow", 1000)
    copy = tmp_path / SUBDIR / "fp" / ("s.arrow" + SUFFIX)
    copy.write_bytes(fetch.data[:300])
    assert cache.get("fp/s.arrow", 1000, fetch).to_pybytes() == fetch.data
    assert fetch.calls == 2
    assert copy.read_bytes() == fetch.data


def test_fetched_data_of_an_unexpected_size_is_returned_but_not_cached(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    fetch = Fetcher(b"short")
    assert cache.get("fp/s.arrow", 1000, fetch).to_pybytes() == b"short"
    assert cache.size == 0


def test_discard_drops_one_copy(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    _, fetch = get(cache, "fp/a", 10)
    get(cache, "fp/b", 10)
    cache.discard("fp/a")
    cache.discard("fp/never-cached")
    assert cached_keys(cache) == {"fp/b"}
    cache.get("fp/a", 10, fetch)
    assert fetch.calls == 2


def test_a_failing_fetch_leaves_nothing_behind(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)

    def fetch() -> bytes:
        raise ConnectionError("network down")

    with pytest.raises(ConnectionError):
        cache.get("fp/s.arrow", 10, fetch)
    assert bytes_on_disk(tmp_path) == 0


@pytest.mark.parametrize("key", [
    "../escape.arrow", "fp/../../escape.arrow", "fp/..", "/etc/passwd", "fp//s.arrow", "",
    "fp/./s.arrow", "fp\\s.arrow", "C:/x.arrow", "fp/s.arrow" + SUFFIX, "fp/s" + PART_SUFFIX,
    "fp" + SUFFIX + "/s.arrow",
])
def test_keys_that_are_not_plain_relative_paths_are_rejected(tmp_path, key):
    cache = ShardCache(tmp_path, 1 << 20)
    with pytest.raises(ValueError, match="key"):
        cache.get(key, 1, lambda: b"x")
    assert bytes_on_disk(tmp_path) == 0 and not (tmp_path / "escape.arrow").exists()


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
    folder = tmp_path / SUBDIR / "fp"
    folder.mkdir(parents=True)
    stale = folder / f"s.arrow{SUFFIX}.123-abc{PART_SUFFIX}"
    fresh = folder / f"t.arrow{SUFFIX}.456-def{PART_SUFFIX}"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    ShardCache(tmp_path, 1000)
    assert not stale.exists() and fresh.exists()  # fresh: another process may be writing it


def parts(directory) -> list[str]:
    return sorted(f for _, _, files in os.walk(directory) for f in files
                  if f.endswith(PART_SUFFIX))


def a_dead_pid() -> int:
    """The pid of a process of this machine that has exited."""
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not cache_module.PROCESS_SPACE, reason="needs the pid namespace and boot")
def test_temporary_files_of_exited_writers_of_this_machine_are_removed_by_eviction(tmp_path):
    """A copy whose writer died (killed mid-write, a full disk before the fix) leaves a
    temporary file; the next eviction removes it if its writer is provably gone: a process of
    this machine, pid namespace and boot that has exited. Others wait for their age."""
    cache = ShardCache(tmp_path, 1 << 20)
    folder = tmp_path / SUBDIR / "fp"
    folder.mkdir(parents=True)
    space, dead, rand = cache_module.PROCESS_SPACE, a_dead_pid(), "0123456789ab"
    other_space = "0" * 8 if space != "0" * 8 else "1" * 8
    gone = folder / f"s.arrow{SUFFIX}.{dead}-{space}-{rand}{PART_SUFFIX}"
    kept = [
        folder / f"t.arrow{SUFFIX}.{os.getpid()}-{space}-{rand}{PART_SUFFIX}",  # alive
        folder / f"u.arrow{SUFFIX}.{dead}-{other_space}-{rand}{PART_SUFFIX}",  # another pidns
        folder / f"v.arrow{SUFFIX}.{dead}-{rand}{PART_SUFFIX}",                # says no space
    ]
    for path in (gone, *kept):
        path.write_bytes(b"partial")
    get(cache, "fp/w.arrow", 100)  # a copy, then an eviction pass
    assert not gone.exists() and all(path.exists() for path in kept)


class FullDisk:
    """Makes the cache's writes of temporary files fail as on a full disk, half-written."""

    def __init__(self, monkeypatch):
        real_open = open

        class Half:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(bytes(data)[:len(data) // 2])
                self.f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def full_open(path, mode="r", *args, **kwargs):
            f = real_open(path, mode, *args, **kwargs)
            return Half(f) if str(path).endswith(PART_SUFFIX) else f

        monkeypatch.setattr(cache_module, "open", full_open, raising=False)


@pytest.mark.parametrize("background", [False, True])
def test_a_copy_that_fails_on_a_full_disk_leaves_nothing_and_the_read_gets_its_bytes(
        tmp_path, monkeypatch, caplog, background):
    """The copy is an optimisation: a failed one (a full disk) removes its temporary file,
    the read returns the fetched bytes, and the failure is warned of once, naming local_cache
    and the way out. Without ``background`` (as in a DataLoader worker) the copy is written
    before ``get`` returns."""
    cache = ShardCache(tmp_path, 1 << 20)
    FullDisk(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
        for key in ("fp/a", "fp/b"):
            data = payload(key, 5000)
            fetch = Fetcher(data)
            assert cache.get(key, 5000, fetch, copy_in_background=background).to_pybytes() \
                == data
            assert cache.wait_for_copies(timeout=120)
            assert fetch.calls == 1
    assert parts(tmp_path) == [] and cached_keys(cache) == set()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "local_cache" in warned[0] and "No space left" in warned[0] and \
        "free space" in warned[0]
    monkeypatch.undo()  # space again: copies are kept again
    get(cache, "fp/a", 5000)
    assert cached_keys(cache) == {"fp/a"}


def test_a_cache_folder_that_cannot_be_used_is_warned_of_once_and_reads_go_on(tmp_path, caplog):
    """``local_cache`` pointing somewhere this process cannot write (read-only, another
    user's; here a path below a regular file): no node-local cache, one warning naming the
    option and the way out, tried again next time."""
    (tmp_path / "file").write_bytes(b"not a folder")
    where = tmp_path / "file" / "cache"
    with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
        assert shared_cache(where, 1 << 20) is None
        assert shared_cache(where, 1 << 20) is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"local_cache={str(where)!r}" in warned[0], warned
    assert "drop the option" in warned[0]


def test_a_lock_folder_that_cannot_be_made_costs_the_read_nothing(tmp_path, caplog):
    """The cache folder exists, but its locks cannot be taken (made read-only after the cache
    was opened; here the lock folder is a regular file): the key is fetched, not kept."""
    cache = ShardCache(tmp_path, 1 << 20)
    (tmp_path / SUBDIR / "locks").write_bytes(b"not a folder")
    with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
        buffer, fetch = get(cache, "fp/s", 1000)
    assert buffer.to_pybytes() == fetch.data and fetch.calls == 1
    assert cached_keys(cache) == set()
    assert ["local_cache" in r.getMessage() for r in caplog.records] == [True]


_HOLDS_A_KEY = textwrap.dedent("""
    import sys, time
    from snapcache.store.cache import ShardCache

    def fetch():  # holds the key's locks, as a download would
        print("fetching", flush=True)
        time.sleep(3600)

    ShardCache(sys.argv[1], 1 << 20).get("fp/s", 1000, fetch)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_process_stopped_while_it_fetches_a_key_does_not_stop_the_others(tmp_path,
                                                                          monkeypatch, caplog):
    """A reader stopped (Ctrl-Z, a debugger, a frozen container) in the middle of a download
    holds the key's lock on the node. Another process waits NODE_LOCK_WAIT_SECONDS at most,
    fetches the key itself without keeping a copy, says once which process holds the lock,
    and does not wait for that holder again; once the holder is gone, copies are kept again."""
    monkeypatch.setattr(cache_locks, "NODE_LOCK_WAIT_SECONDS", 0.2)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDS_A_KEY, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT})
    data = payload("fp/s", 1000)
    try:
        assert holder.stdout.readline() == "fetching\n"
        os.kill(holder.pid, signal.SIGSTOP)
        cache = ShardCache(tmp_path, 1 << 20)
        with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
            first = Fetcher(data)
            assert cache.get("fp/s", 1000, first).to_pybytes() == data
            # the same holder is not waited for again: this wait would outlast the test
            monkeypatch.setattr(cache_locks, "NODE_LOCK_WAIT_SECONDS", 24 * 3600.0)
            again = Fetcher(data)
            assert cache.get("fp/s", 1000, again, copy_in_background=True).to_pybytes() == data
        assert first.calls == again.calls == 1 and cached_keys(cache) == set()
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and f"process {holder.pid} " in warned[0], warned
    finally:
        holder.kill()  # a stopped process dies too
        holder.wait()
    kept = Fetcher(data)
    assert cache.get("fp/s", 1000, kept).to_pybytes() == data
    assert kept.calls == 1 and cached_keys(cache) == {"fp/s"}


def test_concurrent_misses_of_one_key_fetch_once(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    data = payload("fp/s", 5000)
    calls = []

    def slow_fetch() -> bytes:
        calls.append(1)
        time.sleep(0.05)
        return data

    barrier = threading.Barrier(6)
    results = []

    def reader() -> None:
        barrier.wait()
        results.append(cache.get("fp/s", 5000, slow_fetch).to_pybytes())

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [data] * 6


def test_threads_and_processes_sharing_a_folder_stay_within_the_limit(tmp_path):
    caches = [ShardCache(tmp_path, 4000), ShardCache(tmp_path, 4000)]  # two "processes"
    errors = []

    def worker(n: int) -> None:
        try:
            for i in range(40):
                key = f"fp/s-{(n * 7 + i * 3) % 13}"
                size = 300 + (i * 37) % 500
                buffer, _ = get(caches[n % 2], key, size)
                assert buffer.to_pybytes() == payload(key, size)
        except Exception as e:  # reported below; a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert bytes_on_disk(tmp_path) <= 4000
    assert not [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(PART_SUFFIX)]


# -- copies written in the background ---------------------------------------------------------
class HeldCopies:
    """Makes a cache's copies wait for :meth:`release` before they are written."""

    def __init__(self, cache: ShardCache):
        self.go = threading.Event()
        store = cache._store

        def held_store(path, data):
            assert self.go.wait(120), "the test never released the copy"
            store(path, data)

        cache._store = held_store

    def release(self) -> None:
        self.go.set()


def test_a_background_copy_returns_the_bytes_first_and_keeps_the_copy_after(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    held = HeldCopies(cache)
    data = payload("fp/s", 5000)
    fetch = Fetcher(data)
    buffer = cache.get("fp/s", 5000, fetch, copy_in_background=True)
    assert buffer.to_pybytes() == data and fetch.calls == 1
    assert cached_keys(cache) == set()  # the copy is still held
    held.release()
    assert cache.wait_for_copies(timeout=120)
    assert cached_keys(cache) == {"fp/s"}
    again = Fetcher(data)
    assert cache.get("fp/s", 5000, again).to_pybytes() == data and again.calls == 0


def test_a_file_too_large_for_a_background_copy_is_copied_first(tmp_path, monkeypatch):
    from snapcache.store import cache as cache_module
    monkeypatch.setattr(cache_module, "BACKGROUND_COPY_BYTES", 1000)
    cache = ShardCache(tmp_path, 1 << 20)
    buffer, _ = get(cache, "fp/big", 1001)
    assert cached_keys(cache) == {"fp/big"}
    assert cache.get("fp/small", 1000, Fetcher(payload("fp/small", 1000)),
                     copy_in_background=True).size == 1000


def test_users_of_a_key_being_copied_wait_for_the_copy_instead_of_fetching(tmp_path):
    """Another thread, another cache object on the folder (as another process): both wait for
    the key's locks, which the background copy holds until the copy is in place."""
    cache = ShardCache(tmp_path, 1 << 20)
    held = HeldCopies(cache)
    data = payload("fp/s", 5000)
    cache.get("fp/s", 5000, Fetcher(data), copy_in_background=True)
    fetches, results = [], []

    def fail() -> bytes:
        fetches.append(1)
        return data

    def use(c: ShardCache) -> None:
        results.append(c.get("fp/s", 5000, fail).to_pybytes())

    users = [threading.Thread(target=use, args=(c,)) for c in (cache, ShardCache(tmp_path, 1 << 20))]
    for t in users:
        t.start()
    held.release()  # whenever the users got the locks, the copy was in place before
    for t in users:
        t.join()
    assert results == [data, data] and fetches == []


def test_discard_waits_for_a_background_copy_and_removes_it(tmp_path):
    cache = ShardCache(tmp_path, 1 << 20)
    held = HeldCopies(cache)
    cache.get("fp/s", 500, Fetcher(payload("fp/s", 500)), copy_in_background=True)
    done = threading.Event()
    discarder = threading.Thread(target=lambda: (cache.discard("fp/s"), done.set()))
    discarder.start()
    held.release()
    discarder.join()
    assert done.is_set() and cached_keys(cache) == set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_background_copy_holds_none_of_its_locks(tmp_path):
    """A DataLoader worker forked while its parent writes a copy: the child gets the same key
    (waiting for the parent's copy, never for locks of threads it does not have) and makes
    copies of its own."""
    import signal

    cache = ShardCache(tmp_path, 1 << 20)
    held = HeldCopies(cache)
    data = payload("fp/s", 5000)
    cache.get("fp/s", 5000, Fetcher(data), copy_in_background=True)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if everything holds
        status = 1
        try:
            signal.alarm(120)  # a deadlock fails the test instead of hanging it
            cache._store = ShardCache._store.__get__(cache)  # its copies are not held
            fetch = Fetcher(data)
            same = cache.get("fp/s", 5000, fetch).to_pybytes() == data and fetch.calls == 0
            other = Fetcher(payload("fp/t", 700))
            mine = cache.get("fp/t", 700, other, copy_in_background=True).size == 700
            status = 0 if same and mine and cache.wait_for_copies(120) else 2
        finally:
            os._exit(status)
    held.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.wait_for_copies(timeout=120)
    assert cached_keys(cache) == {"fp/s", "fp/t"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_a_thread_opens_a_lock_file_leaves_the_child_no_copy_of_it(tmp_path,
                                                                             monkeypatch):
    """A thread of the parent has opened a key's lock file and not yet locked it when another
    thread forks (a DataLoader starting workers while the loader's process fills the cache).
    The child must not keep a copy of that descriptor: the parent's lock would live on in it
    (a flock belongs to the open file) and the child, waiting for the same key, would wait for
    itself. The fork waits for the open to be recorded, and the child closes what it records."""
    import signal

    import xxhash

    from snapcache.store import cache as cache_module

    cache = ShardCache(tmp_path, 1 << 20)
    opened, forking = threading.Event(), threading.Event()
    real_open = os.open

    def slow_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if path.endswith(".lock") and threading.current_thread().name == "filler":
            opened.set()
            forking.wait(1.0)  # the fork comes while the descriptor is open, not locked
        return fd

    monkeypatch.setattr(cache_module.os, "open", slow_open)
    data = payload("fp/s", 3000)
    stripe = xxhash.xxh3_64_intdigest(b"fp/s") % cache_locks.LOCK_STRIPES
    same_stripe = next(f"fp/t{i}" for i in range(10_000)
                       if xxhash.xxh3_64_intdigest(f"fp/t{i}".encode()) %
                       cache_locks.LOCK_STRIPES == stripe)
    filler = threading.Thread(name="filler",
                              target=lambda: cache.get("fp/s", 3000, Fetcher(data)))
    filler.start()
    assert opened.wait(60)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if it gets the key
        status = 1
        try:
            signal.alarm(60)  # a leaked lock fails the test instead of hanging it
            os.close(write_end)
            os.read(read_end, 1)  # the parent has its copy and let go of the stripe's lock
            other = payload(same_stripe, 700)  # not cached: it takes the stripe's lock
            status = 0 if cache.get(same_stripe, 700, Fetcher(other)).to_pybytes() == other \
                else 2
        finally:
            os._exit(status)
    forking.set()
    filler.join(60)
    os.write(write_end, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_process_exiting_finishes_its_background_copies(tmp_path):
    import subprocess
    import sys
    import textwrap

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = textwrap.dedent("""
        import sys
        from snapcache.store.cache import ShardCache
        cache = ShardCache(sys.argv[1], 1 << 30)
        data = bytes(range(256)) * 40000
        cache.get("fp/s", len(data), lambda: data, copy_in_background=True)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert out.returncode == 0, out.stderr
    cache = ShardCache(tmp_path, 1 << 30)
    assert cached_keys(cache) == {"fp/s"}
    assert cache.get("fp/s", 256 * 40000, Fetcher(b"")).to_pybytes() == bytes(range(256)) * 40000


def test_a_multiprocessing_child_writes_its_copies_before_get_returns(tmp_path):
    """A DataLoader worker ends with os._exit, which would abandon a copy being written: in a
    process started by multiprocessing the copy is in place when ``get`` returns."""
    import multiprocessing

    context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    process = context.Process(target=_copy_in_a_child, args=(str(tmp_path),))
    process.start()
    process.join(300)
    assert process.exitcode == 0
    assert cached_keys(ShardCache(tmp_path, 1 << 20)) == {"fp/child"}


def _copy_in_a_child(directory: str) -> None:
    cache = ShardCache(directory, 1 << 20)
    cache.get("fp/child", 3000, Fetcher(payload("fp/child", 3000)), copy_in_background=True)
    if cached_keys(cache) != {"fp/child"}:
        os._exit(3)


_HOOK_CACHE: list = []


def _use_cache_before_fork():
    for cache, key, size in _HOOK_CACHE:
        cache.peek(key, size)  # takes the cache's lock on the forking thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_use_cache_before_fork)  # runs before the cache's own hook


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_hook_that_uses_the_cache_after_its_own_does_not_deadlock(tmp_path):
    """The cache holds its lock across a fork; a hook running on the forking thread after
    that (registered before the cache module, or a fork from inside one) may still use it."""
    from snapcache.store import cache as cache_module

    cache = ShardCache(tmp_path, 1 << 20)
    data = payload("fp/s", 100)
    cache.get("fp/s", 100, Fetcher(data))
    forked = []

    def fork():
        cache_module._before_fork()  # as if the cache's hook had run first
        try:
            _use_cache_before_fork()
        finally:
            cache_module._after_fork_in_parent()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

    _HOOK_CACHE.append((cache, "fp/s", 100))
    try:
        thread = threading.Thread(target=fork, daemon=True)
        thread.start()
        thread.join(60)
    finally:
        _HOOK_CACHE.clear()
    assert forked == [0]
