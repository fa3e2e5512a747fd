"""What snapcache asks of S3, and which client asks it: obstore where it can, else s3fs.

:class:`S3Clients` is what a :class:`~snapcache.store.fs.Storage` rooted on ``s3://`` holds: it
picks, per process, :class:`snapcache.store.fs_obstore.S3Client` (starts in milliseconds) when
the storage options can be said in obstore's terms, else :class:`S3fsClient` (s3fs, with what
fsspec offers beyond requests: file objects, renames); s3fs is imported only when it serves.
Both clients have the same methods, requests and errors. Only :mod:`snapcache.store.fs` calls
this module; with :mod:`~snapcache.store.fs_obstore` the three are the only modules that talk to
fsspec or obstore. Each function says how many requests it makes, because on S3 requests are
what a snapshot's phases cost:

- :func:`list_names`: one LIST of a folder (s3fs's ``ls`` lists the parent too when it is empty);
- :func:`read_whole`: one GET, or concurrent ranged GETs for a large file of known size;
- :func:`create_exclusive`: a conditional PUT (``If-None-Match: *``), the primitive of leases
  and commits, whose outcome is settled when its answer is lost (a GET, then);
- :func:`upload`: one PUT, or a multipart upload whose parts go up in parallel;
- :func:`listed_identities`: the size and ETag of a folder's objects, one LIST per 1,000;
- :func:`incomplete_uploads` / :func:`abort_upload`: multipart uploads nobody completed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import posixpath
import sys
import threading
from typing import Any, Callable, NamedTuple

from snapcache.store import fs_obstore, s3_errors, streamed

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


_SESSION: tuple[int, Any] | None = None
"""(pid, aiobotocore session) prepared by :func:`warm_session` for the children of that process."""
_PROFILE_OPTIONS = ("session", "profile", "profile_name")


def warm_session() -> None:
    """Prepare, in a process about to fork children that will use s3fs (DataLoader workers:
    obstore's runtime does not survive the fork), the botocore session each would otherwise
    build on its first request: the S3 service model and endpoint rules parsed once here
    (~0.15 CPU s a child). A child uses it for storage options that name no profile or session
    of their own (:func:`inherited_session`)."""
    global _SESSION
    if _SESSION is not None and _SESSION[0] == os.getpid():
        return
    from aiobotocore.session import AioSession

    session = AioSession()
    loader = session.get_component("data_loader")
    for kind in ("service-2", "endpoint-rule-set-1"):
        loader.load_service_model("s3", kind)
    _SESSION = (os.getpid(), session)


def inherited_session(storage_options: dict) -> Any | None:
    """The session a parent process prepared for its children (:func:`warm_session`), in such a
    child, for ``storage_options`` that do not choose one; else None."""
    if _SESSION is None or _SESSION[0] == os.getpid() or \
            any(name in storage_options for name in _PROFILE_OPTIONS):
        return None
    return _SESSION[1]


def is_s3_url(url: str) -> bool:
    return url.startswith(("s3://", "s3a://"))


class S3Clients:
    """The S3 clients of one root (shared by its :meth:`Storage.child` folders): the obstore
    client if :func:`snapcache.store.fs_obstore.store_config` can express the options and
    this process may use it, else the s3fs one, created on first use."""

    def __init__(self, url: str, storage_options: dict,
                 make_fs: Callable[[str, dict], tuple[Any, str]]):
        self.url, self.storage_options, self._make_fs = url, storage_options, make_fs
        self.root = url.split("://", 1)[1].rstrip("/")
        self.bucket = self.root.split("/")[0]
        self._config = fs_obstore.store_config(storage_options) if _has_obstore() else None
        self._obstore: fs_obstore.S3Client | None = None
        self._s3fs: S3fsClient | None = None
        self._fs: Any = None
        self._lock, self._pid = threading.Lock(), os.getpid()
        if self._config is None:
            self.fs  # noqa: B018 - s3fs serves: its ImportError (with the hint) now, as before

    def __reduce__(self) -> tuple:
        """Pickled as what made it (a Ray task's Storage): the process that unpickles it
        picks its own client, as a new Storage there would."""
        return (S3Clients, (self.url, self.storage_options, self._make_fs))

    @property
    def fs(self) -> Any:
        """The s3fs filesystem (imported and created on first use)."""
        with self._locked():
            if self._fs is None:
                options = self.storage_options
                session = inherited_session(options)
                if session is not None:  # parsed by the parent that forked us
                    options = {**options, "session": session}
                self._fs = self._make_fs(self.url, options)[0]
            return self._fs

    def client(self) -> "fs_obstore.S3Client | S3fsClient":
        """The client this process uses for this root's requests."""
        if self._config is not None and fs_obstore.usable():
            if self._obstore is None:
                with self._locked():
                    if self._obstore is None:
                        self._obstore = fs_obstore.S3Client(self.bucket, self._config)
            return self._obstore
        return self.s3fs()

    def before_fork(self) -> None:
        """A forked child cannot use this process's obstore runtime and falls back to s3fs:
        import it and prepare its session here once, for every child to inherit."""
        if self._config is not None and fs_obstore.usable():
            import_s3fs(self.url)
            warm_session()

    def _locked(self) -> threading.Lock:
        """This process's lock (a forked child gets a new one: its parent's may have been held
        by a thread that the child does not have)."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def s3fs(self) -> "S3fsClient":
        """The s3fs client (for what only it does: multipart upload listings)."""
        if self._s3fs is None:
            self._s3fs = S3fsClient(self.fs)
        return self._s3fs


def _has_obstore() -> bool:
    import importlib.util

    return importlib.util.find_spec("obstore") is not None


def _request(what: str) -> Callable:
    """Decorate an :class:`S3fsClient` method whose first argument is the object's path: its
    failures become :mod:`~snapcache.store.s3_errors`' (:meth:`S3fsClient.translated`)."""
    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: "S3fsClient", path: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, path, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - s3fs's and botocore's errors, translated
                translated = self.translated(e, what, path)
                if translated is e:
                    raise
                raise translated from e
        return call
    return decorate


class S3fsClient:
    """:class:`snapcache.store.fs_obstore.S3Client`'s requests through s3fs (whose caches are
    dropped before each query: another process may have changed the object), with the same
    errors (:meth:`translated`)."""

    retries_creates = True
    """botocore sends a request again when its answer is lost, a conditional PUT too: its
    "exists" may answer this client's own first attempt (see :func:`create_exclusive`)."""

    def __init__(self, fs: Any):
        self.fs = fs

    def _fresh(self, path: str) -> str:
        self.fs.invalidate_cache(path)
        return path

    @_request("HEAD")
    def head(self, path: str) -> dict | None:
        """One HEAD (s3fs's ``info`` would LIST too, for a folder, when the object is
        missing)."""
        bucket, key, _ = self.fs.split_path(path)
        try:
            out = self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        return {"size": int(out["ContentLength"]), "last_modified": out.get("LastModified"),
                "e_tag": out.get("ETag")}

    @_request("HEAD")
    def exists(self, path: str) -> bool:
        return self.fs.exists(self._fresh(path))

    @_request("LIST")
    def list_names(self, path: str) -> list[str]:
        return list_names(self.fs, path)

    @_request("LIST")
    def find(self, path: str) -> list[dict]:
        found = self.fs.find(path.rstrip("/"), detail=True, withdirs=False)
        return [{"path": name.rstrip("/"), "size": int(info.get("size") or 0),
                 "last_modified": info.get("LastModified") or info.get("mtime")}
                for name, info in found.items() if info.get("type") != "directory"]

    @_request("GET")
    def read(self, path: str, size: int | None = None) -> bytes:
        return read_whole(self.fs, path, size)

    @_request("GET")
    def read_versioned(self, path: str) -> tuple[bytes, tuple]:
        return read_versioned(self.fs, path)

    @_request("GET")
    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self.fs.cat_file(path, start=start, end=end)

    @_request("GET")
    def read_streaming(self, path: str, into: streamed.Streamed) -> streamed.Body:
        """As :meth:`snapcache.store.fs_obstore.S3Client.read_streaming`."""
        async def take(body: Any) -> None:
            while chunk := await body.read(streamed.STREAM_CHUNK):
                into.add(chunk)

        _get_object(self.fs, path, take)
        return into.result()

    @_request("PUT")
    def put(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    @_request("PUT")
    def create(self, path: str, data: bytes) -> bool:
        """One conditional PUT (``If-None-Match: *``), sent again by botocore if its answer is
        lost: True if it created ``path``, False if something was there."""
        try:
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if _error_code(e) == "PreconditionFailed":  # a 412 s3fs did not map
                return False
            raise

    @_request("PUT")
    def upload(self, path: str, data: bytes | str, part_bytes: int, concurrency: int) -> None:
        if isinstance(data, str):
            self.fs.put_file(data, path, chunksize=part_bytes, max_concurrency=concurrency)
        else:
            self.fs.pipe_file(path, data, chunksize=part_bytes, max_concurrency=concurrency)

    @_request("DELETE")
    def remove(self, path: str, recursive: bool) -> None:
        try:
            self.fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    @_request("LIST")
    def incomplete_uploads(self, root: str) -> list[Upload]:
        """:func:`incomplete_uploads` below ``root`` (``bucket/prefix``)."""
        return incomplete_uploads(self.fs, root)

    @_request("DELETE")
    def abort_upload(self, root: str, upload: Upload) -> None:
        """:func:`abort_upload`; an upload already gone (completed or aborted meanwhile) is
        not an error."""
        try:
            abort_upload(self.fs, root, upload)
        except FileNotFoundError:  # NoSuchUpload
            pass

    def translated(self, error: Exception, what: str, path: str) -> Exception:
        """s3fs's or botocore's ``error`` as :mod:`~snapcache.store.s3_errors` words it for
        both clients; ``error`` itself if it is not a storage failure."""
        import botocore.exceptions as bx

        code = _error_code(error)
        if isinstance(error, FileExistsError):
            kind = s3_errors.EXISTS
        elif isinstance(error, (PermissionError, bx.NoCredentialsError)):
            kind = s3_errors.REFUSED
        elif code == "NoSuchBucket":
            kind = s3_errors.NO_BUCKET
        elif isinstance(error, FileNotFoundError):
            kind = s3_errors.MISSING
        elif isinstance(error, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError,
                                ConnectionError, TimeoutError)) or \
                type(error).__module__.split(".")[0] in _TRANSPORT_MODULES:
            kind = s3_errors.UNREACHABLE
        elif isinstance(error, (OSError, bx.BotoCoreError)):
            kind = s3_errors.FAILED
        else:
            return error
        return s3_errors.error(kind, what, f"s3://{path.strip('/')}", self.endpoint(),
                               s3_errors.cause_of(error))

    def endpoint(self) -> str:
        """The endpoint requests go to ("" for AWS's own)."""
        client = getattr(self.fs, "_s3", None)
        url = getattr(getattr(client, "meta", None), "endpoint_url", None) or \
            self.fs.endpoint_url or (self.fs.client_kwargs or {}).get("endpoint_url")
        return "" if not url or url.endswith(".amazonaws.com") else str(url)


_TRANSPORT_MODULES = ("aiohttp", "urllib3", "http")
"""Libraries under botocore whose errors s3fs may pass on: connections that failed."""


def _error_code(error: BaseException) -> str | None:
    """The S3 error code (``"NoSuchBucket"``, ``"PreconditionFailed"``) of the botocore error
    behind an s3fs error, if any."""
    for e in (error, error.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return (response.get("Error") or {}).get("Code")
    return None


def list_names(fs: Any, path: str) -> list[str]:
    """Full paths of the entries directly inside ``path``: one LIST request, never cached.
    FileNotFoundError if there is nothing there."""
    return [e["name"] for e in _run(fs, fs._lsdir(path.rstrip("/"), refresh=True))]


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
    async def take(body: Any) -> bytes:
        return await body.read()

    data, response = _get_object(fs, path, take)
    return data, (str(response["ETag"]), int(response["ContentLength"]))


def _get_object(fs: Any, path: str, take: Callable[[Any], Any]) -> tuple[Any, dict]:
    """One GET of ``path``: what the coroutine ``take`` makes of its body (closed after it,
    whatever happened) and the response's headers. FileNotFoundError if it is missing."""
    bucket, key, _ = fs.split_path(path)

    async def get() -> tuple[Any, dict]:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        try:
            return await take(response["Body"]), response
        finally:
            response["Body"].close()

    return _run(fs, get())


def _run(fs: Any, coroutine: Any) -> Any:
    """What ``coroutine`` returns (or raises), run on the event loop of the s3fs filesystem
    ``fs`` (fsspec's I/O thread; never called from it). The wait can be interrupted (SIGINT):
    the request then ends on the loop without anyone waiting for it."""
    return asyncio.run_coroutine_threadsafe(coroutine, fs.loop).result()


CREATE_ATTEMPTS = 3
"""Conditional PUTs :func:`create_exclusive` sends at most, when answers are lost."""


def create_exclusive(client: Any, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists, with ``client`` (either kind): a
    conditional PUT (``If-None-Match: *``). True if this call created it.

    The PUT may reach S3 and its answer be lost (a connection reset, a timeout): the object
    is then created but the client hears an error, or, if the client sent the request again
    (botocore does; obstore does not), "exists" (412). Either way the object is read back
    (one GET): holding exactly ``data`` it is this call's (a lease, stream marker or manifest
    holds its writer's run id, so another writer's bytes differ), holding anything else
    another writer's; absent, nothing was created and the PUT is sent again (if the first one
    lands late, the second finds it and the GET says whose it is). Raised: a FileNotFoundError
    (no bucket), a PermissionError, the GET's error, or the last attempt's when every attempt
    failed and nothing was there after each (a ConnectionError from either: a request may
    still land, whether the object gets created is unknown)."""
    lost: OSError | None = None
    for _ in range(CREATE_ATTEMPTS):
        try:
            if client.create(path, data):
                return True
            if lost is None and not client.retries_creates:
                return False  # a 412 to the one request sent: another writer's
        except (FileNotFoundError, PermissionError):
            raise
        except OSError as e:  # no answer: the object may have been created
            lost = e
        try:
            return bytes(client.read(path)) == data
        except FileNotFoundError:
            continue  # nothing was created: send it again
    if lost is None:  # created and removed again by others, each time: not ours
        return False
    raise lost


def upload(client: Any, path: str, data: bytes | str) -> None:
    """Store ``data`` (bytes, or the name of a local file holding them) at ``path`` with
    ``client`` (either kind): one PUT below ``2 * PART_BYTES``, else a multipart upload of
    :data:`PART_BYTES` parts, :data:`PART_CONCURRENCY` at a time (aborted if a part fails: no
    parts left billed)."""
    client.upload(path, data, PART_BYTES, PART_CONCURRENCY)


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
