"""What snapcache asks of S3 beyond fsspec's common interface, through s3fs.

Only :mod:`snapcache.store.fs` calls these (its :class:`~snapcache.store.fs.Storage` decides when a
filesystem is S3); together the two are the only modules that talk to fsspec. Each function says
how many requests it makes, because on S3 requests are what a snapshot's phases cost:

- :func:`list_names`: one LIST of a folder (s3fs's ``ls`` lists the parent too when it is empty);
- :func:`read_whole`: one GET, or concurrent ranged GETs for a large file of known size;
- :func:`create`: a conditional PUT (``If-None-Match: *``), the primitive of leases and commits;
- :func:`upload`: one PUT, or a multipart upload whose parts go up in parallel;
- :func:`listed_identities`: the size and ETag of a folder's objects, one LIST per 1,000;
- :func:`incomplete_uploads` / :func:`abort_upload`: multipart uploads nobody completed.
"""

from __future__ import annotations

import posixpath
import sys
import threading
from typing import Any, NamedTuple

import fsspec
import fsspec.asyn

RANGE_BYTES = 32 << 20
"""A file larger than this whose size is known is fetched in ranges of this size, concurrently."""
PART_BYTES = 64 << 20
"""An upload of at least twice this is a multipart upload of parts of this size (S3 wants parts
of 5 MiB or more); a smaller one is a single PUT. A writer keeps several shards uploading at
once, so one PUT a shard already keeps several connections busy."""
PART_CONCURRENCY = 4
"""Parts of one multipart upload in flight at once."""


class Upload(NamedTuple):
    """An unfinished multipart upload (object stores) below a Storage."""

    path: str             # relative to the Storage
    upload_id: str
    initiated: float      # seconds since the epoch


_IMPORT_LOCK = threading.Lock()
_UNUSED_TLS_BACKEND = "urllib3.contrib.pyopenssl"


def import_s3fs(url: str) -> None:
    """For an ``s3://`` URL, import s3fs (fsspec would) without what it does not use.

    botocore's ``httpsession`` imports ``urllib3.contrib.pyopenssl`` only to take the standard
    library's ``SSLContext`` back out of it, and that module imports pyOpenSSL and
    cryptography when they are installed: ~60 ms of the ~0.5 s a process's first S3 access
    pays here. While s3fs is imported, that module reads as absent, so botocore takes the same
    class from ``urllib3.util.ssl_``; the entry is removed again at once, so any later import
    of it works as usual. A process that already imported it is left alone. An ImportError
    (s3fs missing) is raised as fsspec would raise it."""
    if not url.startswith(("s3://", "s3a://")) or "s3fs" in sys.modules:
        return
    with _IMPORT_LOCK:
        if "s3fs" in sys.modules:
            return
        blocked = _UNUSED_TLS_BACKEND not in sys.modules
        if blocked:
            sys.modules[_UNUSED_TLS_BACKEND] = None  # type: ignore[assignment]
        try:
            import s3fs  # noqa: F401
        finally:
            if blocked and sys.modules.get(_UNUSED_TLS_BACKEND, 0) is None:
                del sys.modules[_UNUSED_TLS_BACKEND]


def is_s3(fs: fsspec.AbstractFileSystem, protocol: str) -> bool:
    """Whether ``fs`` is s3fs (the functions of this module apply to it)."""
    return protocol in ("s3", "s3a") and hasattr(fs, "_lsdir")


def list_names(fs: Any, path: str) -> list[str]:
    """Full paths of the entries directly inside ``path``: one LIST request, never cached.
    FileNotFoundError if there is nothing there."""
    return [e["name"] for e in fsspec.asyn.sync(fs.loop, fs._lsdir, path.rstrip("/"),
                                                refresh=True)]


def read_whole(fs: Any, path: str, size: int | None) -> bytes:
    """The whole object, in one GET (s3fs would first ask for its size: a HEAD, and a LIST when
    it is missing); with its ``size`` known and above :data:`RANGE_BYTES`, as concurrent ranged
    GETs."""
    if size is None or size <= RANGE_BYTES:
        return fs.cat_file(path, max_concurrency=1)
    starts = list(range(0, size, RANGE_BYTES))
    try:
        parts = fs.cat_ranges([path] * len(starts), starts,
                              [min(size, s + RANGE_BYTES) for s in starts], on_error="raise")
    except FileNotFoundError:
        raise
    except OSError:  # e.g. a range past the end of a file shorter than said: read it whole
        return fs.cat_file(path, max_concurrency=1)
    return b"".join(parts)


def read_versioned(fs: Any, path: str) -> tuple[bytes, tuple]:
    """The whole object and its version, (ETag, size) as a HEAD would give them, from one
    GET (no HEAD after it). FileNotFoundError if it is missing."""
    bucket, key, _ = fs.split_path(path)

    async def get() -> tuple[bytes, tuple]:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        try:
            data = await response["Body"].read()
        finally:
            response["Body"].close()
        return data, (str(response["ETag"]), int(response["ContentLength"]))

    return fsspec.asyn.sync(fs.loop, get)


def create(fs: Any, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists (a conditional PUT); True if this call
    created it."""
    try:
        fs.pipe_file(path, data, mode="create")
        return True
    except FileExistsError:
        return False
    except OSError:
        if fs.exists(path):  # a PreconditionFailed the client did not map
            return False
        raise


def upload(fs: Any, path: str, data: bytes | str) -> None:
    """Store ``data`` (bytes, or the name of a local file holding them) at ``path``: one PUT
    below ``2 * PART_BYTES``, else a multipart upload of :data:`PART_BYTES` parts,
    :data:`PART_CONCURRENCY` at a time (aborted if a part fails: no parts left billed)."""
    if isinstance(data, str):
        fs.put_file(data, path, chunksize=PART_BYTES, max_concurrency=PART_CONCURRENCY)
    else:
        fs.pipe_file(path, data, chunksize=PART_BYTES, max_concurrency=PART_CONCURRENCY)


def listed_identities(fs: Any, path: str) -> dict[str, dict]:
    """``{name: {"size", "etag"}}`` of the objects directly in the folder ``path`` that the
    listing gives an ETag for: one LIST request per 1,000 keys, none per object."""
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    found = {}
    for entry in entries:
        etag = entry.get("ETag") or entry.get("etag")
        if etag:
            found[posixpath.basename(entry["name"].rstrip("/"))] = {
                "size": int(entry.get("size") or 0), "etag": str(etag).strip('"')}
    return found


def _bucket_prefix(root: str) -> tuple[str, str]:
    bucket, _, prefix = root.partition("/")
    return bucket, prefix.rstrip("/") + "/" if prefix else ""


def incomplete_uploads(fs: Any, root: str) -> list[Upload]:
    """Multipart uploads started below ``root`` (``bucket/prefix``) and never completed nor
    aborted: one request per 1,000 of them."""
    bucket, prefix = _bucket_prefix(root)
    found, markers = [], {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers)
        for upload in page.get("Uploads", []) or []:
            initiated = upload.get("Initiated")
            found.append(Upload(upload["Key"][len(prefix):], upload["UploadId"],
                                initiated.timestamp() if initiated is not None else 0.0))
        if not page.get("IsTruncated"):
            return found
        markers = {"KeyMarker": page.get("NextKeyMarker", ""),
                   "UploadIdMarker": page.get("NextUploadIdMarker", "")}


def abort_upload(fs: Any, root: str, upload: Upload) -> None:
    bucket, prefix = _bucket_prefix(root)
    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=prefix + upload.path,
               UploadId=upload.upload_id)
