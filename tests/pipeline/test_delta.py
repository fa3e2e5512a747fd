"""Delta snapshots: a file source grows, shrinks or changes; only what changed is computed and
the new version reuses every other shard in place (see snapcache/pipeline/delta_exec.py)."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import snapcache as sc
from snapcache.store.protocol import versions, write_leases
from snapcache.store.fs import Storage

CALLS: list[str] = []


def load(path):
    CALLS.append(os.path.basename(path))
    with open(path) as f:
        return {"name": os.path.basename(path), "value": int(f.read())}


def write(folder, i, value=None):
    with open(os.path.join(folder, f"f{i:04d}.txt"), "w") as f:
        f.write(str(i if value is None else value))


@pytest.fixture
def src(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(12):
        write(folder, i)
    CALLS.clear()
    return folder


def pipeline(src, root, fn=load):
    CALLS.clear()  # the functions capture CALLS: its value counts in their fingerprint
    return (sc.Dataset.from_files(str(src / "*.txt")).map(fn)
            .snapshot(str(root), delta=True, progress=False))


def run(src, root, fn=load):
    CALLS.clear()
    return sorted((x["name"], x["value"]) for x in pipeline(src, root, fn))


def lineage(root) -> Storage:
    (name,) = os.listdir(root)
    return Storage(str(root)).child(name)


def no_readers(root):
    """Wait until the pipelines collected so far have released their read leases (on a thread
    of their own, see snapshot_exec.read_session); a held pipeline keeps its lease."""
    import gc

    gc.collect()
    deadline = time.monotonic() + 60
    while any(n.startswith("reader-") for _, _, files in os.walk(root) for n in files) \
            and time.monotonic() < deadline:
        time.sleep(0.01)


def expected(src):
    return sorted((n, int(open(src / n).read())) for n in os.listdir(src))


def shard_names(storage):
    return {n for n in storage.listdir() if n.endswith(".arrow") and not n.startswith("units-")}


def test_added_files_are_the_only_ones_computed_and_old_shards_are_reused_in_place(src, tmp_path):
    root = tmp_path / "root"
    assert run(src, root) == expected(src) and len(CALLS) == 12
    storage = lineage(root)
    first = versions.newest(storage)
    assert first.version == 1 and first.format_version == 2 and first.num_examples == 12
    assert run(src, root) == expected(src) and CALLS == []  # same files: read
    for i in (12, 13, 14):
        write(src, i)
    assert run(src, root) == expected(src)
    assert sorted(CALLS) == ["f0012.txt", "f0013.txt", "f0014.txt"]
    second = versions.newest(storage)
    assert second.version == 2 and second.num_examples == 15
    assert {s.path for s in first.shards} <= {s.path for s in second.shards}  # in place
    assert len(os.listdir(root)) == 1  # one lineage folder


def test_changed_removed_and_renamed_files(src, tmp_path):
    root = tmp_path / "root"
    run(src, root)
    write(src, 3, value=300)          # changed (size differs)
    assert run(src, root) == expected(src) and ("f0003.txt", 300) in expected(src)
    assert "f0003.txt" in CALLS and len(CALLS) <= 12
    os.remove(src / "f0007.txt")      # removed
    assert run(src, root) == expected(src) and ("f0007.txt", 7) not in run(src, root)
    os.rename(src / "f0001.txt", src / "f0100.txt")   # renamed: removed + added
    got = run(src, root)
    assert got == expected(src) and ("f0100.txt", 1) in got
    assert "f0100.txt" in CALLS


def test_a_file_listed_more_than_once_is_a_unit_per_listing(src, tmp_path):
    """Oversampling by listing a file twice: the version holds its rows twice, and a change of
    how many times it is listed is a unit added or removed, not a version reused as it was."""
    root = tmp_path / "root"
    files = sorted(str(p) for p in src.glob("*.txt"))

    def listing(listed):
        CALLS.clear()
        return sc.Dataset.from_files(listed).map(load).snapshot(str(root), delta=True,
                                                                progress=False)

    def rows(listed):
        return sorted((x["name"], x["value"]) for x in listing(listed))

    def want(listed):
        return sorted((os.path.basename(p), int(open(p).read())) for p in listed)

    assert rows(files) == want(files) and len(CALLS) == 12
    twice = files + files[:2]
    assert listing(twice).explain().delta == (
        "source: 2 files added; computing 2 of 14 units, reusing 12 (85.7% of examples)")
    assert rows(twice) == want(twice) and sorted(CALLS) == ["f0000.txt", "f0001.txt"]
    assert rows(twice) == want(twice) and CALLS == [] and listing(twice).explain().hit
    thrice = twice + files[:1]
    assert rows(thrice) == want(thrice) and CALLS == ["f0000.txt"]
    once_more = files + files[:1]
    assert listing(once_more).explain().delta.startswith(
        "source: 2 files removed; computing 0 of 13 units")
    assert rows(once_more) == want(once_more) and CALLS == []
    assert listing(files).explain().hit  # version 1, built from this very listing
    assert rows(files) == want(files) and CALLS == []


def test_the_previous_version_stays_readable_by_the_pipeline_that_made_it(src, tmp_path):
    root = tmp_path / "root"
    old = pipeline(src, root)
    before = sorted(x["value"] for x in old)
    write(src, 20)
    assert run(src, root) == expected(src)
    CALLS.clear()
    assert sorted(x["value"] for x in old) == before and CALLS == []  # its own version
    assert [m for m in versions.versions(lineage(root))] == [1, 2]


def test_a_code_change_recomputes_everything(src, tmp_path):
    root = tmp_path / "root"
    run(src, root)

    def load2(path):
        CALLS.append(os.path.basename(path))
        with open(path) as f:
            return {"name": os.path.basename(path), "value": int(f.read()) * 2}

    got = run(src, root, load2)
    assert len(CALLS) == 12 and got == [(n, 2 * v) for n, v in expected(src)]
    assert len(os.listdir(root)) == 2  # another lineage


def test_delete_old_versions_keeps_shards_a_newer_version_shares(src, tmp_path):
    root = tmp_path / "root"
    run(src, root)
    write(src, 30)
    run(src, root)
    storage = lineage(root)
    v1, v2 = versions.load_version(storage, 1), versions.load_version(storage, 2)
    shared = {s.path for s in v1.shards} & {s.path for s in v2.shards}
    assert shared
    versions.delete_versions(storage, [1])
    assert versions.versions(storage) == [2]
    assert shared <= set(storage.listdir())
    assert run(src, root) == expected(src) and CALLS == []


def test_filter_and_parallel_map_upstream(src, tmp_path):
    ds = (sc.Dataset.from_files(str(src / "*.txt")).map(load, num_parallel_calls=3)
          .filter(lambda x: x["value"] % 2 == 0)
          .snapshot(str(tmp_path / "root"), delta=True, progress=False))
    assert sorted(x["value"] for x in ds) == [0, 2, 4, 6, 8, 10]
    write(src, 40)
    write(src, 41)
    ds = (sc.Dataset.from_files(str(src / "*.txt")).map(load, num_parallel_calls=3)
          .filter(lambda x: x["value"] % 2 == 0)
          .snapshot(str(tmp_path / "root"), delta=True, progress=False))
    CALLS.clear()
    assert sorted(x["value"] for x in ds) == [0, 2, 4, 6, 8, 10, 40]
    assert sorted(CALLS) == ["f0040.txt", "f0041.txt"]


def test_parquet_row_groups_are_units(tmp_path, capsys):
    from snapcache.cli.main import main

    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"x": list(range(i * 10, i * 10 + 10))}),
                       folder / f"part-{i}.parquet", row_group_size=4)
    seen = []

    def double(row):
        seen.append(int(row["x"]))
        return {"x": row["x"] * 2}

    def make():
        return (sc.Dataset.from_parquet(str(folder / "*.parquet")).map(double)
                .snapshot(str(tmp_path / "root"), progress=False))

    def values(ds):
        return sorted(int(r["x"]) // 2 for r in ds)

    assert values(make()) == list(range(30)) and sorted(seen) == list(range(30))
    storage = lineage(tmp_path / "root")
    first = versions.load_version(storage, 1)
    assert first.format_version == 3 and first.source["units"] == 9  # 3 files x 3 groups
    assert first.source["files"] == 3
    assert main(["info", storage.url.rsplit("/", 1)[-1][:10], "--root",
                 str(tmp_path / "root"), "--files"]) == 0
    out = capsys.readouterr().out
    assert "3 files, 9 row groups" in out and "part-1.parquet#2" in out
    pq.write_table(pa.table({"x": list(range(100, 105))}), folder / "part-9.parquet")
    seen.clear()
    assert values(make()) == list(range(30)) + list(range(100, 105))
    assert sorted(seen) == list(range(100, 105))

    # A re-exported file: the same rows but one, in the same row groups: only the row group
    # holding the changed row runs through the map; the others keep their identity (content).
    rows = list(range(0, 10))
    rows[5] = 55
    pq.write_table(pa.table({"x": rows}), folder / "part-0.parquet", row_group_size=4)
    seen.clear()  # (the map captures `seen`: its value counts in the lineage)
    ds = make()
    assert "1 row group changed; computing 1 of 10 units, reusing 9" in str(ds.explain())
    assert values(ds) == sorted(rows + list(range(10, 30)) + list(range(100, 105)))
    assert sorted(seen) == [4, 6, 7, 55]

    # Touched, not changed: read and hashed again, nothing computed.
    os.utime(folder / "part-2.parquet", ns=(1, 1))
    seen.clear()
    assert values(make()) == sorted(rows + list(range(10, 30)) + list(range(100, 105)))
    assert seen == []

    os.remove(folder / "part-1.parquet")          # its rows leave; the others' are copied
    seen.clear()
    assert values(make()) == sorted(rows + list(range(20, 30)) + list(range(100, 105)))
    assert seen == []


def test_row_group_identities_are_read_only_for_changed_files(tmp_path, monkeypatch):
    from snapcache.store import parquet as parquet_store

    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"x": list(range(i * 8, i * 8 + 8)), "y": [b"a"] * 8}),
                       folder / f"part-{i}.parquet", row_group_size=3)
    hashed = []
    real = parquet_store.row_group_digests
    monkeypatch.setattr(parquet_store, "row_group_digests",
                        lambda url, *a, **k: (hashed.append(os.path.basename(url)),
                                              real(url, *a, **k))[1])

    def make():
        return (sc.Dataset.from_parquet(str(folder / "*.parquet"), columns=["x"])
                .map(lambda r: {"x": r["x"] + 1})
                .snapshot(str(tmp_path / "root"), progress=False))

    assert len(list(make())) == 32 and len(hashed) == 4
    hashed.clear()
    assert len(list(make())) == 32 and hashed == []          # a hit: nothing read
    # a column that is not read changes: the file is hashed again, nothing is computed
    pq.write_table(pa.table({"x": list(range(8, 16)), "y": [b"b"] * 8}),
                   folder / "part-1.parquet", row_group_size=3)
    hashed.clear()
    ds = make()
    assert "computing 0 of 12 units, reusing 12" in str(ds.explain())
    assert len(list(ds)) == 32 and hashed == ["part-1.parquet"]


def test_a_parquet_file_listed_twice_holds_its_rows_twice(tmp_path, monkeypatch):
    from snapcache.store import parquet as parquet_store

    folder = tmp_path / "pq"
    folder.mkdir()
    paths = []
    for i in range(3):
        pq.write_table(pa.table({"x": list(range(i * 8, i * 8 + 8))}),
                       folder / f"part-{i}.parquet", row_group_size=3)
        paths.append(str(folder / f"part-{i}.parquet"))
    hashed = []
    real = parquet_store.row_group_digests
    monkeypatch.setattr(parquet_store, "row_group_digests",
                        lambda url, *a, **k: (hashed.append(os.path.basename(url)),
                                              real(url, *a, **k))[1])

    def make(listed):
        hashed.clear()
        return (sc.Dataset.from_parquet(listed).map(lambda r: {"x": r["x"] + 1})
                .snapshot(str(tmp_path / "root"), progress=False))

    assert sorted(x["x"] for x in make(paths)) == list(range(1, 25))
    twice = paths + paths[:1]
    ds = make(twice)
    assert "3 row groups added; computing 3 of 12 units" in str(ds.explain())
    assert sorted(x["x"] for x in ds) == sorted(list(range(1, 25)) + list(range(1, 9)))
    assert hashed == []  # the row groups of files that did not change are not read again
    grown = twice + paths[1:2]
    assert sorted(x["x"] for x in make(grown)) == sorted(
        list(range(1, 25)) + list(range(1, 17)))
    assert hashed == []


def test_resuming_after_the_files_changed_says_so(src, tmp_path):
    root = tmp_path / "root"

    def make():
        return pipeline(src, root).shuffle(4, seed=0).batch(3)
    list(make())
    it = make().iterate(1)
    next(it)
    state = it.state_dict()
    it.close()
    write(src, 99)
    with pytest.raises(ValueError, match="built from other source files") as e:
        list(make().iterate(state=state))
    assert "files were added, changed or removed since" in str(e.value)


def test_format_2_manifest_refused_by_a_format_1_reader(src, tmp_path, monkeypatch):
    from snapcache.errors import UnknownFormatVersionError
    from snapcache.store import manifest as manifest_module

    run(src, tmp_path / "root")
    storage = lineage(tmp_path / "root")
    monkeypatch.setattr(manifest_module, "FORMAT_VERSION", 1)
    with pytest.raises(UnknownFormatVersionError, match="format version 2"):
        versions.load_version(storage, 1)


def test_explain_says_what_the_next_run_computes_and_reuses(src, tmp_path):
    root = tmp_path / "root"
    assert "the root holds no committed snapshot" in str(pipeline(src, root).explain())
    run(src, root)
    hit = pipeline(src, root).explain()
    assert hit.hit and "version 1" in str(hit)
    for i in (50, 51, 52):
        write(src, i)
    write(src, 4, value=4000)
    os.remove(src / "f0010.txt")
    os.remove(src / "f0011.txt")
    explanation = pipeline(src, root).explain()
    assert not explanation.hit and explanation.version == 1
    # only the added and changed files are computed; the other 9 rows of their segment are
    # copied (each file's rows are known: one example a file, then a map)
    assert explanation.delta == ("source: 3 files added, 1 changed, 2 removed; computing 4 "
                                 "of 13 units, reusing 9 (69.2% of examples)")
    assert "the next run builds version 2" in str(explanation)
    assert run(src, root) == expected(src)
    assert sorted(CALLS) == ["f0004.txt", "f0050.txt", "f0051.txt", "f0052.txt"]


def test_explain_wording_with_many_segments(src, tmp_path, monkeypatch):
    from snapcache.pipeline import delta_plan

    monkeypatch.setattr(delta_plan, "SEGMENT_UNITS", 4)
    root = tmp_path / "root"
    run(src, root)                       # 3 segments of 4 files
    write(src, 60)
    os.remove(src / "f0000.txt")
    explanation = pipeline(src, root).explain()
    assert explanation.delta == ("source: 1 file added, 1 removed; computing 1 of 12 units, "
                                 "reusing 11 (91.7% of examples)")
    assert run(src, root) == expected(src)
    assert CALLS == ["f0060.txt"]
    storage = lineage(root)
    v1, v2 = versions.load_version(storage, 1), versions.load_version(storage, 2)
    assert [s.path for s in v1.shards[1:]] == [s.path for s in v2.shards[1:3]]  # in place
    assert v1.shards[0].path != v2.shards[0].path     # the first segment's rows, copied


def load_but_not_9(path):
    if path.endswith("f0009.txt"):
        raise ValueError("unreadable file")
    return load(path)


def test_an_error_note_in_a_segment_says_the_segment_it_counts_in(src, tmp_path, monkeypatch):
    """Found by the audit of error notes: each segment runs the upstream on its files only,
    and the note said "example #1 of this epoch" for the 10th file (the 2nd of the 3rd
    segment of 4). It says which segment the number counts in now."""
    from snapcache.pipeline import delta_plan

    monkeypatch.setattr(delta_plan, "SEGMENT_UNITS", 4)
    with pytest.raises(ValueError, match="unreadable file") as raised:
        list(pipeline(src, tmp_path / "root", load_but_not_9))
    assert [n for n in raised.value.__notes__ if n.startswith("snapcache: raised")] == [
        "snapcache: raised by map `load_but_not_9` on example #1 of a delta segment (computed "
        f"from its 4 files from {src / 'f0008.txt'} on)"]


def test_when_rows_per_file_are_unknown_a_segment_with_a_removed_file_is_recomputed(
        src, tmp_path, monkeypatch):
    from snapcache.pipeline import delta_plan

    monkeypatch.setattr(delta_plan, "SEGMENT_UNITS", 4)

    def make():
        CALLS.clear()
        return (sc.Dataset.from_files(str(src / "*.txt")).map(load)
                .filter(lambda x: x["value"] != 5)
                .snapshot(str(tmp_path / "root"), delta=True, progress=False))

    assert sorted(x["value"] for x in make()) == [v for v in range(12) if v != 5]
    os.remove(src / "f0000.txt")
    ds = make()
    assert "computing 3 of 11 units, reusing 8" in ds.explain().delta
    assert sorted(x["value"] for x in ds) == [v for v in range(1, 12) if v != 5]
    assert sorted(CALLS) == ["f0001.txt", "f0002.txt", "f0003.txt"]


def test_purge_old_versions_keeps_shared_shards_and_ls_counts_them_once(src, tmp_path):
    root = tmp_path / "root"
    run(src, root)
    write(src, 70)
    run(src, root)
    (snap,) = sc.ls(str(root))
    assert snap.state == "committed" and snap.versions == (1, 2) and snap.num_examples == 13
    on_disk = sum(f.size for f in snap.files)
    assert snap.size_bytes == on_disk
    held = pipeline(src, root)
    list(held)                             # a pipeline that can read again holds its lease
    assert sc.purge(str(root), old_versions=True).kept
    assert versions.versions(lineage(root)) == [1, 2]
    del held
    no_readers(root)
    dry = sc.purge(str(root), old_versions=True, dry_run=True)
    assert any(name.endswith("manifest-000001.json") for name in dry.tidied)
    assert versions.versions(lineage(root)) == [1, 2]
    report = sc.purge(str(root), old_versions=True)
    assert not report.deleted and report.tidied
    assert versions.versions(lineage(root)) == [2]
    left = set(os.listdir(lineage(root).root))  # page files went with their shards
    assert all(n[:-len(".pages")] in left for n in left if n.endswith(".pages")), left
    assert run(src, root) == expected(src) and CALLS == []
    no_readers(root)
    sc.purge(str(root), older_than=0)      # the whole lineage goes
    assert os.listdir(root) == []


def test_purge_tidies_without_deleting_shards_an_old_version_lists(src, tmp_path):
    root = tmp_path / "root"
    run(src, root)
    write(src, 1, value=1111)           # the only segment is rebuilt: v1's shard is v1's alone
    run(src, root)
    storage = lineage(root)
    v1 = versions.load_version(storage, 1)
    sc.purge(str(root), incomplete=True)   # tidies leftovers of committed snapshots
    assert {s.path for s in v1.shards} <= set(storage.listdir())
    assert versions.versions(storage) == [1, 2]


def test_info_summarises_the_source_and_lists_files(src, tmp_path, capsys):
    from snapcache.cli.main import main

    root = tmp_path / "root"
    run(src, root)
    write(src, 80)
    run(src, root)
    (snap,) = sc.ls(str(root))
    assert main(["info", snap.id[:10], "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "versions" in out and "13 files" in out and "shared by several versions" in out
    assert main(["info", snap.id[:10], "--root", str(root), "--files", "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert sorted(os.path.basename(f["path"]) for f in doc["files"]) == sorted(os.listdir(src))
    assert doc["versions"] == [1, 2]


# -- crashes and concurrent builds, with real processes ----------------------------------------
import json
import signal
import subprocess
import sys
import textwrap

CHILD = os.path.join(os.path.dirname(__file__), "delta_child.py")


def start(src, root, out, calls, pause=None, stream=()):
    env = dict(os.environ, DELTA_CALLS=str(calls))
    env.pop("SNAPCACHE_TEST_DELTA_PAUSE", None)
    if pause is not None:
        env["SNAPCACHE_TEST_DELTA_PAUSE"] = str(pause)
    return subprocess.Popen([sys.executable, CHILD, str(src), str(root), str(out)]
                            + [str(n) for n in stream], env=env)


def wait_for(path, proc):
    while not os.path.exists(path):
        assert proc.poll() is None, "the child ended before reaching the pause point"
        time.sleep(0.01)


def called(calls):
    return sorted(open(calls).read().split()) if os.path.exists(calls) else []


def test_a_build_killed_after_a_segment_is_resumed_by_the_next(src, tmp_path):
    """(A build is split into tasks the same way by every run: the killed run's finished
    segment is found again by its units' keys.)"""
    root, calls, pause = tmp_path / "root", tmp_path / "calls", tmp_path / "pause"
    first = start(src, root, tmp_path / "out0", calls)
    assert first.wait(timeout=120) == 0                  # version 1: 3 segments of 4 files
    for i in range(100, 110):                            # 10 new files: 3 new segments
        write(src, i)
    os.remove(calls)
    child = start(src, root, tmp_path / "out1", calls, pause=pause)
    wait_for(pause, child)                               # its first segment is recorded
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    storage = lineage(root)
    assert versions.versions(storage) == [1]             # nothing committed
    assert sorted(called(calls)) == [f"f{i:04d}.txt" for i in range(100, 104)]
    os.remove(calls)
    again = start(src, root, tmp_path / "out2", calls)
    assert again.wait(timeout=120) == 0
    assert called(calls) == [f"f{i:04d}.txt" for i in range(104, 110)]  # the rest only
    got = json.load(open(tmp_path / "out2"))
    assert [tuple(x) for x in got] == expected(src)
    assert versions.versions(storage) == [1, 2]
    assert not [n for n in storage.listdir() if n.startswith(("segment-", "progress-"))]


def load_or_stop(path):
    """``load``, or a Ctrl-C at the file ``$SNAPCACHE_TEST_STOP_AT`` (read from the environment:
    the function's fingerprint is the same either way)."""
    if os.path.basename(path) == os.environ.get("SNAPCACHE_TEST_STOP_AT"):
        raise KeyboardInterrupt
    return load(path)


def test_a_build_interrupted_inside_a_segment_keeps_the_files_it_computed(
        src, tmp_path, monkeypatch):
    """Ctrl-C in the middle of a segment (40 files, one segment): the shard in progress is
    finished and recorded with the task's digest, and the next run computes the other files
    only (each file's rows are known, so the kept shards end on a file's last row)."""
    root = tmp_path / "root"
    for i in range(12, 40):
        write(src, i)
    monkeypatch.setenv("SNAPCACHE_TEST_STOP_AT", "f0025.txt")
    with pytest.raises(KeyboardInterrupt):
        list(pipeline(src, root, fn=load_or_stop))
    assert sorted(CALLS) == [f"f{i:04d}.txt" for i in range(25)]
    storage = lineage(root)
    assert versions.versions(storage) == []
    monkeypatch.delenv("SNAPCACHE_TEST_STOP_AT")
    assert run(src, root, fn=load_or_stop) == expected(src)
    assert CALLS == [f"f{i:04d}.txt" for i in range(25, 40)]
    assert versions.versions(storage) == [1]
    assert not [n for n in storage.listdir() if n.startswith(("segment-", "progress-"))]
    assert run(src, root, fn=load_or_stop) == expected(src) and CALLS == []


STOPPING_CHILD = textwrap.dedent('''
    import json, os, sys, time
    import snapcache as sc
    src, root, out, calls = sys.argv[1:5]
    def load(path):
        name = os.path.basename(path)
        if name == os.environ.get("STOP_AT"):
            open(os.environ["PAUSE"], "w").close()
            while not os.path.exists(os.environ.get("GO", "/nonexistent")):
                time.sleep(0.05)
        with open(calls, "a") as f:
            f.write(name + "\\n")
        with open(path) as f:
            return {"name": name, "value": int(f.read()), "pad": b"x" * 300}
    ds = (sc.Dataset.from_files(os.path.join(src, "*.txt")).map(load)
          .snapshot(root, delta=True, progress=False, shard_size=2048, lease_ttl=5.0))
    with open(out, "w") as f:
        json.dump(sorted([x["name"], int(x["value"])] for x in ds), f)
''')


def test_a_build_killed_inside_a_segment_keeps_its_finished_shards(src, tmp_path):
    """SIGKILL in the middle of a segment: the shards finished before it are reused by the next
    run (found by the task's digest in the killed run's progress record), whatever else."""
    root, calls, pause = tmp_path / "root", tmp_path / "calls", tmp_path / "pause"
    for i in range(12, 40):
        write(src, i)

    def child(**env):
        return subprocess.Popen([sys.executable, "-c", STOPPING_CHILD, str(src), str(root),
                                 str(tmp_path / "out"), str(calls)],
                                env={**os.environ, **env})
    first = child(STOP_AT="f0030.txt", PAUSE=str(pause))
    wait_for(pause, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert called(calls) == [f"f{i:04d}.txt" for i in range(30)]
    os.remove(calls)
    again = child()
    assert again.wait(timeout=120) == 0
    rest = called(calls)
    assert rest and len(rest) < 30  # finished shards were kept
    assert rest == [f"f{i:04d}.txt" for i in range(40 - len(rest), 40)]  # a suffix, once
    assert [tuple(x) for x in json.load(open(tmp_path / "out"))] == expected(src)
    assert versions.versions(lineage(root)) == [1]


def test_purge_during_a_build_that_resumed_a_killed_runs_shards_deletes_none_of_them(
        src, tmp_path):
    """The kept shards of a killed run (named by it) are recorded as the live build's at once:
    purge's tidying of the lineage (a committed version, a dead run's files) leaves them."""
    from snapcache.admin.purge import purge

    root, calls, pause, go = tmp_path / "root", tmp_path / "calls", tmp_path / "pause", \
        tmp_path / "go"

    def child(**env):
        return subprocess.Popen([sys.executable, "-c", STOPPING_CHILD, str(src), str(root),
                                 str(tmp_path / "out"), str(calls)],
                                env={**os.environ, **env})
    assert child().wait(timeout=120) == 0  # version 1: the 12 files
    for i in range(12, 52):
        write(src, i)
    first = child(STOP_AT="f0040.txt", PAUSE=str(pause))  # version 2: killed inside it
    wait_for(pause, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    os.remove(pause)
    live = child(STOP_AT="f0048.txt", PAUSE=str(pause), GO=str(go))  # resumed, then paused
    try:
        wait_for(pause, live)
        storage = lineage(root)
        writers = {x.owner for x in write_leases(storage)}
        held = versions.held_by(storage, storage.listdir(), writers)
        assert held  # the killed run's shards the live build kept, recorded as its own
        report = purge(str(root), older_than="3650d")  # selects nothing; tidies leftovers
        assert not {n.split("/", 1)[1] for n in report.tidied} & held, report.tidied
    finally:
        go.touch()
    assert live.wait(timeout=120) == 0
    assert [tuple(x) for x in json.load(open(tmp_path / "out"))] == expected(src)
    assert versions.versions(lineage(root)) == [1, 2]


def test_two_concurrent_delta_builds_compute_the_new_files_once(src, tmp_path):
    root, calls, pause = tmp_path / "root", tmp_path / "calls", tmp_path / "pause"
    assert start(src, root, tmp_path / "out0", calls).wait(timeout=120) == 0
    for i in range(200, 206):
        write(src, i)
    os.remove(calls)
    a = start(src, root, tmp_path / "a", calls, pause=pause)
    wait_for(pause, a)                                   # a holds the build lease, mid-build
    b = start(src, root, tmp_path / "b", calls)          # b waits for a's version
    time.sleep(0.5)  # not a timing assertion: b may or may not have started waiting yet
    os.remove(pause)
    assert a.wait(timeout=120) == 0 and b.wait(timeout=120) == 0
    assert called(calls) == [f"f{i:04d}.txt" for i in range(200, 206)]  # once, by a
    for out in ("a", "b"):
        assert [tuple(x) for x in json.load(open(tmp_path / out))] == expected(src)
    assert versions.versions(lineage(root)) == [1, 2]


def test_the_snapshot_handle_of_a_delta_pipeline_is_its_own_version(src, tmp_path):
    from snapcache.errors import SnapshotStateError

    root = tmp_path / "root"
    ds = pipeline(src, root)
    snap = ds.open_snapshot()
    assert snap.state == "absent"
    run(src, root)
    assert snap.state == "committed" and len(snap) == 12
    assert sorted(snap.take(range(12)), key=lambda x: x["name"])[0]["name"] == "f0000.txt"
    write(src, 90)
    grown = pipeline(src, root)
    assert grown.open_snapshot().state == "absent"     # its version is not built yet
    assert sum(1 for _ in grown) == 13
    assert grown.open_snapshot().num_examples == 13
    assert ds.open_snapshot().num_examples == 12        # the old pipeline's version
    by_path = sc.open_snapshot(str(root))               # the lineage: its newest version
    assert by_path.state == "committed" and by_path.num_examples == 13
    assert grown.open_snapshot().write_stream(0, 2).status == "committed"
    with pytest.raises(SnapshotStateError, match="opened from a path"):
        by_path.write_stream(0, 2)


def test_s3_identities_come_from_the_paginated_listing(s3_root, s3_server):
    """One ListObjectsV2 request per 1,000 keys, no request per object; and a delta build of
    files on S3 (units keyed by ETag) reuses its shards when files are added."""
    from snapcache.store.fs import _filesystem
    from snapcache.store.source_files import file_identities

    folder = s3_root.rsplit("/", 1)[0] + "/many"
    admin = s3_server.filesystem()
    admin.pipe({f"{folder[5:]}/f{i:05d}.txt": str(i).encode() for i in range(1001)})
    urls = [f"{folder}/f{i:05d}.txt" for i in range(1001)]
    fs, _ = _filesystem(folder, None)
    fs.ls(folder[5:], refresh=True)   # connects the client
    operations: list[str] = []
    fs.s3.meta.events.register("before-call.s3", lambda event_name, **_: operations.append(
        event_name.rsplit(".", 1)[-1]))
    identities = file_identities(urls)
    assert operations == ["ListObjectsV2", "ListObjectsV2"]
    assert [i["path"] for i in identities] == urls
    assert all(i["size"] == len(str(n)) and i["etag"] for n, i in enumerate(identities))

    def pipe(root):
        return (sc.Dataset.from_files(f"{folder}/f0000*.txt").map(lambda p: {"p": p})
                .snapshot(root, delta=True, progress=False))

    assert sum(1 for _ in pipe(s3_root)) == 10
    admin.pipe({f"{folder[5:]}/f0000z.txt": b"new"})
    assert sorted(x["p"] for x in pipe(s3_root))[-1].endswith("f0000z.txt")
    (snap,) = sc.ls(s3_root)
    assert snap.versions == (1, 2) and snap.num_examples == 11


def test_interleave_over_files_is_built_by_file(tmp_path):
    folder = tmp_path / "lines"
    folder.mkdir()
    for i in range(6):
        (folder / f"part-{i}.txt").write_text("\n".join(f"{i}-{k}" for k in range(3)))
    opened = []

    def lines(path):
        opened.append(os.path.basename(path))
        return sc.Dataset.from_iterable(open(path).read().split("\n"))

    def make():
        opened.clear()
        return (sc.Dataset.from_files(str(folder / "*.txt"))
                .interleave(lines, cycle_length=2).map(lambda s: {"line": s})
                .snapshot(str(tmp_path / "root"), delta=True, progress=False))

    assert sorted(x["line"] for x in make()) == sorted(f"{i}-{k}" for i in range(6)
                                                       for k in range(3))
    (folder / "part-9.txt").write_text("9-0\n9-1")
    ds = make()
    got = sorted(x["line"] for x in ds)
    assert got == sorted([f"{i}-{k}" for i in range(6) for k in range(3)] + ["9-0", "9-1"])
    assert opened == ["part-9.txt"]


def test_delta_on_a_pipeline_that_cannot_be_built_by_file_is_an_error(src, tmp_path):
    files = sc.Dataset.from_files(str(src / "*.txt"))
    with pytest.raises(ValueError, match="batch"):
        files.map(load).batch(4).snapshot(str(tmp_path), delta=True)
    with pytest.raises(ValueError, match="from_iterable"):
        sc.Dataset.from_iterable([1, 2]).snapshot(str(tmp_path), delta=True)
    with pytest.raises(ValueError, match="key"):
        files.snapshot(str(tmp_path), delta=True, key="v1")


def test_streams_read_disjoint_shares_of_the_version(src, tmp_path):
    root = tmp_path / "root"
    ds = pipeline(src, root)
    parts = [[x["name"] for x in ds.iterate(stream=(k, 3))] for k in range(3)]
    assert sorted(sum(parts, [])) == sorted(os.listdir(src)) and all(parts)
    write(src, 95)
    grown = pipeline(src, root)
    parts = [[x["name"] for x in grown.iterate(stream=(k, 2))] for k in range(2)]
    assert sorted(sum(parts, [])) == sorted(os.listdir(src))
    assert CALLS == ["f0095.txt"]


def test_to_torch_with_two_workers_sees_each_example_once(src, tmp_path):
    torch = pytest.importorskip("torch")
    root = tmp_path / "root"
    run(src, root)
    write(src, 96)
    ds = (sc.Dataset.from_files(str(src / "*.txt")).map(load)
          .snapshot(str(root), delta=True, progress=False).map(lambda x: x["value"]))
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
    assert sorted(int(v) for v in loader) == sorted(v for _, v in expected(src))


def test_local_glob_by_scandir_matches_glob_glob(tmp_path):
    import glob as glob_module

    from snapcache.store.source_files import _local_glob

    for name in ("a.txt", "b.txt", ".hidden.txt", "c.jpg", "[x].txt"):
        (tmp_path / name).write_text("1")
    (tmp_path / "d.txt").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.txt").write_text("1")
    for pattern in ("*.txt", "*", ".*", "?.txt", "[ab].txt", "*/*.txt", "**", "nothing*",
                    "missing/*.txt"):
        path = str(tmp_path / pattern)
        want = sorted(m for m in glob_module.glob(path, recursive=True) if not os.path.isdir(m))
        assert _local_glob(path) == want, pattern


def test_snapcache_explain_says_what_the_next_run_computes(src, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nimport snapcache as sc\n\n"
        "def parse(path):\n    return {'name': os.path.basename(path)}\n\n"
        f"def build():\n    return sc.Dataset.from_files({str(src / '*.txt')!r}).map(parse)"
        f".snapshot({str(tmp_path / 'root')!r}, delta=True, progress=False)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
         str(tmp_path)])}

    def explain():
        return subprocess.run([sys.executable, "-m", "snapcache.cli.main", "explain",
                               "--pipeline", "train:build"], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)

    subprocess.run([sys.executable, "-c", "import train; list(train.build())"], cwd=tmp_path,
                   env=env, check=True, timeout=120)
    assert explain().stdout.startswith("hit:")
    write(src, 500)
    proc = explain()
    assert proc.returncode == 1, proc.stderr
    assert ("source: 1 file added; computing 1 of 13 units, reusing 12 (92.3% of examples)"
            in proc.stdout)


def test_verify_checks_the_shards_of_every_version(src, tmp_path):
    from snapcache.admin import verify

    root = tmp_path / "root"
    run(src, root)
    write(src, 3, value=3333)            # version 2 copies the first segment's other rows
    run(src, root)
    storage = lineage(root)
    v1, v2 = versions.load_version(storage, 1), versions.load_version(storage, 2)
    only_v1 = [s for s in v1.shards if s.path not in {t.path for t in v2.shards}]
    assert only_v1
    report = verify(root=str(root))
    (check,) = report.checks
    assert check.ok and check.shards_checked == len({s.path for s in v1.shards + v2.shards})
    path = os.path.join(storage.root, only_v1[0].path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    (check,) = verify(root=str(root)).checks
    assert not check.ok and only_v1[0].path in " ".join(check.problems)


def test_a_waiting_delta_build_times_out_naming_the_builder(src, tmp_path):
    """The delta build waits with the protocol's own poll (store/protocol/negotiate.Poll):
    wait_timeout, the holder named, the way out."""
    from snapcache.errors import LeaseTimeoutError
    from snapcache.store.protocol import HOST, WriteLease

    root = tmp_path / "root"
    ds = (sc.Dataset.from_files(str(src / "*.txt")).map(load)
          .snapshot(str(root), progress=False, wait_timeout=0.2))
    folder = Storage(str(root)).child(ds.open_snapshot().id)
    held = WriteLease.acquire(folder, run_id="0badc0de", ttl=30.0)  # another builder
    try:
        with pytest.raises(LeaseTimeoutError, match=f"a version of delta snapshot .*{HOST} pid "
                                                    f"{os.getpid()}.*on_busy='compute'"):
            list(ds)
    finally:
        held.release()
    assert CALLS == []


# -- several builders of one version: streams split its segments -------------------------------
def test_streams_of_a_handle_split_the_segments_and_the_last_commits(src, tmp_path,
                                                                      monkeypatch):
    from snapcache.pipeline import delta_plan

    monkeypatch.setattr(delta_plan, "SEGMENT_UNITS", 4)
    root = tmp_path / "root"
    assert run(src, root) == expected(src)              # version 1: 3 segments
    for i in range(100, 110):                            # 3 tasks: 100-103, 104-107, 108-109
        write(src, i)
    ds = pipeline(src, root)
    snap = ds.open_snapshot()
    one = snap.write_stream(1, 2)                        # stream 1 of 2: task 1
    assert (one.status, one.examples) == ("written", 4)
    assert sorted(CALLS) == [f"f{i:04d}.txt" for i in range(104, 108)]
    assert snap.state != "committed"
    assert snap.commit(2) is None                        # tasks 0 and 2 are missing
    assert snap.stream_status(2).missing == [0]
    assert snap.write_stream(1, 2).status == "complete"  # a rerun finds its share done
    zero = snap.write_stream(0, 2)                       # tasks 0 and 2, then the commit
    assert (zero.status, zero.examples) == ("written", 6)
    assert sorted(CALLS) == [f"f{i:04d}.txt" for i in range(100, 110)]  # each once
    assert snap.state == "committed" and len(snap) == 22
    assert snap.commit(2).num_examples == 22
    CALLS.clear()
    assert sorted((x["name"], x["value"]) for x in ds) == expected(src) and CALLS == []
    storage = lineage(root)
    assert versions.versions(storage) == [1, 2]
    assert not [n for n in storage.listdir() if n.startswith(("segment-", "lease-"))]


def test_two_stream_processes_each_compute_their_share_of_a_version(src, tmp_path):
    root, pause = tmp_path / "root", tmp_path / "pause"
    assert start(src, root, tmp_path / "out0", tmp_path / "calls0").wait(timeout=120) == 0
    for i in range(100, 110):                            # 3 tasks: 100-103, 104-107, 108-109
        write(src, i)
    a = start(src, root, tmp_path / "a", tmp_path / "calls-a", pause=pause, stream=(0, 2))
    wait_for(pause, a)                                   # a: task 0 recorded, holds stream 0
    b = start(src, root, tmp_path / "b", tmp_path / "calls-b", stream=(1, 2))
    while not called(tmp_path / "calls-b") or len(called(tmp_path / "calls-b")) < 4:
        assert b.poll() is None, "stream 1 ended before computing its share"
        time.sleep(0.01)                                 # b computes task 1, then waits for a
    os.remove(pause)
    assert a.wait(timeout=120) == 0 and b.wait(timeout=120) == 0
    assert called(tmp_path / "calls-b") == [f"f{i:04d}.txt" for i in range(104, 108)]
    assert called(tmp_path / "calls-a") == [f"f{i:04d}.txt" for i in
                                             [100, 101, 102, 103, 108, 109]]
    shares = [[tuple(x) for x in json.load(open(tmp_path / out))] for out in ("a", "b")]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == expected(src)
    assert versions.versions(lineage(root)) == [1, 2]


def test_a_killed_streams_segments_are_built_by_the_other(src, tmp_path):
    root, pause = tmp_path / "root", tmp_path / "pause"
    assert start(src, root, tmp_path / "out0", tmp_path / "calls0").wait(timeout=120) == 0
    for i in range(100, 110):
        write(src, i)
    a = start(src, root, tmp_path / "a", tmp_path / "calls-a", pause=pause, stream=(0, 2))
    wait_for(pause, a)                                   # task 0 recorded
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=60)
    b = start(src, root, tmp_path / "b", tmp_path / "calls-b", stream=(1, 2))
    assert b.wait(timeout=120) == 0                      # its task 1, then the dead a's task 2
    assert called(tmp_path / "calls-b") == [f"f{i:04d}.txt" for i in range(104, 110)]
    assert called(tmp_path / "calls-a") == [f"f{i:04d}.txt" for i in range(100, 104)]
    manifest = versions.newest(lineage(root))
    assert manifest.version == 2 and manifest.num_examples == 22
    # b read its share of version 2; stream 0's share is read by a new stream-0 process
    again = start(src, root, tmp_path / "a2", tmp_path / "calls-a2", stream=(0, 2))
    assert again.wait(timeout=120) == 0 and called(tmp_path / "calls-a2") == []
    shares = [[tuple(x) for x in json.load(open(tmp_path / out))] for out in ("a2", "b")]
    assert sorted(shares[0] + shares[1]) == expected(src)


def test_a_builder_taken_over_while_stopped_reads_the_version_the_other_committed(src,
                                                                                  tmp_path):
    """SIGSTOP a builder after its first segment until its lease expires (ttl 5 s of the
    other's own clock); the other takes the stream over, reuses that segment, builds the rest
    and commits. Resumed, the first finds its lease lost: it commits nothing and reads the
    committed version (was: the epoch failed with LeaseLostError)."""
    root, pause = tmp_path / "root", tmp_path / "pause"
    assert start(src, root, tmp_path / "out0", tmp_path / "calls0").wait(timeout=120) == 0
    for i in range(100, 110):
        write(src, i)
    a = start(src, root, tmp_path / "a", tmp_path / "calls-a", pause=pause)
    wait_for(pause, a)                                   # task 0 recorded, lease held
    a.send_signal(signal.SIGSTOP)
    try:
        b = start(src, root, tmp_path / "b", tmp_path / "calls-b")
        assert b.wait(timeout=180) == 0                  # took the stream over, committed
    finally:
        os.remove(pause)
        a.send_signal(signal.SIGCONT)
    assert a.wait(timeout=120) == 0
    assert called(tmp_path / "calls-a") == [f"f{i:04d}.txt" for i in range(100, 104)]
    assert called(tmp_path / "calls-b") == [f"f{i:04d}.txt" for i in range(104, 110)]
    for out in ("a", "b"):
        assert [tuple(x) for x in json.load(open(tmp_path / out))] == expected(src)
    assert versions.versions(lineage(root)) == [1, 2]
