"""`snapcache purge` through the console script, on local disk and S3, racing a reader too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from admin_fixtures import (abandoned_write, assert_one_line_error, end, exists, live_lease,
                            make_snapshot, run_cli, set_last_used, stopped_writer)

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["local", "s3"])
def any_root(request, root):
    return root if request.param == "local" else request.getfixturevalue("s3_root")


@pytest.fixture
def aged(any_root):
    """Committed snapshots used 1, 10 and 100 days ago, and an abandoned write."""
    ids = {}
    for name, days in (("new", 1), ("mid", 10), ("old", 100)):
        ids[name] = make_snapshot(any_root, name)
        set_last_used(any_root, ids[name], days)
    abandoned_write(any_root, "ab" * 16)
    return any_root, ids


def purge_json(*args):
    proc = run_cli("purge", *args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_dry_run_lists_exactly_what_would_go_and_deletes_nothing(aged):
    root, ids = aged
    sizes = {s["id"]: s["size_bytes"]
             for s in json.loads(run_cli("ls", root, "--json").stdout)["snapshots"]}
    proc = run_cli("purge", "--root", root, "--older-than", "7d", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"would delete 2 snapshots from {root}")
    assert ids["old"][:12] in out and ids["mid"][:12] in out and ids["new"][:12] not in out
    freed = sizes[ids["old"]] + sizes[ids["mid"]]
    assert f"would free" in out and f"({freed:,} bytes)" in out
    assert all(exists(root, fid, "manifest.json") for fid in ids.values())
    code, doc = purge_json("--root", root, "--older-than", "7d", "--dry-run")
    assert doc["dry_run"] and doc["freed_bytes"] == freed
    assert [d["name"] for d in doc["deleted"]] == ["mid", "old"]


def test_older_than_deletes_by_last_use(aged):
    root, ids = aged
    code, doc = purge_json("--root", root, "--older-than", "30d")
    assert code == 0 and [d["name"] for d in doc["deleted"]] == ["old"]
    assert not exists(root, ids["old"]) and exists(root, ids["mid"], "manifest.json")
    names = [s["name"] for s in json.loads(run_cli("ls", root, "--json").stdout)["snapshots"]]
    assert names == ["new", "mid", None]


def test_max_size_evicts_least_recently_used(aged):
    root, ids = aged
    snaps = json.loads(run_cli("ls", root, "--json").stdout)["snapshots"]
    size = {s["name"]: s["size_bytes"] for s in snaps}
    budget = size["new"] + size["mid"]  # the abandoned write and "old" must go, nothing else
    code, doc = purge_json("--root", root, "--max-size", f"{budget}B", "--dry-run")
    assert [d["name"] for d in doc["deleted"]] == [None, "old"] and doc["budget_met"]
    code, doc = purge_json("--root", root, "--max-size", f"{budget - 1}", "--dry-run")
    assert [d["name"] for d in doc["deleted"]] == [None, "old", "mid"]
    code, doc = purge_json("--root", root, "--max-size", f"{budget}", "--yes")
    assert code == 0 and doc["size_after"] <= budget
    assert not exists(root, ids["old"]) and exists(root, ids["mid"])


def test_incomplete_removes_abandoned_writes_only(aged):
    root, ids = aged
    live_lease(root, "cd" * 16, kind="write")  # a writer at work: not abandoned
    proc = run_cli("purge", "--root", root, "--incomplete")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "deleted 1 snapshot" in proc.stdout and "abandoned write" in proc.stdout
    assert not exists(root, "ab" * 16) and exists(root, "cd" * 16)
    assert all(exists(root, fid, "manifest.json") for fid in ids.values())


def test_live_read_lease_refuses_without_force(aged):
    root, ids = aged
    live_lease(root, ids["old"])
    proc = run_cli("purge", "old", "--root", root)
    assert proc.returncode == 1
    assert "kept 1 selected snapshot" in proc.stdout and "read lease of pid" in proc.stdout
    assert exists(root, ids["old"], "manifest.json")
    proc = run_cli("purge", ids["old"][:8], "--root", root, "--force")
    assert proc.returncode == 0 and "deleted 1 snapshot" in proc.stdout
    assert not exists(root, ids["old"])


def test_more_than_one_needs_yes_without_a_terminal(aged):
    root, ids = aged
    proc = run_cli("purge", "--root", root, "--older-than", "7d")
    assert_one_line_error(proc, "would delete 2 snapshots", "pass --yes")
    assert all(exists(root, fid) for fid in ids.values())
    proc = run_cli("purge", "--root", root, "--older-than", "7d", "-y")
    assert proc.returncode == 0 and "deleted 2 snapshots" in proc.stdout


@pytest.mark.parametrize("answer, deleted", [("n", False), ("yes", True)])
def test_interactive_confirmation(root, monkeypatch, capsys, answer, deleted):
    from snapcache.cli.main import main

    ids = [make_snapshot(root, name) for name in ("a", "b")]
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    asked = []
    monkeypatch.setattr("builtins.input", lambda q: asked.append(q) or answer)
    code = main(["purge", "a", "b", "--root", root])
    assert asked == ["Delete these 2 snapshots? [y/N] "]
    assert code == (0 if deleted else 1)
    assert all(exists(root, fid) != deleted for fid in ids)


READER = textwrap.dedent('''
    import sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    import snapcache as sc
    from admin_fixtures import expected_example
    from snapcache.errors import CorruptSnapshotError

    # prefetch_bytes: read ahead little, so purge wins the race
    ds = sc.Dataset.range({n}).map(lambda i: expected_example(i, {width})).snapshot(
        {root!r}, key="race", name="race", shard_size={shard_size},
        prefetch_bytes={shard_size})
    seen = 0
    try:
        for k, example in enumerate(ds):
            want = expected_example(k, {width})
            if example["i"] != k or not np.array_equal(example["x"], want["x"]):
                print("WRONG", k, flush=True)
                sys.exit(3)
            if k == 0:
                print("started", flush=True)
            seen += 1
            time.sleep({delay})
        print("OK", seen, flush=True)
    except CorruptSnapshotError as e:
        print("CORRUPT", e, flush=True)
''')


def test_purge_racing_a_reader(any_root):
    n, width, shard_size = 300, 64, 16 << 10
    fid = make_snapshot(any_root, "race", n, width=width, shard_size=shard_size)
    script = READER.format(tests=TESTS, n=n, width=width, root=any_root,
                           shard_size=shard_size, delay=0.03)
    reader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "started", reader.stderr.read()
        proc = run_cli("purge", "race", "--root", any_root)
        assert proc.returncode == 1 and "in use: read lease of pid" in proc.stdout, proc.stdout
        assert exists(any_root, fid, "manifest.json")
        assert reader.poll() is None, "the reader finished too early for the race"
        proc = run_cli("purge", "race", "--root", any_root, "--force")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not exists(any_root, fid, "manifest.json")
        out, err = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, out + err
    result = out.strip().splitlines()[-1]
    # Either the reader finishes from the shards it already holds, with the right data, or it
    # stops with a clear error naming the missing shard: never wrong data.
    assert result == f"OK {n}" or (result.startswith("CORRUPT") and "missing" in result), result


def _delta_versions(tmp_path, root: str, count: int) -> str:
    """A delta snapshot (files, the default) with versions 1..count (one file more each)."""
    import numpy as np

    import snapcache as sc

    files = tmp_path / "files"
    files.mkdir()
    for version in range(1, count + 1):
        np.save(files / f"f{version:02d}.npy", np.full(4, version))
        ds = sc.Dataset.from_files(str(files / "*.npy")).map(np.load).snapshot(
            root, name="logs", progress=False)
        assert len(list(ds)) == version
        del ds  # a pipeline that can read again holds a read lease: let it go
    [snap] = sc.ls(root)
    assert snap.versions == tuple(range(1, count + 1))
    return snap.id


def test_old_versions_are_named_by_number(tmp_path, root):
    fid = _delta_versions(tmp_path, root, 3)
    proc = run_cli("purge", root, "--old-versions", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.startswith(f"would remove versions 1, 2 of {fid[:12]} (logs): ")
    assert line.endswith("; version 3, the newest, stays")
    assert "leftover" not in proc.stdout
    code, doc = purge_json(root, "--old-versions")
    [old] = doc["old_versions"]
    assert old["id"] == fid and old["versions"] == [1, 2] and old["newest"] == 3
    assert {f"{fid}/{name}" for name in old["files"]} <= set(doc["tidied"])
    assert any(name.endswith("manifest-000001.json") for name in old["files"])
    proc = run_cli("info", root, fid[:8])
    assert "versions   3 (newest 3)" in proc.stdout


def test_a_write_that_grows_between_plan_and_purge_is_reported_consistently(
        root, monkeypatch, capsys):
    """The executed purge's sizes come from one scan: a folder that grew after the plan was
    made reported a negative size after the purge ("256.4 KB -> -45.1 KB")."""
    from snapcache.cli import main as cli_main
    from snapcache.cli import purge as cli_purge
    from snapcache.store.fs import Storage

    make_snapshot(root, "kept")
    abandoned_write(root, "ab" * 16)
    real = cli_purge.purge

    def growing(*args, **kwargs):
        if not kwargs.get("dry_run"):  # the plan is made: the abandoned folder grows
            Storage(root).child("ab" * 16).write_atomic("0badc0de-0000-000001.arrow",
                                                        b"\0" * 200_000)
        return real(*args, **kwargs)
    monkeypatch.setattr(cli_purge, "purge", growing)
    code = cli_main.main(["purge", "--root", root, "--incomplete", "--yes", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and not exists(root, "ab" * 16)
    assert doc["freed_bytes"] > 200_000
    assert doc["size_after"] == doc["size_before"] - doc["freed_bytes"] >= 0


@pytest.mark.parametrize("confirm", ["on a terminal", "--yes"])
def test_purge_deletes_only_what_was_confirmed(root, monkeypatch, capsys, confirm):
    """Two writers killed half-way left abandoned writes; a third is stopped, its lease live.
    `purge --incomplete` plans the two; the third writer dies after the plan (while the
    question is on screen): the two planned go, the third stays, reported with why."""
    import snapcache as sc
    from snapcache.cli import main as cli_main
    from snapcache.cli import purge as cli_purge

    for n in (3000, 3001):
        end(stopped_writer(root, n))  # SIGKILL: its lease is a dead process's
    live = stopped_writer(root, 3002)
    try:
        assert sorted(s.state for s in sc.ls(root)) == ["abandoned", "abandoned", "writing"]
        asked = []
        if confirm == "--yes":
            real = cli_purge.purge

            def planned_then_dies(*args, **kwargs):
                report = real(*args, **kwargs)
                if kwargs.get("dry_run"):
                    end(live)
                return report
            monkeypatch.setattr(cli_purge, "purge", planned_then_dies)
        else:
            def answer(question):
                asked.append(question)
                end(live)  # dies while the question is on screen
                return "y"
            monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
            monkeypatch.setattr("builtins.input", answer)
        code = cli_main.main(["purge", root, "--incomplete"] +
                             (["--yes"] if confirm == "--yes" else []))
        out = " ".join(capsys.readouterr().out.split())  # the table's cells may wrap
    finally:
        end(live)
    assert asked == ([] if confirm == "--yes" else ["Delete these 2 snapshots? [y/N] "])
    assert [s.state for s in sc.ls(root)] == ["abandoned"]  # the one not confirmed
    assert "deleted 2 snapshots" in out and "kept 1 selected snapshot" in out
    assert "not in the plan: abandoned write" in out and "run purge again" in out
    assert code == 1
