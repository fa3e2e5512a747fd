"""Delta snapshots by default, and the releases before it (docs/format.md, "Delta by default").

The previous releases run for real: their code is taken from this repository's history
(``git archive``) and run in a subprocess against the same root:

- 2d5f667: delta snapshots opt-in (``snapshot(delta=True)``), reads format versions 1 and 2;
- 2fd18d8: before delta snapshots, reads format version 1 only.

(a) an ordinary snapshot the previous release committed for exactly the same pipeline and
files is found and read by this release, not rebuilt, and never deleted;
(b) a lineage folder this release builds is never taken by a previous release's ``ls`` for an
abandoned write, so its ``purge --incomplete`` leaves it alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DELTA_OPT_IN = "2d5f667"
BEFORE_DELTA = "2fd18d8"

PIPELINE = '''
import os, sys
import snapcache as sc

def decode(path):
    with open(os.environ["CALLS"], "a") as log:
        log.write(path + "\\n")
    return {"n": int(open(path).read())}

def dataset(data, root, **kw):
    return (sc.Dataset.from_files(os.path.join(data, "*.txt")).map(decode)
            .snapshot(root, progress=False, **kw))
'''


def release(commit: str, tmp_path: Path) -> Path:
    """The ``snapcache`` package of ``commit``, extracted under ``tmp_path``."""
    where = tmp_path / f"release-{commit}"
    if (where / "snapcache").is_dir():
        return where
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout's history")
    where.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "snapcache"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def run(code_dir: Path, tmp_path: Path, script: str) -> str:
    """Run ``script`` (after the pipeline module's code) with ``code_dir``'s snapcache."""
    (tmp_path / "pipeline_mod.py").write_text(PIPELINE)
    env = {**os.environ, "PYTHONPATH": f"{code_dir}{os.pathsep}{tmp_path}",
           "CALLS": str(tmp_path / "calls.log")}
    body = "from pipeline_mod import *\n" + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", body], env=env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def build(code_dir: Path, tmp_path: Path, data: Path, root: Path) -> tuple[str, str]:
    """One epoch of the pipeline with ``code_dir``'s snapcache: (its sorted values, the id
    of its snapshot)."""
    values, ident = run(code_dir, tmp_path, f"""
        ds = dataset({str(data)!r}, {str(root)!r})
        print(sorted(x["n"] for x in ds))
        print(ds.open_snapshot().id)
    """).split("\n")[:2]
    return values, ident


def calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    n = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    return n


@pytest.fixture
def source(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        (data / f"{i}.txt").write_text(str(i))
    return data, tmp_path / "snaps"


def files_of(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()}


@pytest.mark.parametrize("commit", [DELTA_OPT_IN, BEFORE_DELTA])
def test_an_ordinary_snapshot_of_a_previous_release_is_read_not_rebuilt(tmp_path, source,
                                                                          commit):
    data, root = source
    values, ident = build(release(commit, tmp_path), tmp_path, data, root)
    assert values == "[0, 1, 2, 3, 4, 5]" and calls(tmp_path) == 6
    legacy = root / ident
    before = files_of(legacy)
    assert "manifest.json" in before

    out = run(REPO, tmp_path, f"""
        ds = dataset({str(data)!r}, {str(root)!r})
        for epoch in range(2):
            print(sorted(x["n"] for x in ds))
        print(ds.open_snapshot().id, ds.explain().hit)
        sc.purge({str(root)!r}, incomplete=True)
        print(len(sc.ls({str(root)!r})))
    """).split("\n")
    assert out[0] == out[1] == "[0, 1, 2, 3, 4, 5]"
    assert calls(tmp_path) == 0  # read, not rebuilt
    assert out[2] == f"{legacy.name} True"
    assert out[3] == "1"  # no lineage folder was made beside it
    after = files_of(legacy)
    assert {n: s for n, s in after.items() if n.endswith((".arrow", ".json"))
            and not n.startswith(("reader-", "last-used"))} == \
        {n: s for n, s in before.items() if not n.startswith(("reader-", "last-used"))}

    # A grown source is a new delta lineage (built once, in full); the old folder stays for
    # pipelines of the old files until purged by age or id.
    (data / "6.txt").write_text("6")
    values, ident = build(REPO, tmp_path, data, root)
    assert values == "[0, 1, 2, 3, 4, 5, 6]" and calls(tmp_path) == 7
    assert ident != legacy.name and (root / ident / "manifest-000001.json").exists()
    assert legacy.is_dir() and (legacy / "manifest.json").exists()


@pytest.mark.parametrize("commit", [DELTA_OPT_IN, BEFORE_DELTA])
def test_a_previous_release_never_purges_a_lineage_as_incomplete(tmp_path, source, commit):
    data, root = source
    values, ident = build(REPO, tmp_path, data, root)
    assert values == "[0, 1, 2, 3, 4, 5]" and calls(tmp_path) == 6
    lineage = root / ident
    assert (lineage / "manifest-000001.json").exists()
    marker = json.loads((lineage / "manifest.json").read_text())
    assert marker["format_version"] == 3 and marker["fingerprint"] == lineage.name
    before = files_of(lineage)

    old = release(commit, tmp_path)
    seen = run(old, tmp_path, f"""
        import json
        for snap in sc.ls({str(root)!r}):
            print(json.dumps([snap.id, snap.state, snap.problem]))
        report = sc.purge({str(root)!r}, incomplete=True)
        print(json.dumps([len(report.deleted), list(report.tidied)]))
    """).strip().split("\n")
    listed = [json.loads(line) for line in seen]
    (ident, state, problem), (deleted, tidied) = listed[0], listed[-1]
    assert ident == lineage.name
    if commit == BEFORE_DELTA:  # knows only manifest.json: refuses the marker
        assert state == "corrupt" and "format version 3" in problem and "upgrade" in problem
    else:  # knows lineages: reads its versions
        assert state == "committed"
    assert deleted == 0 and tidied == []
    assert files_of(lineage) == before

    # This release reads it on, and the previous release's pipeline (its own folder) too.
    out = run(REPO, tmp_path, f"""
        ds = dataset({str(data)!r}, {str(root)!r})
        print(sorted(x["n"] for x in ds))
        print([s.state for s in sc.ls({str(root)!r})])
    """).split("\n")
    assert out[0] == "[0, 1, 2, 3, 4, 5]" and calls(tmp_path) == 0
    assert out[1] == "['committed']"


def test_delta_false_and_true(tmp_path, source):
    """delta=False: an ordinary snapshot (manifest.json of format 1); delta=True on a pipeline
    that cannot be built by file stays an error naming the op in the way."""
    import snapcache as sc

    data, root = source
    ds = sc.Dataset.from_files(str(data / "*.txt")).map(len).snapshot(
        str(root), progress=False, delta=False)
    assert len(list(ds)) == 6
    folder = root / ds.open_snapshot().id
    assert json.loads((folder / "manifest.json").read_text())["format_version"] == 1
    assert not list(folder.glob("manifest-*.json"))
    with pytest.raises(ValueError, match="batch"):
        sc.Dataset.from_files(str(data / "*.txt")).map(len).batch(2).snapshot(
            str(root), delta=True)
    # the default on the same pipeline: a delta snapshot only where the pipeline allows it
    batched = sc.Dataset.from_files(str(data / "*.txt")).map(len).batch(2).snapshot(
        str(root), progress=False)
    assert len(list(batched)) == 3
    assert (root / batched.open_snapshot().id / "manifest.json").exists()


@pytest.mark.parametrize("commit", [DELTA_OPT_IN, BEFORE_DELTA])
def test_a_row_group_lineage_says_upgrade_to_a_previous_release(tmp_path, commit):
    """Versions whose units are Parquet row groups are format 3 (their source record has more
    columns): both previous releases refuse them with "upgrade", and keep them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import snapcache as sc

    data, root = tmp_path / "pq", tmp_path / "snaps"
    data.mkdir()
    pq.write_table(pa.table({"x": list(range(10))}), data / "a.parquet", row_group_size=4)
    ds = sc.Dataset.from_parquet(str(data)).snapshot(str(root), progress=False)
    assert sorted(int(r["x"]) for r in ds) == list(range(10))
    lineage = root / ds.open_snapshot().id
    before = files_of(lineage)
    seen = run(release(commit, tmp_path), tmp_path, f"""
        import json
        (snap,) = sc.ls({str(root)!r})
        report = sc.purge({str(root)!r}, incomplete=True)
        print(json.dumps([snap.state, snap.problem, len(report.deleted), len(report.tidied)]))
    """).strip().split("\n")
    state, problem, deleted, tidied = json.loads(seen[-1])
    assert state == "corrupt" and "format version 3" in problem and "upgrade" in problem
    assert (deleted, tidied) == (0, 0) and files_of(lineage) == before
