"""A process that has read a snapshot holds a read lease on it for as long as its pipeline can
read it again: ``purge`` (without force) keeps it between epochs; the lease goes when the
pipeline is collected or the process exits; later epochs make no lease requests."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import snapcache as sc
from snapcache.store import protocol
from snapcache.store.protocol import lease as lease_module



def held(root):
    """This process's held read leases under ``root`` (earlier tests' pipelines that another
    framework keeps alive, such as a tf.data generator, may hold theirs)."""
    return [url for url in protocol.held_reads() if url.startswith(root)]

def files(root, prefix):
    return [n for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
            for n in os.listdir(os.path.join(root, d)) if n.startswith(prefix)]


def wait_until(condition, limit=60.0):
    """Poll: a collected pipeline's lease is released on a thread of its own."""
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def build(root, n=50):
    ds = sc.Dataset.range(n).map(lambda i: i * 2).snapshot(root, progress=False)
    assert list(ds) == [i * 2 for i in range(n)]   # writes
    return ds


def test_purge_keeps_a_snapshot_a_live_pipeline_read_between_epochs(tmp_path):
    root = str(tmp_path)
    ds = build(root)
    assert list(ds) == [i * 2 for i in range(50)]  # reads: takes the held read lease
    (info,) = sc.ls(root)
    assert [lease.pid for lease in info.live_leases if lease.kind == "read"] == [os.getpid()]
    report = sc.purge(root, ids=[info.id])
    assert not report.deleted and "read lease of pid" in report.kept[0].reason
    assert list(ds) == [i * 2 for i in range(50)]  # the next epoch still reads it

    del ds
    gc.collect()
    wait_until(lambda: files(root, "reader-") == [])   # released with the pipeline
    assert [item.snapshot.id for item in sc.purge(root, ids=[info.id]).deleted] == [info.id]


def test_later_epochs_make_no_lease_requests(tmp_path, monkeypatch):
    root = str(tmp_path)
    ds = build(root)
    taken = []
    real = lease_module.ReadLease.__init__

    def counting(self, *a, **kw):
        taken.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(lease_module.ReadLease, "__init__", counting)
    for _ in range(4):
        assert len(list(ds)) == 50
    assert len(taken) == 1                        # the first read; later epochs reuse it
    assert held(root) == [ds.open_snapshot().url]
    protocol.release_all()
    assert files(root, "reader-") == [] and held(root) == []


def test_a_read_takes_its_lease_and_records_its_use_without_syncing_the_disk(tmp_path,
                                                                           monkeypatch):
    """A read lease and the last-use record mean nothing once their process is gone (a torn
    one ages out, or reads as absent): written atomically but not fsynced, whose 2-40 ms on
    a busy disk every fresh process's first batch paid."""
    from snapcache.pipeline import snapshot_exec
    from snapcache.store import layout
    root = str(tmp_path)
    synced = []
    real = os.fsync

    def fsync(fd):  # only this test's files: other tests' background threads may sync theirs
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = root
        if path.startswith(root):
            synced.append(path)
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    ds = build(root)
    assert synced                                  # writing a snapshot syncs its files
    protocol.release_all()
    monkeypatch.setattr(snapshot_exec, "_last_used", {})
    synced.clear()
    fresh = build(root)                            # a fresh pipeline object reads it
    assert len(files(root, "reader-")) == 1 and files(root, layout.LAST_USED)
    assert synced == []
    del ds, fresh
    protocol.release_all()


