"""The S3 client choice (snapcache/store/fs_s3.py S3Clients, snapcache/store/fs_obstore.py):
obstore serves the requests when the storage options can be said in its terms, s3fs otherwise
and in a process forked after obstore started; either way the same requests, answers and
errors. Against the moto server of tests/s3server.py; requests counted for the test's own
bucket only."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.store import fs_obstore, fs_s3
from snapcache.store.fs import Storage

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "eu-west-1",
       "AWS_CONFIG_FILE": "/nonexistent", "HOME": "/nonexistent"}


# -- which options obstore can serve (pure) ----------------------------------------------------
@pytest.mark.parametrize("options, env, expected", [
    ({}, ENV, {"access_key_id": "k", "secret_access_key": "s", "region": "eu-west-1"}),
    ({"key": "a", "secret": "b", "token": "t", "client_kwargs": {
        "endpoint_url": "http://h:9000", "region_name": "auto"}}, {"HOME": "/nonexistent"},
     {"access_key_id": "a", "secret_access_key": "b", "session_token": "t", "region": "auto",
      "endpoint": "http://h:9000", "aws_endpoint_url_s3": "http://h:9000"}),
    ({"anon": True, "endpoint_url": "https://h"}, {"HOME": "/nonexistent"},
     {"skip_signature": True, "region": "us-east-1", "endpoint": "https://h",
      "aws_endpoint_url_s3": "https://h"}),
    ({"skip_instance_cache": True}, {**ENV, "AWS_ENDPOINT_URL_S3": "http://e:1",
                                     "AWS_ENDPOINT_URL": "http://other:2"},
     {"access_key_id": "k", "secret_access_key": "s", "region": "eu-west-1",
      "endpoint": "http://e:1", "aws_endpoint_url_s3": "http://e:1"}),
], ids=["env credentials", "explicit options", "anonymous", "endpoint variables"])
def test_options_obstore_can_express(options, env, expected):
    assert fs_obstore.store_config(options, env) == expected


@pytest.mark.parametrize("options, env", [
    ({"profile": "dev"}, ENV),
    ({"config_kwargs": {"retries": {"max_attempts": 10}}}, ENV),
    ({"client_kwargs": {"verify": False}}, ENV),
    ({"key": "only-half"}, ENV),
    ({}, {**ENV, "AWS_PROFILE": "dev"}),
    ({}, {"HOME": "/nonexistent", "AWS_DEFAULT_REGION": "eu-west-1"}),  # no credentials
    ({}, {**ENV, "AWS_DEFAULT_REGION": ""}),  # no region, no endpoint: botocore follows redirects
    ({}, {**ENV, "SNAPCACHE_S3_CLIENT": "s3fs"}),
], ids=["profile", "botocore config", "other client_kwargs", "half a key pair", "AWS_PROFILE",
        "credentials only botocore finds", "no region", "forced"])
def test_options_only_s3fs_can_serve(options, env):
    assert fs_obstore.store_config(options, env) is None


def test_an_aws_config_file_with_settings_botocore_uses_sends_the_root_to_s3fs(tmp_path):
    config = tmp_path / "config"
    env = {**ENV, "AWS_CONFIG_FILE": str(config)}
    config.write_text("[default]\nregion = eu-west-1\n[profile other]\nendpoint_url = http://x\n")
    assert fs_obstore.store_config({}, env) is not None  # the region is given anyway
    assert fs_obstore.store_config({}, {**env, "AWS_DEFAULT_REGION": ""}) is None
    config.write_text("[default]\nendpoint_url = http://x\n")
    assert fs_obstore.store_config({}, env) is None
    config.write_text("[default]\ns3 =\n  addressing_style = virtual\n")
    assert fs_obstore.store_config({}, env) is None


# -- fresh processes ---------------------------------------------------------------------------
RUN = textwrap.dedent("""
    import os, sys
    import numpy as np
    import snapcache as sc
    from snapcache.store import fs_obstore

    def example(i):
        return {"x": np.full(4096, i % 251, np.uint8), "i": i}

    root, cache = sys.argv[1:3]
    ds = sc.Dataset.range(300).map(example).snapshot(root, progress=False, key="k",
                                                     shard_size=256 << 10, local_cache=cache)
    total = sum(int(e["i"]) for e in ds)
    print(total, "s3fs" in sys.modules, fs_obstore.used_here())
