"""A snapshot folder copied or renamed under another fingerprint is corrupt, never read as the
other pipeline's data."""

from __future__ import annotations

import shutil

import pytest

import snapcache as sc
from snapcache.admin import inventory
from snapcache.errors import CorruptSnapshotError


def test_folder_copied_under_another_fingerprint_is_corrupt(tmp_path):
    root = tmp_path / "snaps"
    ours = sc.Dataset.range(20).map(lambda x: x * 2).snapshot(str(root), progress=False)
    other = sc.Dataset.range(20).map(lambda x: x * 3)
    assert list(ours) == [x * 2 for x in range(20)]
    # the upstream's fingerprint is the snapshot folder's name
    [written] = [p.name for p in root.iterdir()]
    copied = other.fingerprint()
    assert copied != written
    shutil.copytree(root / written, root / copied)

    with pytest.raises(CorruptSnapshotError) as info:
        list(other.snapshot(str(root), progress=False))
    message = str(info.value)
    assert f"fingerprint {written} does not match its folder name {copied}" in message
    assert f"Move it back to {root}/{written}" in message and "rerun the pipeline" in message
    # the root still works: ls reports that one folder as corrupt, the original reads
    states = {snap.id: snap.state for snap in inventory.ls(str(root))}
    assert states == {written: "committed", copied: "corrupt"}
    assert list(ours) == [x * 2 for x in range(20)]
