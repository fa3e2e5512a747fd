"""A resume never skips by count after an op that does not keep the order.

Found: with ``map(..., deterministic=False)`` upstream, a run killed after finishing a shard was
resumed by skipping "rows written" source examples; but those rows were the first to *complete*,
not the first source examples, so the committed snapshot had duplicated and missing ids. The
map's traits now say it is not order-preserving, so the resumed stream restarts instead.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time

import snapcache as sc
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader, load_manifest

N = 120

CHILD = textwrap.dedent('''
    import os, sys, time
    import snapcache as sc

    root, n, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def slow_then_gated(i):
        # Every 4th id finishes late, so outputs come out of source order; the second half
        # waits for the gate file, so the first run can only finish shards of the first half.
        if i >= n // 2:
            while not os.path.exists(gate):
                time.sleep(0.01)
        if i % 4 == 0:
            time.sleep(0.03)
        return {"id": i}

    ds = (sc.Dataset.range(n)
          .map(slow_then_gated, num_parallel_calls=4, deterministic=False)
          .snapshot(root, shard_size=200, lease_ttl=2, progress=False))
    print("done", sum(1 for _ in ds), flush=True)
''')


def progress_records(root):
    return {name for _, _, files in os.walk(root) for name in files
            if name.startswith("progress-")}


def committed_ids(root):
    storage = Storage(root)
    folders = [name for name in storage.listdir()
               if layout.is_fingerprint(name) and load_manifest(storage.child(name))]
    assert len(folders) == 1, folders
    folder = storage.child(folders[0])
    return [int(e["id"]) for e in SnapshotReader(folder, load_manifest(folder))]


def test_sigkill_resume_after_an_unordered_map_commits_every_id_once(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = str(tmp_path / "snaps")
    gate = str(tmp_path / "gate")
    proc = subprocess.Popen([sys.executable, str(script), root, str(N), gate],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # The event: the writer recorded a finished shard (a progress record file). The child
        # cannot finish before the gate exists, so the kill always lands mid-run.
        end = time.monotonic() + 120
        while not progress_records(root):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "the child never finished a shard"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    open(gate, "w").close()
    done = subprocess.run([sys.executable, str(script), root, str(N), gate],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["done", str(N)]
    ids = committed_ids(root)
    counts = collections.Counter(ids)
    assert sorted(counts) == list(range(N)), f"missing ids: {set(range(N)) - set(counts)}"
    assert max(counts.values()) == 1, \
        f"duplicated ids: {sorted(i for i, c in counts.items() if c > 1)}"


def test_an_ordered_map_still_resumes_by_count(tmp_path):
    """The restart is reserved for unordered upstreams: an ordered map keeps skipping."""
    from snapcache.pipeline.ops import resumable

    ds = sc.Dataset.range(10).map(str)
    assert resumable(ds._op)
    assert not resumable(sc.Dataset.range(10).map(str, deterministic=False)._op)
