"""The ecosystem examples run: albumentations after the snapshot (a real
albumentations.Compose on decoded JPEGs), and DALI's external_source fed by snapshot batches
(skipped where DALI is not installed: no GPU here, and DALI is not a dependency)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run(script: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args, "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_albumentations_after_the_snapshot(tmp_path):
    pytest.importorskip("albumentations")
    root = str(tmp_path / "snaps")
    summary = run("albumentations_after_snapshot.py", "--images", "40", "--epochs", "2",
                  "--root", root)
    assert summary["files"] == 40 and summary["snapshots"] == 1
    for epoch in summary["epochs"]:
        assert epoch["examples"] == 40
        assert epoch["shapes"] == [[80, 80, 3]]       # RandomCrop(80, 80) of 96 x 96
        assert epoch["dtypes"] == ["float32"]         # Normalize()
    # The augmentation is after the snapshot: each epoch draws anew from the same stored
    # images (first batch of each epoch differs), and the snapshot is only the decoded uint8.
    assert summary["epochs"][0]["first_mean"] != summary["epochs"][1]["first_mean"]
    import snapcache as sc
    [snap] = sc.ls(root)
    assert snap.num_examples == 40
    schema = sc.open_snapshot(root, snap.id).manifest.schema
    assert "uint8" in json.dumps(schema) and "float32" not in json.dumps(schema)


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None or
                    importlib.util.find_spec("nvidia.dali") is None,
                    reason="NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)")
def test_dali_external_source_fed_by_snapshot_batches(tmp_path):
    summary = run("dali_external_source.py", "--examples", "256", "--batch-size", "32",
                  "--epochs", "2", "--device", "cpu", "--root", str(tmp_path))
    assert [e["examples"] for e in summary["epochs"]] == [256, 256]
    assert summary["epochs"][0]["shape"] == [3, 64, 64]


def test_dali_example_says_how_to_install_without_dali():
    if importlib.util.find_spec("nvidia") is not None and \
            importlib.util.find_spec("nvidia.dali") is not None:
        pytest.skip("DALI is installed: the example runs instead")
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "dali_external_source.py")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "pip install nvidia-dali" in result.stderr