""")


def run(script: str, *args: str, env: dict | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_fresh_process_builds_and_reads_without_importing_s3fs(s3_root, tmp_path):
    expected = str(sum(range(300)))
    # build, then a cold read (empty cache) in another fresh process: obstore only
    assert run(RUN, s3_root, str(tmp_path / "a")) == [expected, "False", "True"]
    assert run(RUN, s3_root, str(tmp_path / "b")) == [expected, "False", "True"]
    # the same snapshot through s3fs (forced): same answer
    assert run(RUN, s3_root, str(tmp_path / "c"), env={"SNAPCACHE_S3_CLIENT": "s3fs"}) == \
        [expected, "True", "False"]


FORK = textwrap.dedent("""
    import os, sys
    import numpy as np
    import snapcache as sc
    from snapcache.store import fs_obstore
    from snapcache.store.fs import Storage

    def example(i):
        return {"x": np.full(4096, i % 251, np.uint8), "i": i}

    root, cache = sys.argv[1:3]
    ds = sc.Dataset.range(300).map(example).snapshot(root, progress=False, key="k",
                                                     shard_size=256 << 10)
    assert sum(1 for _ in ds) == 300 and fs_obstore.used_here()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reads everything again (no local cache), then exits
        os.close(r)
        ok = sum(int(e["i"]) for e in ds) == sum(range(300))
        os.write(w, f"{ok} {'s3fs' in sys.modules} {fs_obstore.used_here()}".encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read()
    _, status = os.waitpid(pid, 0)
    print(child, status, sum(int(e["i"]) for e in ds) == sum(range(300)),
          Storage(root).exists(), fs_obstore.used_here())
""")


def test_a_forked_child_uses_s3fs_and_the_parent_goes_on_with_obstore(s3_root, tmp_path):
    """obstore's runtime does not survive a fork: a child of a process that used it reads
    through s3fs (as a DataLoader worker does), and neither hangs."""
    assert run(FORK, s3_root, str(tmp_path)) == ["True", "True", "False", "0", "True", "True",
                                                 "True"]


# -- the same errors through both clients ------------------------------------------------------
CLIENTS = ["auto", "s3fs"]


@pytest.fixture(params=CLIENTS)
def client(request, monkeypatch):
    monkeypatch.setenv("SNAPCACHE_S3_CLIENT", request.param)
    return request.param


def test_a_missing_bucket_reads_as_missing(s3_root, client):
    storage = Storage(f"s3://snapcache-no-such-bucket-{os.getpid()}/snaps")
    assert not storage.bucket_exists()
    assert not storage.exists()
    assert storage.listdir() == []
    assert storage.version("manifest.json") is None
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("manifest.json")
    with pytest.raises(sc.SnapshotNotFoundError):
        sc.open_snapshot(storage.url, "missing")


def test_the_storage_answers_the_same_through_both_clients(s3_root, client):
    storage = Storage(s3_root)
    assert storage.create_exclusive("a/x", b"one") is True
    assert storage.create_exclusive("a/x", b"two") is False
    assert storage.read_bytes("a/x") == b"one"
    storage.write_atomic("a/x", b"three")
    assert storage.read_bytes("a/x") == b"three"
    assert storage.read_range("a/x", 1, 3) == b"hr"
    assert storage.read_range("a/x", 3, 100) == b"ee"  # a range past the end is shortened
    assert storage.size("a/x") == 5 and storage.modified("a/x") is not None
    assert storage.version("a/x")[1] == 5 and storage.version("a/missing") is None
    with pytest.raises(FileNotFoundError):
        storage.size("a/missing")
    storage.upload("a/b/y", b"1234")
    assert storage.listdir() == ["a"] and storage.listdir("a") == ["b", "x"]
    assert [(f.path, f.size) for f in storage.walk("a")] == [("b/y", 4), ("x", 5)]
    assert storage.exists("a") and storage.exists("a/x") and not storage.exists("a/z")
    storage.remove("a/x")
    storage.remove("a/x")  # missing: no error
    storage.remove("a", recursive=True)
    assert storage.listdir() == [] and storage.walk() == []
    assert storage.bucket_exists()


def test_an_unreachable_endpoint_is_a_connection_error_naming_it(client, monkeypatch):
    port = s3server.free_port()  # nothing listens there
    options = {"key": "k", "secret": "s",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's retries (s3fs), to be quick
    with pytest.raises(ConnectionError, match=f"could not reach http://127.0.0.1:{port} for "
                                              "the GET of s3://bucket/snaps/manifest.json .*"
                                              "check the endpoint"):
        Storage("s3://bucket/snaps", options).read_bytes("manifest.json")
    with pytest.raises(ConnectionError, match=f"could not reach http://127.0.0.1:{port} for "
                                              "the LIST of s3://bucket/snaps .*"):
        Storage("s3://bucket/snaps", options).incomplete_uploads()  # purge --incomplete


@pytest.fixture(scope="module")
def strict_server():
    """A moto server that checks credentials (IAM) from its first request."""
    old = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    try:
        with tempfile.TemporaryFile(prefix="snapcache-moto-") as log:
            server = s3server.start(log)
            try:
                yield server
            finally:
                s3server.stop(server.process)
    finally:
        if old is None:
            del os.environ["INITIAL_NO_AUTH_ACTION_COUNT"]
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = old


def test_refused_credentials_are_a_permission_error(strict_server, client):
    options = {"key": "AKIAWRONG", "secret": "wrong",
               "client_kwargs": {"endpoint_url": strict_server.endpoint}}
    storage = Storage("s3://some-bucket/snaps", options)
    refused = f"{strict_server.endpoint} refused the %s of s3://some-bucket/snaps/%s .*check " \
              "the credentials"
    with pytest.raises(PermissionError, match=refused % ("GET", "manifest.json")):
        storage.read_bytes("manifest.json")
    with pytest.raises(PermissionError, match=refused % ("PUT", "x")):
        storage.write_atomic("x", b"1")
    with pytest.raises(PermissionError, match=f"{strict_server.endpoint} refused the LIST of "
                                              "s3://some-bucket/snaps .*check the credentials"):
        storage.incomplete_uploads()  # purge --incomplete: multipart uploads, through s3fs
    with pytest.raises(PermissionError, match="refused the DELETE of s3://some-bucket/snaps"):
        storage.abort_upload(fs_s3.Upload("x", "id", 0.0))


def test_a_child_of_a_process_that_imported_obstore_does_not_use_it():
    """Another library of the parent may have started obstore's runtime (LitData uses it)."""
    script = textwrap.dedent("""
        import os, sys
        import obstore  # as another library would
        from snapcache.store import fs_obstore
        pid = os.fork()
        if pid == 0:
            print(fs_obstore.usable(), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print(fs_obstore.usable())
    """)
    assert run(script) == ["False", "True"]


def test_a_storage_pickles_and_picks_its_client_where_it_is_unpickled(s3_root):
    import pickle

    storage = Storage(s3_root)
    storage.write_atomic("x", b"1")
    again = pickle.loads(pickle.dumps(storage.child("")))
    assert again.read_bytes("x") == b"1" and again.url == storage.url
