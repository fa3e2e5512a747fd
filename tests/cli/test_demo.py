"""The README's main job: ``snapcache demo`` runs end to end through the console script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


def test_demo_console_script(tmp_path):
    exe = shutil.which("snapcache") or None
    cmd = [exe] if exe else [sys.executable, "-m", "snapcache.cli.main"]
    proc = subprocess.run(cmd + ["demo", "--examples", "300", "--root", str(tmp_path)],
                          capture_output=True, text=True, check=True, timeout=120)
    out = proc.stdout
    assert re.search(r"epoch 1 \(computes and writes the snapshot\): [\d.]+ s for 300", out), out
    assert re.search(r"epoch 2 \(reads the snapshot\): [\d.]+ s for 300", out), out
    speedup = float(re.search(r"speed-up of epoch 2 over epoch 1: ([\d.]+)x", out).group(1))
    assert speedup > 2, out  # ~4 ms/example of work vs reading a few MB back
    assert any(os.path.exists(os.path.join(tmp_path, d, "manifest.json"))
               for d in os.listdir(tmp_path))


def test_cli_without_command_shows_help():
    from snapcache.cli.main import main

    assert main([]) == 2
