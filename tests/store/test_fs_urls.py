"""Storage roots given as text: a URL with a slash missing is refused, not made a local folder."""

from __future__ import annotations

import os

import pytest

from snapcache.store.fs import Storage, check_url


@pytest.mark.parametrize("text, fixed", [
    ("s3:/bucket/snaps", "s3://bucket/snaps"),
    ("gs:/b", "gs://b"),
    ("s3a:/bucket", "s3a://bucket"),
    ("memory:/x/y", "memory://x/y"),
])
def test_a_url_with_one_slash_is_refused_naming_the_fix(tmp_path, monkeypatch, text, fixed):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as caught:
        Storage(text)
    message = str(caught.value)
    assert message.startswith(f"{text!r} looks like a URL with a slash missing: write "
                              f"{fixed!r}")
    assert f"a local folder named '{text.split(':')[0]}:'" in message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text", [
    "s3://bucket/snaps", "memory://x", "snaps", "./s3:/x", "/tmp/s3:/x", "data/a:/b",
    "S3:/bucket",  # not lowercase: not taken for a scheme
])
def test_urls_and_local_paths_pass(text):
    check_url(text)