def test_the_lease_is_released_at_exit_and_held_until_then(tmp_path):
    root = str(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        import snapcache as sc
        ds = sc.Dataset.range(50).map(lambda i: i * 2).snapshot({root!r}, progress=False)
        assert len(list(ds)) == 50    # writes
        assert len(list(ds)) == 50    # reads
        print("read", flush=True)
        sys.stdin.readline()          # hold the pipeline until the parent says so
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "read"
        (info,) = sc.ls(root)
        assert [lease.pid for lease in info.live_leases] == [child.pid]
        assert not sc.purge(root, ids=[info.id]).deleted
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
    assert files(root, "reader-") == []
    assert sc.purge(root, ids=[info.id]).deleted


def test_a_forced_purge_is_not_undone_by_the_heartbeat_and_the_next_epoch_rebuilds(tmp_path):
    root = str(tmp_path)
    ds = sc.Dataset.range(30).map(lambda i: i + 1).snapshot(root, progress=False,
                                                             lease_ttl=0.2)
    list(ds)
    list(ds)
    (info,) = sc.ls(root)
    assert sc.purge(root, ids=[info.id], force=True).deleted
    deadline = time.monotonic() + 60
    while held(root) and time.monotonic() < deadline:
        time.sleep(0.02)                           # the heartbeat notices the removal
    assert held(root) == []
    assert not os.path.exists(os.path.join(root, info.id))   # nothing written back
    assert list(ds) == [i + 1 for i in range(30)]  # rebuilt
    assert list(ds) == [i + 1 for i in range(30)]  # and read again under a new lease
    assert len(files(root, "reader-")) == 1
    protocol.release_all()


@pytest.mark.parametrize("where", ["s3"])
def test_held_read_lease_on_s3(where, request):
    root = request.getfixturevalue("s3_root")
    ds = sc.Dataset.range(20).map(lambda i: i * 3).snapshot(root, progress=False)
    list(ds)
    list(ds)
    (info,) = sc.ls(root)
    assert [lease.kind for lease in info.live_leases] == ["read"]
    assert not sc.purge(root, ids=[info.id]).deleted
    del ds
    gc.collect()
    wait_until(lambda: sc.ls(root)[0].live_leases == ())


class _Holder:
    """Stands for a pipeline that reads a snapshot (its read lease lives while it does)."""


def test_a_holder_collected_with_its_drop_pending_does_not_drop_a_new_holder_at_its_address(
        tmp_path, monkeypatch):
    """CPython reuses a collected object's address (its id) for a later object: a pipeline
    collected while its drop waited for a thread (a busy machine), then a new one at the same
    address, must leave the lease held for the new one. The suite found it: purge tidied an old
    version while a live pipeline held the lease. Both holders are given one id here (whether
    CPython reuses an address at a given moment depends on every other thread's allocations)."""
    from snapcache.store.fs import Storage
    from snapcache.store.protocol import reads

    storage = Storage(str(tmp_path / "snap"))
    storage.makedirs("")
    pending = []   # the drops of collected holders, run when the test says
    monkeypatch.setattr(reads, "_drop_later", lambda held, token: pending.append((held, token)))
    monkeypatch.setattr(reads, "id", lambda obj: 12345, raising=False)   # one address for all
    first = _Holder()
    assert protocol.hold_read(storage, ttl=3600, holder=first)
    assert not protocol.hold_read(storage, ttl=3600, holder=first)   # counted once
    del first
    gc.collect()
    assert len(pending) == 1
    second = _Holder()                 # at the collected one's address
    assert not protocol.hold_read(storage, ttl=3600, holder=second)   # the same lease
    held, token = pending.pop()
    held.drop(token)                   # the first holder's drop runs only now
    assert held.alive and storage.url in protocol.held_reads()
    del second
    gc.collect()
    held, token = pending.pop()
    held.drop(token)                   # the second's: the last holder gone, the lease too
    assert storage.url not in protocol.held_reads()


def test_a_reader_arriving_while_the_last_holders_lease_is_released_keeps_a_lease(
        tmp_path, monkeypatch):
    """The last holder's drop deletes the lease file while a new pipeline of the same process
    starts reading: the file has one name a process, so the new lease is written after that
    DELETE, not before it (the suite found it: purge tidied an old version a live pipeline
    had just read, its lease deleted under it)."""
    import threading

    from snapcache.store.fs import Storage
    from snapcache.store.protocol import reads

    storage = Storage(str(tmp_path / "snap"))
    storage.makedirs("")
    pending = []
    monkeypatch.setattr(reads, "_drop_later", lambda held, token: pending.append((held, token)))
    first = _Holder()
    assert protocol.hold_read(storage, ttl=3600, holder=first)
    (name,) = [n for n in storage.listdir() if n.startswith("reader-")]
    del first
    gc.collect()
    held, token = pending.pop()
    deleting, new_reader_asked = threading.Event(), threading.Event()
    real_remove = type(storage).remove

    def slow_remove(self, path, *args, **kwargs):
        deleting.set()
        new_reader_asked.wait(1.0)  # the DELETE is slow: a new reader comes meanwhile
        return real_remove(self, path, *args, **kwargs)

    monkeypatch.setattr(type(storage), "remove", slow_remove)
    drop = threading.Thread(target=held.drop, args=(token,))
    drop.start()
    assert deleting.wait(60)
    second = _Holder()
    assert protocol.hold_read(storage, ttl=3600, holder=second)   # a lease of its own
    new_reader_asked.set()
    drop.join(60)
    assert name in storage.listdir() and storage.url in protocol.held_reads()
    protocol.release_all()
    assert name not in storage.listdir()
    del second


@pytest.mark.parametrize("where", ["local", "s3"])
def test_purge_from_a_machine_whose_clock_runs_ahead_keeps_the_snapshots_in_use(
        where, request, tmp_path, monkeypatch, caplog):
    """A one-shot observer judges a lease file's modification time (the storage's clock) by
    the storage's clock: with this machine 90 s ahead of it (more than the lease ttl), every
    live lease looked expired and purge deleted the snapshot being read."""
    import types

    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_root")
    ds = build(root)
    assert list(ds) == [i * 2 for i in range(50)]  # reads: holds a read lease
    ahead = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if k[0] != "_"})
    ahead.time = lambda: time.time() + 90
    monkeypatch.setattr(lease_module, "time", ahead)
    monkeypatch.setattr(lease_module, "_offsets", {})
    with caplog.at_level("WARNING", logger=lease_module.log.name):
        report = sc.purge(root, max_size=1)
    assert not report.deleted and "read lease of pid" in report.kept[0].reason
    assert re.search(r"differs from this machine's by -9[01] s", caplog.text)  # (S3: whole s)
    assert list(ds) == [i * 2 for i in range(50)]
    monkeypatch.setattr(lease_module, "time", time)  # (not undo(): s3_root's env stays)
    del ds
    gc.collect()
    wait_until(lambda: sc.ls(root)[0].live_leases == ())  # released on a thread of its own
    assert len(sc.purge(root, max_size=1).deleted) == 1  # once no longer read, it goes
