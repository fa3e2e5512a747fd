"""The scripts in examples/ run (small sizes), and the sweep shares one snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run(script: str, *args: str, timeout: float = 240) -> str:
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("on_busy", ["wait", "compute"])
def test_sweep_of_four_processes_shares_one_snapshot(tmp_path, on_busy):
    root = str(tmp_path / "snaps")
    summary = json.loads(run("sweep.py", "--examples", "300", "--cost-ms", "2", "--root", root,
                             "--on-busy", on_busy, "--json"))
    runs = summary["runs"]
    assert len(runs) == 4
    assert len({(r["lr"], r["batch_size"], r["noise"]) for r in runs}) == 4
    assert summary["snapshots"] == 1 and len(os.listdir(root)) == 1
    assert summary["same_data"] and all(r["examples"] == 300 for r in runs)
    if on_busy == "wait":  # the first writes, the others wait and read
        assert summary["preprocessing_calls"] == 300
        assert summary["calls_saved"] == 900
    else:                  # the others computed without writing: never fewer calls
        assert summary["preprocessing_calls"] >= 300


def test_torch_train_example_runs(tmp_path):
    pytest.importorskip("torch")
    out = run("torch_train.py", "--examples", "300", "--epochs", "2", "--workers", "2",
              "--root", str(tmp_path))
    assert out.count("300 examples") == 2


def test_jax_example_runs_or_says_how_to_install(tmp_path):
    out = run("jax_loop.py", "--examples", "256", "--epochs", "1", "--root", str(tmp_path))
    assert "pip install jax" in out or "epoch 0" in out
