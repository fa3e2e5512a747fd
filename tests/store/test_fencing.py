"""Fenced commits and liveness, with real processes and signals: a writer paused past its
lease's ttl never commits what is gone or what another writer owns; a heartbeat from a clock
ahead of ours or from another pid namespace is judged by our own clock; a malformed lease
breaks nothing but itself.

Pauses are made deterministic with files: the child writes ``ready`` once a shard is finished
and waits for ``go`` before its next example; the parent stops it (SIGSTOP) and lets the
lease's ttl pass by watching the lease file stop changing, never by asserting a duration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import snapcache as sc
from snapcache.errors import LeaseLostError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import ShardInfo
from snapcache.store.protocol import BOOT, HOST, LeaseInfo, WriteLease, write_leases
from snapcache.store.reader import SnapshotReader, load_manifest
from snapcache.store.protocol import StreamRecord, write_marker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTL = 1.0
LIVE_TTL = 4.0  # a live holder beats every 0.1 s: a ttl far above any scheduling delay

WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import snapcache as sc

    root, n = sys.argv[1], int(sys.argv[3])
    os.environ["PAUSE_FLAGS"], os.environ["PAUSE_AT"] = sys.argv[2], sys.argv[4]

    def make(i):  # where and when to pause are read from the environment: not fingerprinted
        if i == int(os.environ["PAUSE_AT"]):
            flags = os.environ["PAUSE_FLAGS"]
            open(os.path.join(flags, "ready"), "w").close()
            while not os.path.exists(os.path.join(flags, "go")):
                time.sleep(0.01)
        return {"x": np.full((64,), i, np.float32), "i": i}

    ds = sc.Dataset.range(n).map(make).snapshot(root, shard_size=1500, lease_ttl=%(ttl)r,
                                                progress=False)
    seen = [int(e["i"]) for e in ds]
    print("SEEN", len(seen), len(set(seen)), flush=True)
""" % {"ttl": TTL})


def start_writer(tmp_path, root, n=300, pause_at=120, name="w"):
    flags = tmp_path / f"flags-{name}"
    flags.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), root, str(flags), str(n), str(pause_at)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (flags / "ready").exists() or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    return proc, flags


