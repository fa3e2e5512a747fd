"""A pipeline object held across epochs keeps one read lease for its snapshot (renewed in the
background) instead of taking and releasing one every epoch; it goes when the pipeline object
is collected, or at exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import snapcache as sc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_leases(root) -> list[str]:
    return sorted(name for _, _, files in os.walk(root) for name in files
                  if name.startswith("reader-"))


def test_a_held_pipeline_keeps_one_read_lease_across_epochs_until_collected(tmp_path):
    ds = sc.Dataset.range(100).snapshot(str(tmp_path), progress=False).batch(10)
    assert sum(len(b) for b in ds) == 100  # writes: no read lease
    assert read_leases(tmp_path) == []
    assert sum(len(b) for b in ds) == 100
    first = read_leases(tmp_path)
    assert len(first) == 1
    for _ in range(3):
        assert sum(len(b) for b in ds) == 100
    assert read_leases(tmp_path) == first  # the same lease, not one per epoch
    del ds
    gc.collect()
    # released on a thread of its own (a finalizer may run anywhere): wait for it
    deadline = time.monotonic() + 60
    while read_leases(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_leases(tmp_path) == []


def test_examples_and_batches_of_one_pipeline_share_its_lease(tmp_path):
    snap = sc.Dataset.range(50).snapshot(str(tmp_path), progress=False)
    list(snap)
    list(snap)
    list(snap.batch(5))
    list(snap.shuffle(10, seed=1))
    assert len(read_leases(tmp_path)) == 1


def test_a_held_read_lease_is_released_at_exit(tmp_path):
    script = textwrap.dedent("""
        import sys
        import snapcache as sc
        ds = sc.Dataset.range(20).snapshot(sys.argv[1], progress=False)
        list(ds)
        list(ds)
        print("read")
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0 and out.stdout.strip() == "read", out.stderr
    assert read_leases(tmp_path) == []
