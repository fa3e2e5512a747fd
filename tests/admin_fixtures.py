"""Building blocks for the admin API and CLI tests: real snapshots, abandoned writes, leases,
old last-use times, and the console script in a subprocess. Work on local and S3 roots."""

from __future__ import annotations

import gc
import threading
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import numpy as np

import snapcache as sc
from snapcache.store.fs import Storage
from snapcache.store.protocol import HOST, LeaseInfo


def make_snapshot(root: str, name: str, n: int = 40, *, width: int = 16,
                  shard_size: int = 4096) -> str:
    """Commit a snapshot of ``n`` examples named ``name`` (keyed by it) and return its id."""
    ds = (sc.Dataset.range(n).map(lambda i: expected_example(i, width))
          .snapshot(root, name=name, key=name, shard_size=shard_size))
    assert [e["i"] for e in ds] == list(range(n))
    return sc.Dataset.range(1).snapshot(root, key=name).explain().fingerprint


def expected_example(i: int, width: int = 16) -> dict:
    """Incompressible (random, seeded by ``i``), so sizes and shard counts are predictable."""
    return {"x": np.random.default_rng(i).integers(0, 2**62, width), "i": i}


def set_last_used(root: str, fingerprint: str, days_ago: float) -> None:
    at = datetime.now(timezone.utc) - timedelta(days=days_ago)
    Storage(root).child(fingerprint).write_atomic(
        "last-used.json", json.dumps({"at": at.isoformat()}).encode())


def abandoned_write(root: str, fingerprint: str, *, shard_bytes: int = 3000,
                    age: float = 600.0) -> None:
    """What a writer on another host that died ``age`` seconds ago leaves: a shard, a progress
    record and its expired lease, no manifest."""
    folder = Storage(root).child(fingerprint)
    folder.makedirs()
    folder.write_atomic("0badc0de-0000-000000.arrow", b"\0" * shard_bytes)
    folder.write_atomic("progress-0001-0000-0badc0de.json", b"{}")
    # Its ttl is long past by any clock: a short ttl, and (on local disk) an old file.
    lease = LeaseInfo("write", "0badc0de", "elsewhere", 1, time.time() - age, 0.01, 0, 1, 1,
                      name="lease-0001-0000-000001.json")
    folder.write_atomic(lease.name, lease.dumps())
    if folder.local:
        old = time.time() - age
        for name in folder.listdir():
            os.utime(os.path.join(folder.root, name), (old, old))


def live_lease(root: str, fingerprint: str, kind: str = "read") -> str:
    """A fresh lease held by this (living) process; returns its file name."""
    if kind == "read":
        info = LeaseInfo("read", "feedf00d", HOST, os.getpid(), time.time(), 300.0,
                         name="reader-feedf00d.json")
    else:
        info = LeaseInfo("write", "feedf00d", HOST, os.getpid(), time.time(), 300.0, 0, 1, 1,
                         name="lease-0001-0000-000001.json")
    folder = Storage(root).child(fingerprint)
    folder.makedirs()
    folder.write_atomic(info.name, info.dumps())
    return info.name


def exists(root: str, fingerprint: str, name: str = "") -> bool:
    return Storage(root).child(fingerprint).exists(name)


def run_cli(*args: str, stdin: str | None = None, timeout: float = 120,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``snapcache ARGS...`` in a subprocess (inherits os.environ, so S3 settings too)."""
    return subprocess.run([sys.executable, "-m", "snapcache.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          env={**os.environ, **(env or {})})


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("snapcache ") and ": error: " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def two_versions(tmp_path, root: str) -> tuple[str, str]:
    """A delta snapshot (a file source, the default) with versions 1 and 2: version 2 changed
    a file and added one, so a shard of version 1 is listed by version 1 only. Returns its id
    and its folder."""
    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):
        np.save(files / f"f{i:02d}.npy", np.full(4, i))
    for version in (1, 2):
        if version == 2:
            np.save(files / "f00.npy", np.full(5, 100))  # changed: its segment is copied
            np.save(files / "f10.npy", np.full(4, 10))
        ds = sc.Dataset.from_files(str(files / "*.npy")).map(np.load).snapshot(
            root, name="logs", progress=False)
        assert len(list(ds)) == 4 + version - 1
        del ds  # a pipeline that can read again holds a read lease: let it go
        gc.collect()
        for thread in threading.enumerate():  # its release runs on a thread: wait for it
            if thread.name == "snapcache-release-read-lease":
                thread.join()
    [snap] = [s for s in sc.ls(root) if s.name == "logs"]
    assert snap.versions == (1, 2)
    return snap.id, os.path.join(root, snap.id)


STOPPED_WRITER = '''
import os, signal, sys
import numpy as np
import snapcache as sc
root, n, ttl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ds = sc.Dataset.range(n).map(lambda i: {"i": i, "x": np.full(2048, i % 251, np.uint8)}
                             ).snapshot(root, progress=False, shard_size=1 << 14,
                                        lease_ttl=ttl)
for k, _ in enumerate(ds):
    if k == 200:  # the write is under way: its lease is live, shards are written
        print("PAUSED", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
'''


def stopped_writer(root: str, n: int, ttl: float = 600.0) -> subprocess.Popen:
    """A process writing a snapshot of ``n`` examples, stopped (SIGSTOP) half-way with its
    write lease live: SIGKILL it to leave an abandoned write, SIGCONT and kill to end it."""
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_WRITER, root, str(n), str(ttl)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "PAUSED"
    return proc


def end(proc: subprocess.Popen) -> None:
    """Kill a (possibly stopped) process and reap it."""
    proc.kill()
    proc.wait()
