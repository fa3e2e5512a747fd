"""One vocabulary: every command takes the root the same way (first positional or --root), a
path where an id was expected gets a one-line hint, -o KEY=VALUE storage options reach a
non-AWS endpoint, an emptied S3 root lists as empty. Through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import snapcache as sc
from admin_fixtures import abandoned_write, assert_one_line_error, make_snapshot
from snapcache.pipeline.handle import STATES as HANDLE_STATES
from snapcache.store.catalog import STATES

SCRIPT = shutil.which("snapcache")
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="the snapcache console script is not "
                                "installed (pip install -e .)")


def snapcache(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", [
    ["ls"], ["info", "{id}"], ["verify"], ["verify", "{id}"], ["purge", "{id}", "--dry-run"],
])
def test_every_command_takes_the_root_first_or_as_root(root, command):
    fid = make_snapshot(root, "train")
    args = [part.format(id=fid[:8]) for part in command]
    first = snapcache(args[0], root, *args[1:])
    option = snapcache(*args, "--root", root)
    assert first.returncode == 0, first.stderr
    assert option.returncode == 0, option.stderr
    assert first.stdout == option.stdout
    assert fid[:12] in first.stdout


def test_a_path_where_an_id_was_expected_gets_a_hint(root, tmp_path):
    make_snapshot(root, "train")
    proc = snapcache("info", "--root", root, str(tmp_path / "other"))
    assert_one_line_error(proc, "looks like a path, not a snapshot id", "--root")
    proc = snapcache("purge", root, "--root", str(tmp_path / "other"), "--dry-run")
    assert_one_line_error(proc, f"{root!r} looks like a path")
    proc = snapcache("ls", root, "--root", str(tmp_path / "other"))
    assert_one_line_error(proc, "two roots given")


def test_a_path_given_to_purge_is_the_root(tmp_path):
    """The issue's report: `purge /data/snaps --max-size 0` took the path as an id."""
    missing = str(tmp_path / "data" / "snaps")
    proc = snapcache("purge", missing, "--max-size", "0")
    assert_one_line_error(proc, f"snapshot root {missing} does not exist")


def test_one_set_of_state_words(root):
    assert STATES == HANDLE_STATES
    fid = make_snapshot(root, "train")
    abandoned_write(root, "ab" * 16)
    doc = json.loads(snapcache("ls", root, "--json").stdout)
    assert {s["state"] for s in doc["snapshots"]} == {"committed", "abandoned"}
    assert {s["state"] for s in doc["snapshots"]} <= set(STATES)
    assert sc.open_snapshot(root, "ab" * 16).state == "abandoned"
    assert sc.open_snapshot(root, fid).state == "committed"


def test_purge_names_abandoned_writes_by_their_state_word(root):
    make_snapshot(root, "train")
    abandoned_write(root, "ab" * 16)
    for flag in ("--abandoned", "--incomplete"):
        doc = json.loads(snapcache("purge", root, flag, "--dry-run", "--json").stdout)
        assert [item["id"] for item in doc["deleted"]] == ["ab" * 16], doc


def test_admin_api_takes_the_root_first(root):
    fid = make_snapshot(root, "train")
    assert [s.id for s in sc.ls(root)] == [fid]
    assert sc.info(root, "train").id == fid
    assert sc.verify(root, [fid[:6]]).ok
    assert sc.open_snapshot(root, "train").id == fid
    assert [i.snapshot.id for i in sc.purge(root, ids=["train"], dry_run=True).deleted] == [fid]


def _no_endpoint_env() -> dict:
    """The client environment with no endpoint: only -o options can reach the server."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    return env


def test_storage_options_reach_a_non_aws_endpoint(s3_server, s3_root):
    fid = make_snapshot(s3_root, "remote")
    endpoint = s3_server.endpoint
    options = ["-o", "key=testing", "-o", "secret=testing",
               "-o", f"client_kwargs.endpoint_url={endpoint}"]
    env = _no_endpoint_env()
    for args in (["ls", s3_root], ["info", s3_root, "remote"], ["verify", s3_root],
                 ["purge", s3_root, "remote", "--dry-run"]):
        proc = subprocess.run([SCRIPT, *args, *options], capture_output=True, text=True,
                              timeout=120, env=env)
        assert proc.returncode == 0, (args, proc.stderr)
        assert fid[:12] in proc.stdout, (args, proc.stdout)
    # The same through AWS_ENDPOINT_URL, as the docs show for MinIO or R2.
    proc = snapcache("ls", s3_root, env={"AWS_ENDPOINT_URL": endpoint})
    assert proc.returncode == 0 and fid[:12] in proc.stdout, proc.stderr
    # And through the API's storage_options=.
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    assert [s.id for s in sc.ls(s3_root, storage_options=s3_server.storage_options)] == [fid]


def read_text(path):
    return {"n": int(open(path).read())}


def test_storage_options_reach_the_versions_of_a_delta_snapshot(s3_server, s3_root, tmp_path):
    """info of a delta snapshot reads its versions' manifests with the -o options too."""
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(str(i))
    ds = sc.Dataset.from_files(str(tmp_path / "*.txt")).map(read_text).snapshot(
        s3_root, name="grown", progress=False)
    assert len(list(ds)) == 3
    options = ["-o", "key=testing", "-o", "secret=testing",
               "-o", f"client_kwargs.endpoint_url={s3_server.endpoint}"]
    proc = subprocess.run([SCRIPT, "info", s3_root, "grown", *options], capture_output=True,
                          text=True, timeout=120, env=_no_endpoint_env())
    assert proc.returncode == 0, proc.stderr
    assert "versions" in proc.stdout and "1 (newest 1)" in proc.stdout, proc.stdout


def test_an_emptied_s3_root_lists_as_empty(s3_root):
    fid = make_snapshot(s3_root, "gone")
    assert snapcache("purge", s3_root, fid, "--yes").returncode == 0
    proc = snapcache("ls", s3_root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"no snapshots in {s3_root}"
    assert sc.ls(s3_root) == []
    bucketless = "s3://snapcache-no-such-bucket-x1/snaps"
    assert_one_line_error(snapcache("ls", bucketless), f"snapshot root {bucketless} does not exist")


def test_storage_option_values_parse_as_json_else_text():
    from snapcache.cli.common import parse_storage_options

    assert parse_storage_options(["anon=true", "client_kwargs.endpoint_url=http://h:9000",
                                  "client_kwargs.region_name=auto", "max_concurrency=4"]) == {
        "anon": True, "max_concurrency": 4,
        "client_kwargs": {"endpoint_url": "http://h:9000", "region_name": "auto"}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_storage_options(["anon"])
