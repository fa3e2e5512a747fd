"""Fingerprints are the same in every process: PYTHONHASHSEED, cwd and restarts do not matter."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:  # whatever pytest's import mode, the subprocess imports it the same
    sys.path.insert(0, str(HERE))

import fp_stability_cases  # noqa: E402


def digests_in_subprocess(seed: str, cwd: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED=seed,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    out = subprocess.run([sys.executable, "-c", "import json, sys, fp_stability_cases as c; "
                          "json.dump(c.digests(), sys.stdout)"],
                         cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_digests_equal_across_processes_seeds_and_cwd(tmp_path):
    expected = fp_stability_cases.digests()
    (tmp_path / "elsewhere").mkdir()
    for seed, cwd in [("0", tmp_path), ("12345", tmp_path / "elsewhere"), ("random", ROOT)]:
        assert digests_in_subprocess(seed, cwd) == expected, (seed, cwd)


def test_running_the_module_as_main_gives_the_same_digests(tmp_path):
    env = dict(os.environ, PYTHONHASHSEED="777", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(HERE / "fp_stability_cases.py")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == fp_stability_cases.digests()


@pytest.mark.parametrize("name", sorted(fp_stability_cases.values()))
def test_values_are_stable_within_a_process(name):
    from snapcache.fingerprint import hash_value
    value = fp_stability_cases.values()[name]
    assert hash_value(value, name).digest == hash_value(value, name).digest
