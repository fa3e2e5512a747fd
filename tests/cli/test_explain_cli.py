"""`snapcache explain ROOT --pipeline module:attr` through the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
