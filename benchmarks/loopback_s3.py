"""The tests' loopback S3 server (``tests/s3server.py``: moto in server mode on 127.0.0.1 and
a free port) for the benchmarks that measure snapcache, and its peers, on S3.

Example::

    with loopback_s3() as (server, bucket, s3server):
        ds = sc.Dataset.range(10).snapshot(f"s3://{bucket}/snaps")
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Any, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def loopback_s3() -> Iterator[tuple[Any, str, Any]]:
    """``(server, bucket, s3server)``: a running server, a fresh bucket in it and the tests'
    ``s3server`` module, with the server's endpoint and credentials in the environment for
    the block (restored after). RuntimeError naming what is missing when moto or s3fs is not
    installed."""
    sys.path.insert(0, ROOT)
    try:
        from tests import s3server
    except ImportError as e:
        raise RuntimeError(f"the tests' S3 server launcher cannot be imported: {e}") from None
    why = s3server.missing_requirements()
    if why:
        raise RuntimeError(why)
    with tempfile.TemporaryFile() as log:
        server = s3server.start(log)
        server.log = log  # the server's access log (bench_access counts requests in it)
        saved = dict(os.environ)
        try:
            os.environ.update(server.env)
            bucket = s3server.new_bucket_name()
            server.filesystem().mkdir(bucket)
            s3server.clear_filesystem_caches()
            yield server, bucket, s3server
        finally:
            os.environ.clear()
            os.environ.update(saved)
            s3server.stop(server.process)