def wait_for(condition, limit=120.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


def folder_of(root):
    (name,) = [n for n in Storage(root).listdir() if layout.is_fingerprint(n)]
    return Storage(root).child(name)


def past_ttl(folder):
    """Until the writer's lease file has not changed for more than its ttl (it is stopped)."""
    def stamp():
        return [(f.path, f.mtime, f.size) for f in folder.walk() if f.path.startswith("lease-")]
    last, since = stamp(), time.monotonic()
    while time.monotonic() - since <= 2 * TTL:
        time.sleep(0.05)
        now = stamp()
        if now != last:
            last, since = now, time.monotonic()


def readable(root):
    """The committed snapshot reads back whole, or there is none; never a manifest listing
    missing shards."""
    for name in Storage(root).listdir():
        if not layout.is_fingerprint(name):
            continue
        folder = Storage(root).child(name)
        manifest = load_manifest(folder)
        if manifest is not None:
            rows = [int(e["i"]) for e in SnapshotReader(folder, manifest)]
            assert sorted(rows) == list(range(manifest.num_examples))


def test_a_writer_paused_past_its_ttl_while_purge_deletes_the_folder_commits_nothing(tmp_path):
    root = str(tmp_path / "snaps")
    proc, flags = start_writer(tmp_path, root)
    folder = folder_of(root)
    assert any(n.endswith(layout.SHARD_SUFFIX) for n in folder.listdir())  # a shard is done
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        past_ttl(folder)
        purge = subprocess.run([sys.executable, "-m", "snapcache.cli.main", "purge", "--root",
                                root, "--incomplete", "--yes"], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
        assert purge.returncode == 0, purge.stderr
        assert not folder.exists(), purge.stdout
    finally:
        (flags / "go").touch()
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, out
    assert "commits nothing" in err and "LeaseLostError" in err, err[-2000:]
    assert load_manifest(folder) is None
    readable(root)
    # and the next run builds it whole
    ds = sc.Dataset.range(300).map(lambda i: i).snapshot(str(tmp_path / "other"))
    assert list(ds) == list(range(300))


def test_a_writer_taken_over_while_paused_reads_the_committed_snapshot_instead(tmp_path):
    root = str(tmp_path / "snaps")
    first, flags = start_writer(tmp_path, root, name="a")
    folder = folder_of(root)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        past_ttl(folder)
        second, second_flags = None, tmp_path / "flags-b"
        second_flags.mkdir()
        (second_flags / "go").touch()  # the second writer does not pause
        env = {**os.environ, "PYTHONPATH": REPO}
        second = subprocess.run([sys.executable, str(tmp_path / "writer.py"), root,
                                 str(second_flags), "300", "120"], env=env,
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-2000:]
        assert "SEEN 300 300" in second.stdout
        assert load_manifest(folder) is not None
    finally:
        (flags / "go").touch()
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert "SEEN 300 300" in out  # its whole epoch, each example once
    assert "taken over by" in err and "goes on reading" in err, err[-2000:]
    readable(root)
    assert len(load_manifest(folder).shards) > 0


def test_a_stale_stream_writer_never_replaces_the_marker_of_the_one_that_took_over(tmp_path):
    folder = Storage(str(tmp_path)).child("0" * 32)
    stale = WriteLease.acquire(folder, run_id="0ld0ld00", stream=0, streams=2, ttl=TTL)
    stale._heartbeat.stop()  # paused: it stops heart-beating
    wait_for(lambda: WriteLease.acquire(folder, run_id="feedf00d", stream=0, streams=2,
                                        ttl=TTL) is not None
             if not [x for x in write_leases(folder) if x.owner == "feedf00d"] else True)
    (new,) = [x for x in write_leases(folder) if x.owner == "feedf00d"]
    assert new.generation == stale.info.generation + 1
    mine = StreamRecord(0, 2, "feedf00d", (), None)
    write_marker(folder, mine)
    before = folder.read_bytes(layout.marker_name(2, 0))
    with pytest.raises(LeaseLostError, match=r"taken over by .* \(generation 2"):
        write_marker(folder, StreamRecord(0, 2, "0ld0ld00", (), None), stale)
    assert folder.read_bytes(layout.marker_name(2, 0)) == before


def test_a_lease_rewritten_by_a_heartbeat_resuming_after_the_commit_fences_nothing(tmp_path):
    """The writer is stopped inside its heartbeat, between the check and the write; the one
    that took over commits and releases; resuming, the heartbeat rewrites the old lease file,
    which then looks current. Its marker is still refused, and its release removes the file."""
    from snapcache.store.protocol.lease import _heartbeat

    folder = Storage(str(tmp_path)).child("3" * 32)
    stale = WriteLease.acquire(folder, run_id="0ld0ld00", ttl=TTL)
    stale._heartbeat.stop()  # stopped (the check of its next beat has passed)
    taken = []
    wait_for(lambda: taken.append(WriteLease.acquire(folder, run_id="feedf00d", ttl=TTL))
             or taken[-1] is not None)
    new = taken[-1]
    write_marker(folder, StreamRecord(0, 1, "feedf00d", (), None), new)
    folder.create_exclusive(layout.MANIFEST, b"{}")  # what try_commit does, then cleans up:
    folder.remove(layout.marker_name(1, 0))
    new.release()
    _heartbeat(folder, stale.info)  # the resumed beat writes the old generation's file again
    stale.check()  # the lease alone cannot tell: its file is back and no newer one is left
    with pytest.raises(LeaseLostError, match="taken over by another writer, which has committed"):
        write_marker(folder, StreamRecord(0, 1, "0ld0ld00", (), None), stale)
    assert not folder.exists(layout.marker_name(1, 0))
    stale.lost = "taken over"
    stale.release()
    assert write_leases(folder) == []


def test_a_writer_whose_shards_the_takers_commit_cleaned_up_is_told_it_was_taken_over(
        tmp_path):
    """Found in a CI run: a writer stopped inside its heartbeat (after the check, before the
    write) past its lease's ttl. The writer that took over committed, removed the stopped one's
    shards (listed by no manifest) and released its lease; resuming, the beat wrote the old
    lease file again, so the lease looked like the stopped writer's and only the manifest said
    otherwise. It failed with "shards this writer finished are gone ... purged or damaged",
    not as taken over."""
    from snapcache.store.protocol.lease import _heartbeat

    folder = Storage(str(tmp_path)).child("5" * 32)
    stale = WriteLease.acquire(folder, run_id="0ld0ld00", ttl=TTL)
    stale._heartbeat.stop()
    folder.write_atomic("0ld0ld00-0000-000000.arrow", b"x" * 10)
    shard = ShardInfo("0ld0ld00-0000-000000.arrow", rows=1, bytes=10, checksum="xxh3_64:0")
    taken = []
    wait_for(lambda: taken.append(WriteLease.acquire(folder, run_id="feedf00d", ttl=TTL))
             or taken[-1] is not None)
    folder.create_exclusive(layout.MANIFEST, b"{}")  # its commit, then its clean-up:
    folder.remove("0ld0ld00-0000-000000.arrow")
    taken[-1].release()
    _heartbeat(folder, stale.info)  # the resumed beat writes the old generation's file again
    stale.check()  # the lease alone cannot tell
    with pytest.raises(LeaseLostError, match="taken over by another writer, which has committed"):
        write_marker(folder, StreamRecord(0, 1, "0ld0ld00", (shard,), None), stale)
    assert not folder.exists(layout.marker_name(1, 0))
    stale.lost = "taken over"
    stale.release()


def test_a_heartbeat_resuming_after_purge_never_brings_the_folder_back(tmp_path):
    """Stopped inside its heartbeat (after the check, before the write) while purge removed the
    folder: the write fails instead of recreating it, and the next check finds the lease gone."""
    import shutil

    from snapcache.store.protocol.lease import _heartbeat

    folder = Storage(str(tmp_path)).child("4" * 32)
    stale = WriteLease.acquire(folder, run_id="0ld0ld00", ttl=TTL)
    stale._heartbeat.stop()
    shutil.rmtree(tmp_path / ("4" * 32))  # purge
    with pytest.raises(FileNotFoundError):
        _heartbeat(folder, stale.info)
    assert not folder.exists()
    with pytest.raises(LeaseLostError, match="is gone"):
        stale.check()


def test_a_dead_lease_with_a_heartbeat_from_the_future_is_taken_over_after_its_ttl(tmp_path):
    root = str(tmp_path)
    ds = sc.Dataset.range(20)
    folder = Storage(root).child(ds.fingerprint())
    folder.makedirs()
    future = LeaseInfo("write", "0badc0de", "elsewhere", 1, time.time() + 3600, TTL, 0, 1, 1,
                       name="lease-0001-0000-000001.json")
    folder.write_atomic(future.name, future.dumps())
    # before: waited for the hour of skew; now: one ttl of our own clock
    assert list(ds.snapshot(root, wait_timeout=120)) == list(range(20))
    assert load_manifest(folder) is not None


def test_a_live_writer_in_another_pid_namespace_is_not_judged_dead_by_its_pid(tmp_path):
    folder = Storage(str(tmp_path)).child("1" * 32)
    folder.makedirs()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    # Same host name (a container with host networking), a pid that does not exist here,
    # another pid namespace: its heartbeat, not its pid, says whether it lives.
    info = LeaseInfo("write", "c0ffee00", HOST, int(gone.stdout), time.time(), LIVE_TTL, 0, 1, 1,
                     name="lease-0001-0000-000001.json", pidns="4026531999", boot=BOOT)
    stop = threading.Event()

    def beat():
        beat_info = info
        while not stop.is_set():
            beat_info = LeaseInfo(**{**beat_info.__dict__, "beat": beat_info.beat + 1})
            folder.write_atomic(info.name, beat_info.dumps())
            stop.wait(0.1)

    folder.write_atomic(info.name, info.dumps())
    beating = threading.Thread(target=beat)
    beating.start()
    try:
        deadline = time.monotonic() + 2 * LIVE_TTL
        while time.monotonic() < deadline:  # several ttls: never taken while it beats
            assert WriteLease.acquire(folder, run_id="aaaaaaaa", ttl=LIVE_TTL) is None
            time.sleep(0.05)
    finally:
        stop.set()
        beating.join()
    taken = []
    wait_for(lambda: taken.append(WriteLease.acquire(folder, run_id="aaaaaaaa", ttl=LIVE_TTL))
             or taken[-1] is not None)
    assert taken[-1].info.generation == 2
    taken[-1].release()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pid namespaces are Linux's")
def test_a_lease_taken_in_a_real_other_pid_namespace_is_not_judged_by_pid(tmp_path):
    probe = subprocess.run(["unshare", "--pid", "--fork", "--map-root-user", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare --pid is not permitted here (the simulated case above covers it)")
    folder = str(tmp_path / ("2" * 32))
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from snapcache.store.fs import Storage\n"
            "from snapcache.store.protocol import WriteLease\n"
            "lease = WriteLease.acquire(Storage(%r), run_id='bbbbbbbb', ttl=%r)\n"
            "print(lease.info.pid, lease.info.pidns, flush=True)\n"
            "time.sleep(3600)\n") % (REPO, folder, TTL)
    child = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--map-root-user",
                              sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        pid, pidns = child.stdout.readline().split()
        assert int(pid) <= 2  # pid 1 (or 2) inside its namespace
        storage = Storage(folder)
        deadline = time.monotonic() + 3 * TTL
        while time.monotonic() < deadline:
            assert WriteLease.acquire(storage, run_id="cccccccc", ttl=TTL) is None
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # unshare and the holder inside its namespace
        child.wait()


def test_a_malformed_lease_is_a_corrupt_lease_for_its_snapshot_only(tmp_path):
    root = str(tmp_path)
    good = sc.Dataset.range(5).snapshot(root, progress=False)
    list(good)
    bad = sc.Dataset.range(7)
    folder = Storage(root).child(bad.fingerprint())
    folder.makedirs()
    folder.write_atomic("lease-0001-0000-000001.json",
                        json.dumps({"kind": "write", "owner": "x", "host": "h", "pid": "123",
                                    "heartbeat_at": 0, "ttl": 30}).encode())
    env = {**os.environ, "PYTHONPATH": REPO}
    listed = subprocess.run([sys.executable, "-m", "snapcache.cli.main", "ls", root, "--json"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    snaps = {s["id"]: s for s in json.loads(listed.stdout)["snapshots"]}
    assert snaps[bad.fingerprint()]["corrupt_leases"] == [
        "corrupt lease lease-0001-0000-000001.json: 'pid' is '123'"]
    assert snaps[good.fingerprint()]["state"] == "committed"
    table = subprocess.run([sys.executable, "-m", "snapcache.cli.main", "ls", root],
                           capture_output=True, text=True, env=env, timeout=120)
    assert "corrupt lease" in table.stdout
    purge = subprocess.run([sys.executable, "-m", "snapcache.cli.main", "purge", "--root", root,
                            "--incomplete", "--yes"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert purge.returncode == 0 and "TypeError" not in purge.stderr, purge.stderr
    # a writer of that snapshot takes it over once it has not changed for its lease_ttl
    assert list(bad.snapshot(root, lease_ttl=TTL, wait_timeout=120)) == list(range(7))
    assert list(good) == list(range(5))


def test_the_commit_cleanup_leaves_another_writers_temporary_files_alone(tmp_path):
    """A writer may be creating its stream marker (a temporary file, then a link) while the
    committer cleans up: removing that temporary file made its link fail (FileNotFoundError)."""
    from snapcache.store.manifest import Manifest
    from snapcache.store.protocol import cleanup

    folder = Storage(str(tmp_path)).child("f" * 32)
    folder.makedirs()
    in_flight = layout.tmp_name("stream-0002-0000.json")
    for name in ("stream-0002-0001.json", "progress-0002-0001-abcd.json", in_flight):
        (tmp_path / ("f" * 32) / name).write_bytes(b"{}")
    manifest = Manifest(fingerprint="f" * 32, schema=None, shards=(), compression="",
                        created_at="", committed_at="", writer={})
    removed = cleanup(folder, manifest)
    assert sorted(removed) == ["progress-0002-0001-abcd.json", "stream-0002-0001.json"]
    assert (tmp_path / ("f" * 32) / in_flight).exists()


GENERATOR_WRITER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import snapcache as sc
    from snapcache.store.protocol import records

    root, flags, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if os.environ.get("PAUSE_AFTER_FENCE"):  # stop right after the fence passed
        fence = records.fence

        def paused_fence(*args, **kwargs):
            fence(*args, **kwargs)
            open(os.path.join(flags, "fenced"), "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        records.fence = paused_fence

    def numbers():  # a generator: the stream cannot skip what a dead writer wrote
        yield from range(n)

    def make(i):
        if i == int(os.environ.get("PAUSE_AT", "-1")):
            open(os.path.join(os.environ["PAUSE_FLAGS"], "ready"), "w").close()
            while not os.path.exists(os.path.join(os.environ["PAUSE_FLAGS"], "go")):
                time.sleep(0.01)
        return {"x": np.full((64,), i, np.float32), "i": i}

    ds = sc.Dataset.from_generator(numbers).map(make).snapshot(
        root, shard_size=1500, lease_ttl=%(ttl)r, progress=False)
    seen = [int(e["i"]) for e in ds]
    print("SEEN", len(seen), len(set(seen)), flush=True)
""" % {"ttl": TTL})


def test_a_writer_paused_after_its_fence_breaks_nothing_of_the_one_that_took_over(tmp_path):
    """The fence is checked, then the stream marker created: a writer paused between the two
    (a GC, a VM) is taken over; the taker's source cannot skip, so it restarts, leaving the
    paused writer's shards in place. The paused writer then records its stream complete with
    shards that are all there, and commits; the taker's epoch reads on; the snapshot reads
    back whole."""
    root = str(tmp_path / "snaps")
    script = tmp_path / "generator_writer.py"
    script.write_text(GENERATOR_WRITER)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    flags_a, flags_b = tmp_path / "flags-a", tmp_path / "flags-b"
    flags_a.mkdir()
    flags_b.mkdir()

    def start(flags, **extra):
        return subprocess.Popen([sys.executable, str(script), root, str(flags), "300"],
                                env={**env, **extra}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    a = start(flags_a, PAUSE_AFTER_FENCE="1")
    b = None
    try:
        wait_for(lambda: (flags_a / "fenced").exists() or a.poll() is not None)
        assert a.poll() is None, a.communicate()
        folder = folder_of(root)
        past_ttl(folder)
        b = start(flags_b, PAUSE_AT="150", PAUSE_FLAGS=str(flags_b))
        wait_for(lambda: (flags_b / "ready").exists() or b.poll() is not None)
        assert b.poll() is None, b.communicate()  # b took the stream over and is writing
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out_a, err_a = a.communicate(timeout=300)
    assert a.returncode == 0 and "SEEN 300 300" in out_a, err_a[-2000:]
    assert load_manifest(folder) is not None  # a committed its complete stream
    (flags_b / "go").touch()
    out_b, err_b = b.communicate(timeout=300)
    assert b.returncode == 0 and "SEEN 300 300" in out_b, err_b[-2000:]
    readable(root)
    again = subprocess.run([sys.executable, str(script), root, str(flags_b), "300"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "SEEN 300 300" in again.stdout, again.stderr[-2000:]


def test_a_stream_marker_whose_shards_are_gone_is_written_again(tmp_path):
    """A marker listing shards that are gone (deleted by hand, or by a release that deleted a
    dead writer's shards on takeover) could never be committed: the next writer of the stream
    removes it under the stream's lease and writes the stream again."""
    root = str(tmp_path / "snaps")
    fn = lambda i: {"i": i}  # noqa: E731

    def pipeline():
        return sc.Dataset.range(40).map(fn).snapshot(root, shard_size=256, progress=False)
    it = pipeline().iterate(stream=(0, 2))
    assert sorted(int(e["i"]) for e in it) == list(range(0, 40, 2))  # stream 0 complete
    folder = folder_of(root)
    marker = load_markers_of(folder)
    gone = marker.shards[0].path
    folder.remove(gone)
    ds = pipeline()
    assert sorted(int(e["i"]) for e in ds.iterate(stream=(0, 2))) == list(range(0, 40, 2))
    assert sorted(int(e["i"]) for e in ds.iterate(stream=(1, 2))) == list(range(1, 40, 2))
    readable(root)
    assert sorted(int(e["i"]) for e in pipeline()) == list(range(40))


def load_markers_of(folder):
    from snapcache.store.protocol import load_markers
    return load_markers(folder, 2)[0]
