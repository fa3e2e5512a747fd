"""Several processes, one snapshot: leases, waiting, streams, crashes and resume."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import LeaseTimeoutError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol import LeaseInfo, WriteLease, live_leases
from snapcache.store.reader import SnapshotReader, load_manifest

WORKER = textwrap.dedent('''
    import json, os, sys, time
    import numpy as np
    import snapcache as sc

    root, n, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    on_busy = sys.argv[4] if len(sys.argv) > 4 else "wait"
    calls = [0]

    def expensive(i):
        calls[0] += 1
        time.sleep(delay)
        return {"x": np.arange(i % 7, dtype=np.int64) + i, "i": i}

    import snapcache.fingerprint
    snapcache.fingerprint.register(list, lambda v: "call-log")  # `calls` is bookkeeping
    ds = sc.Dataset.range(n).map(expensive).snapshot(root, shard_size=2048, on_busy=on_busy,
                                                     lease_ttl=30)  # no takeover wanted here
    out = [(e["i"], int(e["x"].sum())) for e in ds]
    print(json.dumps({"calls": calls[0], "data": out}), flush=True)
''')


def expected(n):
    return [[i, int((np.arange(i % 7) + i).sum())] for i in range(n)]


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def run_many(worker, root, count, n, delay, on_busy="wait"):
    procs = [subprocess.Popen([sys.executable, worker, root, str(n), str(delay), on_busy],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def committed(root):
    storage = Storage(root)
    return [name for name in storage.listdir()
            if layout.is_fingerprint(name) and load_manifest(storage.child(name))]


def test_eight_processes_one_writer_everyone_reads(worker, tmp_path):
    root = str(tmp_path / "snaps")
    results = run_many(worker, root, 8, 120, 0.005)
    assert sum(r["calls"] for r in results) == 120, "the expensive map runs once per example"
    for r in results:
        assert r["data"] == expected(120)
    assert len(committed(root)) == 1


def test_on_busy_compute_computes_without_writing(tmp_path):
    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(50).map(lambda i: i * 3)
    folder = Storage(root).child(ds.fingerprint())
    lease = WriteLease.acquire(folder, run_id="deadbeef", ttl=60)
    lease.thread = None  # as if another thread held it (a thread never waits on its own
    try:                 # leases: see tests/pipeline/test_lifecycle.py)
        out = list(ds.snapshot(root, on_busy="compute"))
        assert out == [i * 3 for i in range(50)]
        assert load_manifest(folder) is None
        with pytest.raises(LeaseTimeoutError, match="being written by .* on_busy='compute'"):
            list(ds.snapshot(root, wait_timeout=0.3))
    finally:
        lease.release()
    assert list(ds.snapshot(root)) == [i * 3 for i in range(50)]
    assert load_manifest(folder) is not None


def test_waiter_reads_once_the_writer_commits(tmp_path, counter):
    root = str(tmp_path / "snaps")

    def slow(i):
        counter.hit()
        time.sleep(0.002)
        return i

    results = {}

    def run(name):
        results[name] = list(sc.Dataset.range(200).map(slow).snapshot(root))

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == list(range(200)) for v in results.values())
    assert counter.count == 200


def dead_lease(folder, *, host, pid, age, ttl=1.0, generation=1, **where):
    info = LeaseInfo("write", "0badc0de", host, pid, time.time() - age, ttl, 0, 1, generation,
                     name=f"lease-0001-0000-{generation:06d}.json", **where)
    folder.makedirs()
    folder.write_atomic(info.name, info.dumps())
    return info


def test_dead_writer_lease_is_taken_over(tmp_path):
    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(10)
    folder = Storage(root).child(ds.fingerprint())
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    from snapcache.store.protocol import BOOT, HOST, PIDNS

    # fresh heartbeat, dead pid of this machine, pid namespace and boot: taken over at once
    dead_lease(folder, host=HOST, pid=int(proc.stdout), age=0, ttl=3600, pidns=PIDNS, boot=BOOT)
    assert list(ds.snapshot(root, wait_timeout=60)) == list(range(10))
    # another host: taken over once it has not changed for its ttl by our clock
    dead_lease(Storage(root).child(sc.Dataset.range(11).fingerprint()), host="elsewhere",
               pid=1, age=60)
    assert list(sc.Dataset.range(11).snapshot(root, wait_timeout=60)) == list(range(11))
    assert len(committed(root)) == 2
    assert not [lease for name in committed(root) for lease in
                live_leases(Storage(root).child(name))]


def test_lease_generations_are_exclusive(tmp_path):
    folder = Storage(str(tmp_path)).child("0" * 32)
    winners = []

    def grab(i):
        lease = WriteLease.acquire(folder, run_id=f"{i:08x}", ttl=30)
        if lease is not None:
            winners.append(lease)

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    winners[0].release()
    assert WriteLease.acquire(folder, run_id="00000099", ttl=30) is not None


def test_streams_commit_once_and_split_reads(tmp_path, counter):
    root = str(tmp_path / "snaps")

    def f(i):
        counter.hit()
        return {"i": i, "v": np.full(3, i)}

    ds = sc.Dataset.range(101).map(f).snapshot(root, shard_size=1024)
    seen = {}

    def stream(k):
        seen[k] = [e["i"] for e in ds.iterate(epoch=0, stream=(k, 3))]

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.count == 101
    assert sorted(i for part in seen.values() for i in part) == list(range(101))
    assert seen[1] == list(range(1, 101, 3))
    (name,) = committed(root)
    manifest = load_manifest(Storage(root).child(name))
    assert manifest.num_examples == 101
    # reading back: each stream a contiguous, disjoint third; together everything once
    parts = [[e["i"] for e in ds.iterate(stream=(k, 3))] for k in range(3)]
    assert counter.count == 101
    assert sorted(sum(parts, [])) == list(range(101))
    assert all(len(p) in (33, 34) for p in parts)
    assert [e["i"] for e in ds] == [i for k in range(3) for i in range(k, 101, 3)]


KILLABLE = textwrap.dedent('''
    import sys, time
    import numpy as np
    import snapcache as sc

    root, n = sys.argv[1], int(sys.argv[2])
    calls = []

    def expensive(i):
        calls.append(i)
        time.sleep(0.002)
        return {"x": np.full(50, i, dtype=np.int32), "s": str(i)}

    import snapcache.fingerprint
    snapcache.fingerprint.register(list, lambda v: "call-log")
    ds = sc.Dataset.range(n).map(expensive).snapshot(root, shard_size=4096, lease_ttl=2)
    count = 0
    for e in ds:
        assert int(e["x"][0]) == count and e["s"] == str(count), (count, e)
        count += 1
    assert count == n
    print("done", len(calls), flush=True)
''')


def check_root(root, n):
    """Whatever a kill left: either no snapshot, or a complete and correct one."""
    for name in committed(root):
        folder = Storage(root).child(name)
        reader = SnapshotReader(folder, load_manifest(folder))
        assert [int(e["x"][0]) for e in reader] == list(range(n))


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_random_points_never_corrupts_and_resumes(tmp_path, seed):
    kill_and_resume(tmp_path, seed, kills=4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 12))
def test_sigkill_stress(tmp_path, seed):
    kill_and_resume(tmp_path, seed, kills=10, n=1500)


def progress_records(root):
    """Names of the progress records (finished shards of a writer run) under ``root``."""
    return {name for _, _, files in os.walk(root) for name in files
            if name.startswith("progress-")}


def wait_for_new_progress(proc, root, seen, deadline=120.0):
    """Block until ``proc`` has recorded a finished shard that was not in ``seen`` (or has
    exited). A bounded wait for an event, not a timing assumption."""
    end = time.monotonic() + deadline
    while time.monotonic() < end and proc.poll() is None:
        if progress_records(root) - seen:
            return
        time.sleep(0.01)


def kill_and_resume(tmp_path, seed, kills, n=400):
    """Each run is killed at a random moment after it finished at least one shard of its own,
    so the final run must reuse finished shards, however slow the machine is."""
    rng = random.Random(seed)
    script = tmp_path / "killable.py"
    script.write_text(KILLABLE)
    root = str(tmp_path / "snaps")
    for _ in range(kills):
        seen = progress_records(root)
        proc = subprocess.Popen([sys.executable, str(script), root, str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for_new_progress(proc, root, seen)
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere later in the run: any point must be safe
        proc.send_signal(signal.SIGKILL)
        # killed, or finished first; a run that failed on its own would leave the kills untested
        assert proc.wait() in (0, -signal.SIGKILL), proc.stderr.read().decode()
        check_root(root, n)
    done = subprocess.run([sys.executable, str(script), root, str(n)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[1]) < n, "the killed runs' finished shards were reused"
    assert len(committed(root)) == 1
    check_root(root, n)


def test_streams_read_back_exactly_what_they_wrote(tmp_path, counter):
    """Written by 2 streams, read by 2 streams: each gets the same examples in both epochs,
    so a worker's share never depends on whether the snapshot was committed."""
    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(50).map(lambda i: (counter.hit(), i)[1]).snapshot(root, shard_size=256)
    first = {}
    threads = [threading.Thread(target=lambda k=k: first.__setitem__(
        k, list(ds.iterate(epoch=0, stream=(k, 2))))) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    second = {k: list(ds.iterate(epoch=1, stream=(k, 2))) for k in range(2)}
    assert first == second == {0: list(range(0, 50, 2)), 1: list(range(1, 50, 2))}
    assert counter.count == 50
    # read by 3 streams: contiguous thirds, everything once
    parts = [list(ds.iterate(stream=(k, 3))) for k in range(3)]
    assert sorted(sum(parts, [])) == list(range(50))


def test_a_finished_stream_replays_its_shards_while_others_are_pending(tmp_path, counter):
    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(20).map(lambda i: (counter.hit(), i)[1]).snapshot(root)
    assert list(ds.iterate(epoch=0, stream=(0, 2))) == list(range(0, 20, 2))
    assert list(ds.iterate(epoch=1, stream=(0, 2))) == list(range(0, 20, 2))  # no waiting
    assert counter.count == 10 and committed(root) == []
    assert list(ds.iterate(epoch=1, stream=(1, 2))) == list(range(1, 20, 2))
    assert len(committed(root)) == 1 and counter.count == 20


def test_streams_over_a_batching_upstream_let_one_stream_write(tmp_path, counter):
    """batch before the snapshot is not element-wise: N streams writing their shares would
    batch differently than one writer, so one stream writes and all read their share."""
    root = str(tmp_path / "snaps")
    ds = sc.Dataset.range(40).map(lambda i: (counter.hit(), i)[1]).batch(4).snapshot(root)
    got = {}
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(
        k, [b.tolist() for b in ds.iterate(epoch=0, stream=(k, 2))])) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.count == 40
    single = [b.tolist() for b in sc.Dataset.range(40).batch(4)]
    assert got[0] + got[1] == single


