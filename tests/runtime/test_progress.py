"""The writing epoch's progress, as a user sees it with no optional package and no logging set
up: a bar on a terminal (a real pty), lines on a non-terminal, one report for all DataLoader
workers, silence with progress=False. Every case runs a real subprocess."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import sys, numpy as np, snapcache as sc
import snapcache.runtime.progress as progress
progress.LOG_SECONDS = 0.0     # a line at every update: the test does not wait for 10 s
root, n, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ds = sc.Dataset.range(n).map(lambda i: np.full(1000, i % 7, np.uint8)).snapshot(
    root, name="demo", shard_size=4096, progress=(setting == "on"))
assert sum(1 for _ in ds) == n
"""


def _env() -> dict:
    env = dict(os.environ)
    env.pop("SNAPCACHE_ROOT", None)
    return env


def run_script(tmp_path, n: int, setting: str = "on") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "snaps"), str(n),
                           setting], capture_output=True, text=True, env=_env(), timeout=120)


def test_lines_on_a_non_terminal_without_logging_configured(tmp_path):
    proc = run_script(tmp_path, 300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("snapcache:")]
    assert lines[0] == "snapcache: writing snapshot demo: 300 examples expected"
    assert any("writing snapshot demo:" in line and "/300 examples" in line and "MB" in line
               and "examples/s" in line for line in lines[1:])
    assert "wrote snapshot demo: 300/300 examples, 0.3 MB" in lines[-1]
    assert proc.stdout == ""


def test_progress_false_is_silent(tmp_path):
    proc = run_script(tmp_path, 50, "off")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_bar_on_a_terminal(tmp_path):
    """stderr is a real pseudo-terminal: rich draws a bar (no tqdm involved)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "snaps"), "300",
                             "on"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env={**_env(), "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "snapshot demo" in text
    assert "━" in text  # the bar itself
    assert "/300 ex" in text and "MB" in text and "ex/s" in text
    assert "wrote snapshot demo: 300/300 examples" in text


TORCH_SCRIPT = """
import sys, numpy as np, snapcache as sc
from torch.utils.data import DataLoader
root, n = sys.argv[1], int(sys.argv[2])
ds = sc.Dataset.range(n).map(lambda i: np.full(1000, i % 7, np.uint8)).snapshot(
    root, name="workers", shard_size=4096)
loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
assert sum(1 for _ in loader) == n
"""


def test_dataloader_workers_show_one_report_for_the_epoch(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", TORCH_SCRIPT, str(tmp_path / "snaps"), "200"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("snapcache:")]
    starts = [line for line in lines if "writing snapshot workers" in line]
    ends = [line for line in lines if "wrote snapshot workers" in line]
    # One report for the epoch: started once (by stream 0), finished once (by the committer),
    # with the epoch's total, not each worker's half.
    assert starts == ["snapcache: writing snapshot workers (2 streams): 200 examples expected"]
    assert len(ends) == 1 and "200/200 examples" in ends[0], lines


def test_streams_elsewhere_are_counted_from_the_snapshot_folders_progress_records():
    """Rank 1 on another machine publishes no tick file here: stream 0 adds the rows its
    progress records show (what remote() reads from the snapshot folder)."""
    from snapcache.runtime.progress import EpochProgress

    updates = []
    mine = EpochProgress("remote", 200, stream=0, streams=2, key=f"test-{os.getpid()}-remote",
                         callback=updates.append, remote=lambda: {1: 64})
    assert sum(1 for _ in mine.wrap(iter(range(100)))) == 100
    assert updates[0].examples == 1 + 64   # the first example reports at once
    mine.finish()
    assert updates[-1].done and updates[-1].examples == 164 and updates[-1].total == 200


def test_local_streams_are_summed_from_their_tick_files():
    from snapcache.runtime.progress import EpochProgress

    key = f"test-{os.getpid()}-local"
    other = EpochProgress("local", 100, stream=1, streams=2, key=key)
    assert sum(1 for _ in other.wrap(iter(range(40)))) == 40   # publishes its final count
    updates = []
    owner = EpochProgress("local", 100, stream=0, streams=2, key=key, callback=updates.append)
    assert sum(1 for _ in owner.wrap(iter(range(60)))) == 60
    folder = owner._dir
    assert os.path.isdir(folder)
    owner.finish()
    assert updates[-1].done and updates[-1].examples == 100 and updates[-1].streams == 2
    assert not os.path.exists(folder)  # the committer removed the epoch's tick files


def test_node_local_records_of_gone_runs_are_pruned(tmp_path, monkeypatch):
    """Records of runs killed long ago (tick folders, manifest checks) do not pile up: the
    first process to use the shared folder removes those untouched for a day."""
    import tempfile
    import time

    from snapcache import machine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(machine, "_pruned", set())
    folder = os.path.join(str(tmp_path), f"snapcache-progress-{os.getuid()}")
    for name in ("old", "new"):
        os.makedirs(os.path.join(folder, name))
        with open(os.path.join(folder, name, "0.json"), "w") as f:
            f.write("{}")
    with open(os.path.join(folder, "old.json"), "w") as f:
        f.write("{}")
    day_ago = time.time() - machine.STALE_SECONDS - 60
    for stale in ("old", "old.json"):
        os.utime(os.path.join(folder, stale), (day_ago, day_ago))
    assert machine.shared_folder("progress") == folder
    assert sorted(os.listdir(folder)) == ["new"]
