"""A snapshot folder copied or renamed under another fingerprint is corrupt, never read as the
other pipeline's data; a manifest's counts never make a reader allocate what its files cannot
hold."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

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


# Reads of a crafted manifest, in a child process whose address space is capped: a regression
# that lays out blocks for rows no file holds fails there with a MemoryError at once (it ran
# for minutes and reached 16 GB uncapped) instead of taking the machine down.
CAPPED_READS = textwrap.dedent("""
    import json, resource, sys
    import snapcache as sc
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    root, folder = sys.argv[1], sys.argv[2]
    ds = sc.Dataset.range(3000).map(lambda i: {"i": i, "s": f"ex{i}"}).snapshot(
        root, key="crafted", shard_size=20000, progress=False)
    def outcome(read):
        try:
            read()
        except (sc.CorruptSnapshotError, sc.SnapshotStateError) as e:
            return [type(e).__name__, str(e)]
        except BaseException as e:
            return [type(e).__name__, repr(e)]
        return ["read", ""]
    print(json.dumps({"iterate": outcome(lambda: next(iter(ds))),
                      "snap[0]": outcome(lambda: sc.open_snapshot(folder)[0]),
                      "shuffled": outcome(lambda: next(iter(ds.shuffle(1000, seed=1))))}))
""")


def capped_reads(root: str, craft) -> dict:
    ds = sc.Dataset.range(3000).map(lambda i: {"i": i, "s": f"ex{i}"}).snapshot(
        root, key="crafted", shard_size=20000, progress=False)  # the child's, by its key
    assert sum(1 for _ in ds) == 3000
    [folder] = [os.path.join(root, name) for name in os.listdir(root)]
    path = os.path.join(folder, "manifest.json")
    doc = json.load(open(path))
    craft(doc)
    json.dump(doc, open(path, "w"))
    repo = pathlib.Path(__file__).parent.parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(repo)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", CAPPED_READS, root, folder],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def unlisted(rows):
    """The first shard claims ``rows`` (or ``rows(its bytes)``) without a record batch list
    (as snapshots written before it was recorded), the totals left out (they are optional)."""
    def craft(doc):
        shard = doc["shards"][0]
        shard["rows"] = rows(shard["bytes"]) if callable(rows) else rows
        for key in ("batch_rows", "batch_offsets", "batch_checksums", "page_size",
                    "pages_checksum"):
            shard.pop(key, None)
        doc.pop("num_examples", None)
    return craft


def test_rows_no_file_can_hold_make_the_manifest_corrupt(root):
    outcomes = capped_reads(root, unlisted(2**62))
    assert outcomes["iterate"][0] == "CorruptSnapshotError", outcomes
    assert outcomes["snap[0]"][0] == "SnapshotStateError", outcomes  # its state: corrupt
    for kind, message in outcomes.values():
        assert f"{2**62} rows cannot fit in" in message, message
        assert "delete the snapshot (`snapcache purge`" in message, message
    [snap] = sc.ls(root)
    assert snap.state == "corrupt" and "rows cannot fit" in snap.problem


def test_the_most_rows_an_older_manifest_may_claim_are_laid_out_and_refused_by_the_file(root):
    """As many rows as a manifest may claim for a shard of that size without a record batch
    list (MAX_ROWS_PER_BYTE a byte, at most MAX_UNLISTED_ROWS: 65,536 blocks, in arrays):
    every read lays them out, opens the shard and finds that its rows are not those."""
    from snapcache.store.manifest import MAX_ROWS_PER_BYTE, MAX_UNLISTED_ROWS

    most = []
    outcomes = capped_reads(root, unlisted(lambda size: most.append(
        min(MAX_UNLISTED_ROWS, MAX_ROWS_PER_BYTE * size)) or most[0]))
    assert most[0] == MAX_UNLISTED_ROWS
    for kind, message in outcomes.values():
        assert kind == "CorruptSnapshotError", outcomes
        assert f"rows, the manifest says {most[0]}" in message, message
        assert "snapcache purge --root" in message and "rerun the pipeline" in message


def test_a_layout_this_process_cannot_hold_is_a_corrupt_snapshot(root, monkeypatch):
    from snapcache.store import ordered_read
    from snapcache.store.order import Layout

    ds = sc.Dataset.range(100).snapshot(root, progress=False)
    list(ds)

    def no_memory(*args, **kwargs):
        raise MemoryError()

    manifest = sc.open_snapshot(root).manifest
    monkeypatch.setattr(Layout, "from_shards", no_memory)
    with pytest.raises(CorruptSnapshotError, match=r"100 rows in 1 shards cannot be laid out "
                                                   r"\(MemoryError\).*snapcache purge"):
        ordered_read.layout_of(manifest)