HOLDER = textwrap.dedent('''
    import sys, time
    import snapcache as sc

    ds = sc.Dataset.range(50).snapshot(sys.argv[1], lease_ttl=1, progress=False)
    it = iter(ds)
    next(it)  # holds the write lease, then stops advancing: a loop left unfinished
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes it (or kills this process)
''')


def test_a_writer_left_unadvanced_in_another_process_is_not_waited_for(tmp_path, caplog):
    """Another process holds the snapshot's lease with an iteration it no longer advances (the
    workers of a DataLoader still referenced after its loop stopped): its heartbeat goes on,
    so the lease never expires. A reader computes without writing instead of waiting for
    ever, and says who holds it; once the holder is gone, the next epoch writes."""
    root = str(tmp_path / "snaps")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        ds = sc.Dataset.range(50).snapshot(root, lease_ttl=1, progress=False)
        with caplog.at_level("WARNING", logger="snapcache"):
            assert list(ds) == list(range(50))
        assert f"pid {holder.pid}, which has not written for" in caplog.text
        assert "computing without writing" in caplog.text and committed(root) == []
    finally:
        holder.kill()
        holder.wait()
    assert list(ds) == list(range(50)) and len(committed(root)) == 1


def test_waiting_for_a_commit_that_a_stalled_writer_holds_up_says_so(tmp_path, caplog):
    """A seeded shuffle's writing epoch completes the snapshot, then reads it in its order:
    it waits for the commit. When the writer holding it has stopped writing, the wait says
    who holds it and what to do, and wait_timeout bounds it."""
    root = str(tmp_path / "snaps")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        ds = sc.Dataset.range(50).snapshot(root, lease_ttl=1, wait_timeout=4,
                                           progress=False).shuffle(10, seed=1)
        with caplog.at_level("WARNING", logger="snapcache"):
            with pytest.raises(LeaseTimeoutError, match="did not commit within wait_timeout"):
                list(ds)
        assert "writers have stopped writing it" in caplog.text
        assert f"pid {holder.pid} (not written for" in caplog.text
    finally:
        holder.kill()
        holder.wait()
