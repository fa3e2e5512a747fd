"""The scripts in examples/ run (small sizes), and the sweep shares one snapshot."""

from __future__ import annotations

import importlib.util
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
    assert summary["root"] == root and os.path.isdir(root)  # --root given: kept
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


def test_sweep_takes_epochs_and_removes_its_temporary_folders(tmp_path):
    """Like every example, --examples and --epochs (docs/guide.md); without --root, nothing
    is left in the temporary folder."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "sweep.py"), "--examples",
                             "100", "--epochs", "3", "--cost-ms", "0", "--json"],
                            capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert [r["epochs"] for r in summary["runs"]] == [3] * 4
    assert summary["snapshots"] == 1 and summary["preprocessing_calls"] == 100
    assert summary["root"] is None and os.listdir(tmp_path) == []


def test_torch_train_example_runs(tmp_path):
    pytest.importorskip("torch")
    out = run("torch_train.py", "--examples", "300", "--epochs", "2", "--workers", "2",
              "--root", str(tmp_path))
    assert out.count("300 examples") == 2


def test_jax_example_runs_or_fails_saying_how_to_install(tmp_path):
    args = [sys.executable, os.path.join(EXAMPLES, "jax_loop.py"), "--examples", "256",
            "--epochs", "1", "--root", str(tmp_path)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=240)
    if importlib.util.find_spec("jax") is None:  # a missing framework is a failure, said
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.strip() == ("this example needs JAX, which snapcache does not "
                                         "install: pip install jax")
        pytest.skip("JAX is not installed: the example said so and exited with status 1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "epoch 0" in result.stdout
