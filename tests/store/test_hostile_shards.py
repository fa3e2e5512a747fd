"""Crafted and damaged shards never crash a reader: with or without ``verify``, reading (every
way, or by random access alone, which reads one record batch at a time) yields
CorruptSnapshotError naming the shard and the way out, never a signal (SIGBUS/SIGSEGV),
SystemError, UnicodeDecodeError, ArrowMemoryError or a raw OSError.

The reads run in a child process (see ``shard_crafting.py``): a regression that kills the
reader with a signal fails the test, naming the case, instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
REPO = HERE.parent.parent


def run_cases(tmp_path, cases: list[str]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, str(HERE / "shard_crafting.py"), str(tmp_path),
                           *cases], capture_output=True, text=True, env=env, timeout=240)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    started = [line for line in lines if "starting" in line]
    assert proc.returncode == 0, (
        f"the reader died ({'signal %d' % -proc.returncode if proc.returncode < 0 else proc.returncode})"
        f" in case {started[-1] if started else None}:\n{proc.stderr[-3000:]}")
    return [line for line in lines if "outcome" in line]


def assert_names_shard_and_way_out(result: dict) -> None:
    message = result["message"]
    assert "shard '" in message and ".arrow'" in message, result
    assert "snapcache verify --root" in message and "snapcache purge --root" in message, result
    assert "rerun the pipeline" in message, result


def all_corrupt(tmp_path, cases: list[str]) -> list[dict]:
    """Run ``cases``; each must end in CorruptSnapshotError naming the shard and the way out."""
    results = run_cases(tmp_path, cases)
    assert [r["case"] for r in results] == cases
    for result in results:
        assert result["outcome"] == "corrupt", result
        assert_names_shard_and_way_out(result)
    return results


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_crafted_offsets_with_recomputed_checksum_are_corrupt(tmp_path, codec):
    """Offsets going up then down, or one far past its buffer, in str, bytes, 1-d and 2-d tensor
    columns, the manifest checksum recomputed to match."""
    cases = [f"offsets:{codec}:{column}/{mode}:{verify}{rows}"
             for column in ("s", "b", "t", "m") for mode in ("down", "past")
             for verify in ("verify", "noverify") for rows in ("", ":rows")]
    for result in all_corrupt(tmp_path, cases):
        assert "record batch 0" in result["message"], result


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_tensor_shape_disagreeing_with_its_list_is_corrupt(tmp_path, codec):
    """Row 0 or the middle row (which random access decodes first, alone) of a 2-d tensor
    column claims more elements than its list holds; checksums recomputed."""
    cases = [f"shapes:{codec}:{row}:verify{rows}" for row in (0, 60) for rows in ("", ":rows")]
    for result in all_corrupt(tmp_path, cases):
        assert "shapes disagree" in result["message"], result


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_a_shard_cut_into_other_record_batches_than_the_manifest_lists_is_corrupt(tmp_path,
                                                                                  codec):
    cases = [f"resplit:{codec}:-:{verify}" for verify in ("verify", "noverify")]
    for result in all_corrupt(tmp_path, cases):
        assert "has 2 record batches, the manifest lists 1" in result["message"], result


def test_forged_zstd_lengths_are_corrupt(tmp_path):
    cases = [f"zstd-length:zstd:{how}:{verify}{rows}" for how in ("huge", "short", "long")
             for verify in ("verify", "noverify") for rows in ("", ":rows")]
    all_corrupt(tmp_path, cases)


@pytest.mark.parametrize("codec,seed", [("none", 1), ("zstd", 2), ("lz4", 3)])
def test_random_bit_flips_never_escape_as_anything_but_corrupt(tmp_path, codec, seed):
    """60 rounds of 1-6 random bit flips a configuration. With ``verify`` the checksum is
    recomputed (a hostile writer); without, the damage is plain. A flip inside payload bytes
    can read back as other values without ``verify``: that is what ``verify=False`` trades."""
    results = run_cases(tmp_path, [f"fuzz:{codec}:{seed}:verify",
                                   f"fuzz:{codec}:{seed + 10}:noverify",
                                   f"fuzz:{codec}:{seed + 20}:verify:rows"])
    assert len(results) == 180
    corrupt = [r for r in results if r["outcome"] == "corrupt"]
    assert [r for r in results if r["outcome"] not in ("ok", "corrupt")] == []
    assert len(corrupt) > 90  # most flips land in structure, offsets or compressed bytes
    for result in corrupt:
        assert_names_shard_and_way_out(result)


def test_verify_finds_a_crafted_shard_whose_checksum_matches(tmp_path):
    import shard_crafting as crafting

    from snapcache import admin

    storage = crafting.make_snapshot(str(tmp_path), "zstd")
    assert admin.verify(root=str(tmp_path)).checks[0].problems == ()
    crafting.crafted_offsets(storage, "zstd", "s", "down")
    [check] = admin.verify(root=str(tmp_path)).checks
    [problem] = check.problems
    assert "is corrupt: record batch 0" in problem and "snapcache purge --root" in problem
