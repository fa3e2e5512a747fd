"""Failures on the wire to S3, through both clients (obstore, and s3fs as a forked DataLoader
worker uses it): errors say what failed, where, and what to do, the same through both
clients."""

from __future__ import annotations

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.errors import StoreError

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))


@pytest.fixture(params=["auto", "s3fs"])
def client(request, monkeypatch):
    monkeypatch.setenv("SNAPCACHE_S3_CLIENT", request.param)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's retries (s3fs), to be quick
    return request.param


def example(i):
    return {"i": i, "x": np.full(64, i, np.int64)}


def pipeline(root, **options):
    return sc.Dataset.range(300).map(example).snapshot(root, progress=False,
                                                       shard_size=8 << 10, **options)


def read_all(ds):
    return [int(e["i"]) for e in ds if (e["x"] == e["i"]).all()]


# -- errors, the same through both clients ----------------------------------------------------
def test_shard_uploads_that_fail_fail_the_build_with_a_store_error(s3_root, fault_proxy, client):
    fault_proxy.fail("PUT", ".arrow", "reset", times=-1)
    with pytest.raises(StoreError, match=f"writing snapshot .* to {s3_root}/.* failed: could "
                                         f"not reach {fault_proxy.endpoint} for the PUT of "
                                         f"{s3_root}/.*arrow.*Nothing was committed"):
        read_all(pipeline(s3_root))


def test_a_refusal_names_the_object_and_the_credentials(s3_root, fault_proxy, client):
    read_all(pipeline(s3_root))
    fault_proxy.fail("GET", "", "status", times=-1, status=403)
    fault_proxy.fail("HEAD", "", "status", times=-1, status=403)
    with pytest.raises(PermissionError, match=f"{fault_proxy.endpoint} refused the (HEAD|GET) "
                                              f"of {s3_root}/.*/manifest.json .*check the "
                                              "credentials"):
        read_all(pipeline(s3_root))
