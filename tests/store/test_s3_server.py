"""The S3 test server, and the S3 behaviour the store relies on, pinned against it.

The lease takes a snapshot by creating its lock object with a conditional PUT
(``If-None-Match: *``); through s3fs that is ``pipe_file(path, data, mode="create")``, which
must raise ``FileExistsError`` when the key exists and leave the object untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from snapcache.store.fs import Storage


@pytest.fixture
def s3fs_filesystem(s3_root):
    """The instance-cached S3FileSystem production code would get from the environment."""
    import fsspec

    return fsspec.filesystem("s3")


def bucket_of(url: str) -> str:
    return url.removeprefix("s3://").split("/", 1)[0]


def test_the_environment_alone_points_s3fs_at_the_server(s3_server, s3_root, s3fs_filesystem):
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint
    assert s3fs_filesystem.s3.meta.endpoint_url == s3_server.endpoint
    assert bucket_of(s3_root) in s3fs_filesystem.ls("", refresh=True)


def test_conditional_create_fails_with_file_exists_error_when_the_key_exists(
        s3_root, s3fs_filesystem):
    fs = s3fs_filesystem
    path = f"{bucket_of(s3_root)}/lease.json"
    fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(FileExistsError) as info:
        fs.pipe_file(path, b"second", mode="create")
    # s3fs translates botocore's 412 PreconditionFailed and chains it
    cause = info.value.__cause__
    assert type(cause).__name__ == "ClientError"
    assert cause.response["Error"]["Code"] == "PreconditionFailed"
    assert fs.cat_file(path) == b"first"
    fs.pipe_file(path, b"third")  # an unconditional PUT still overwrites
    assert fs.cat_file(path) == b"third"


def test_exactly_one_of_many_racing_conditional_creates_wins(s3_root, s3fs_filesystem):
    fs = s3fs_filesystem
    path = f"{bucket_of(s3_root)}/race/lease.json"
    winners, losers, errors = [], [], []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        try:
            fs.pipe_file(path, f"owner {i}".encode(), mode="create")
            winners.append(i)
        except FileExistsError:
            losers.append(i)
        except Exception as e:  # anything else is a bug the test must show
            errors.append(e)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(winners) == 1 and len(losers) == 7
    assert fs.cat_file(path) == f"owner {winners[0]}".encode()


def test_storage_round_trip(s3_root):
    storage = Storage(s3_root)
    storage.write_atomic("abc/manifest.json", b"{}")
    assert storage.read_bytes("abc/manifest.json") == b"{}"
    assert storage.listdir() == ["abc"]
    assert storage.size("abc/manifest.json") == 2
    storage.remove("abc", recursive=True)
    assert storage.listdir() == []


def test_a_subprocess_reaches_the_server_through_the_inherited_environment(s3_root):
    Storage(s3_root).write_atomic("hello.txt", b"from the parent")
    code = ("import json, sys, fsspec; fs = fsspec.filesystem('s3'); "
            "print(json.dumps(fs.cat_file(sys.argv[1]).decode()))")
    out = subprocess.run([sys.executable, "-c", code, f"{s3_root}/hello.txt"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == "from the parent"
