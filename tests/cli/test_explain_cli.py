"""`snapcache explain ROOT --pipeline module:attr` through the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PIPELINE = textwrap.dedent('''
    import snapcache as sc
    SIZE = {size}

    def decode_and_resize(i):
        return {{"x": i * SIZE}}

    def build():
        return sc.Dataset.range(10).map(decode_and_resize).snapshot({root!r})
''')


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "snapcache.cli.main", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def test_explain_cli_hit_and_miss(tmp_path):
    root = str(tmp_path / "snaps")
    (tmp_path / "train.py").write_text(PIPELINE.format(size=224, root=root))
    proc = run_cli("explain", "--pipeline", "train:build", cwd=tmp_path)
    assert proc.returncode == 1 and "no committed snapshot to compare with" in proc.stdout
    subprocess.run([sys.executable, "-c", "import train; list(train.build())"], cwd=tmp_path,
                   check=True)
    proc = run_cli("explain", root, "--pipeline", "train.py:build", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("hit:"), proc.stdout + proc.stderr
    (tmp_path / "train.py").write_text(PIPELINE.format(size=256, root=root))
    proc = run_cli("explain", "--pipeline", "train:build", cwd=tmp_path)
    assert proc.returncode == 1
    assert "map #1 `decode_and_resize`: global `SIZE` changed (224 -> 256)" in proc.stdout


def test_explain_cli_bad_reference_is_one_line(tmp_path):
    proc = run_cli("explain", "--pipeline", "nosuchmodule:x", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "cannot import" in proc.stderr
    assert "Traceback" not in proc.stderr


SCRIPT_WITH_A_LOOP = textwrap.dedent('''
    import numpy as np, snapcache as sc

    def augment(e):
        return e + 1

    def three():
        return 3

    if {source!r} == "range":
        source = sc.Dataset.range(10).map(lambda i: np.full(2, i))
    else:
        source = sc.Dataset.from_files({files!r}).map(np.load)
    ds = source.snapshot({root!r}, progress=False).map(augment)
    for epoch in range(2):  # the training loop, at top level
        for x in ds:
            pass
''')


@pytest.mark.parametrize("source", ["range", "files"])
def test_explain_warns_when_importing_the_file_built_the_snapshot(tmp_path, source):
    """A training script with its loop at top level trains when explain imports it, and that
    builds the snapshot: the "hit" is the import's doing, and explain says so."""
    root = str(tmp_path / "snaps")
    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):
        np.save(files / f"f{i}.npy", np.full(2, i))
    (tmp_path / "train.py").write_text(SCRIPT_WITH_A_LOOP.format(
        source=source, files=str(files / "*.npy"), root=root))
    proc = run_cli("explain", "--pipeline", "train.py:ds", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("hit:"), proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("snapcache explain: warning: importing train.py built snapshot ")
    assert "committed during the import" in line and 'if __name__ == "__main__":' in line
    again = run_cli("explain", "--pipeline", "train.py:ds", cwd=tmp_path)  # it was there
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_explain_names_an_attribute_that_is_not_a_pipeline(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT_WITH_A_LOOP.format(
        source="range", files="", root=str(tmp_path / "snaps")))
    proc = run_cli("explain", "--pipeline", "train.py:augment", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert "`augment` in train.py is not a Dataset or a function returning one" in line
    assert "a function taking arguments (e)" in line and "missing" not in line
    proc = run_cli("explain", "--pipeline", "train.py:three", cwd=tmp_path)
    assert "`three` in train.py returned an object of type int, not a snapcache.Dataset" in \
        proc.stderr and proc.returncode == 2
