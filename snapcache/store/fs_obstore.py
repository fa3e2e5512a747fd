"""snapcache's light S3 client: obstore (the Rust ``object_store`` crate's Python bindings).

Starting s3fs costs a fresh process ~0.5 CPU s (importing aiobotocore and aiohttp, then a
botocore session parsing the S3 service model) before its first request; obstore starts in a
few milliseconds. :class:`~snapcache.store.fs.Storage` therefore sends its S3 requests through
an :class:`S3Client` whenever :func:`store_config` can express the user's storage options in
obstore's terms, and through s3fs otherwise (a profile, a botocore config, credentials only
botocore can find, ...), with the same requests and the same answers either way:

- a conditional create is a PUT with ``If-None-Match: *`` (obstore's ``mode="create"``), as
  s3fs's ``pipe_file(mode="create")``: exactly one of concurrent creators gets True;
- a missing object or bucket is a FileNotFoundError, refused credentials a PermissionError, an
  unreachable endpoint a ConnectionError; each message names the object, the cause and the
  way out;
- ``exists`` is a HEAD, then a one-key LIST for a folder (as s3fs), ``listdir`` one LIST per
  1,000 entries, a whole read one GET (ranged GETs in parallel above ``RANGE_BYTES``).

**Processes.** obstore's requests run on a Tokio runtime whose threads a forked child does not
have: a child that uses it hangs (and can break the parent's pooled connections). The
runtime's process is recorded at its first use; :func:`usable` is False in any other process,
where Storage falls back to s3fs (a DataLoader worker forked after its parent read the
manifest pays s3fs's start-up, as it did before obstore, less the import, which its parent makes
before forking it: :meth:`Storage.before_fork <snapcache.store.fs.Storage.before_fork>`); so does
a child of a process that had imported obstore (another library may have started the runtime). The runtime's threads are not
Python threads: nothing waits for them at exit.

Only :mod:`snapcache.store.fs` uses this module (the layering test checks that nothing else
imports obstore).
"""

from __future__ import annotations

import configparser
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Mapping

from snapcache.store import s3_errors, streamed

RANGE_BYTES = 64 << 20
"""A whole read of a file larger than this (size known) is ranged GETs of this size, in
parallel; a shard of the default size (64 MB) is one GET. (s3fs's is 32 MB: aiohttp reads one
response slower than obstore. Measured on the loopback server, a 98 MB image-like snapshot's
cold read took 0.36-0.42 s with one GET a shard against 0.61-0.65 s with 32 MB ranges; readers
download the next shard while the current one is consumed, which keeps a second connection
busy anyway. Not measured on AWS S3, where one connection may carry less than here.)"""

_IGNORED_OPTIONS = frozenset({"skip_instance_cache", "use_listings_cache",
                              "listings_expiry_time", "max_concurrency", "default_block_size",
                              "default_cache_type", "default_fill_cache", "cache_regions"})
"""s3fs options that change nothing about which requests go where (caching, block sizes)."""
_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})
_ENV_PROFILE = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")
_ENV_BOTOCORE_ONLY = ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_ROLE_ARN",
                      "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_USE_FIPS_ENDPOINT",
                      "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
"""Variables botocore acts on that this module does not translate: s3fs serves when set."""
_CONFIG_KEYS = ("endpoint_url", "s3", "ca_bundle", "services", "region", "use_fips_endpoint",
                "use_dualstack_endpoint")
"""Settings of an AWS config file's default profile that would change what botocore does
with the credentials given here: s3fs serves."""
_CA_BUNDLE = "snapcache_ca_bundle"
"""The key of :func:`store_config`'s result naming a PEM file of roots to trust (read by
:class:`S3Client`, not an obstore setting)."""
_OBSTORE_ENV = "SNAPCACHE_S3_CLIENT"
"""``s3fs`` forces s3fs for every S3 root (e.g. to compare the two); unset or ``auto``: obstore
where it can serve."""


def store_config(storage_options: Mapping[str, Any] | None,
                 environ: Mapping[str, str] | None = None) -> dict | None:
    """The ``S3Store`` configuration that reaches what s3fs would reach with these storage
    options and environment, or None if obstore cannot be told the same (s3fs serves).

    Expressible: ``key``/``secret``/``token``, ``anon``, ``endpoint_url`` (also in
    ``client_kwargs``), ``client_kwargs.region_name``, options that only tune s3fs's caches;
    credentials, region and endpoint from the ``AWS_*`` variables. Not: a profile, botocore
    config, other ``client_kwargs``, credentials or settings only botocore can find (shared
    credentials and config files, instance metadata, SSO), settings in the AWS config file,
    no region anywhere (botocore follows the bucket's region; object_store does not)."""
    environ = os.environ if environ is None else environ
    options = dict(storage_options or {})
    if environ.get(_OBSTORE_ENV, "auto") == "s3fs":
        return None
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    if set(client_kwargs) - _CLIENT_KWARGS:
        return None
    endpoint = options.pop("endpoint_url", None) or client_kwargs.get("endpoint_url")
    key, secret = options.pop("key", None), options.pop("secret", None)
    token, anon = options.pop("token", None), bool(options.pop("anon", False))
    if set(options) - _IGNORED_OPTIONS:
        return None
    if any(environ.get(name) for name in _ENV_PROFILE + _ENV_BOTOCORE_ONLY):
        return None
    config: dict[str, Any] = {}
    if anon:
        config["skip_signature"] = True
    elif key or secret:
        if not (key and secret):
            return None  # botocore would look for the other half elsewhere
        config.update(access_key_id=key, secret_access_key=secret)
        if token:
            config["session_token"] = token
    elif environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
        config.update(access_key_id=environ["AWS_ACCESS_KEY_ID"],
                      secret_access_key=environ["AWS_SECRET_ACCESS_KEY"])
        if environ.get("AWS_SESSION_TOKEN"):
            config["session_token"] = environ["AWS_SESSION_TOKEN"]
    else:
        return None  # botocore's other providers (files, SSO, instance metadata)
    endpoint = endpoint or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    region = client_kwargs.get("region_name") or environ.get("AWS_DEFAULT_REGION")
    if _config_file_matters(environ, region_given=bool(region)):
        return None
    if not region:
        if not endpoint:
            return None  # botocore follows the bucket's region; object_store would not
        region = "us-east-1"  # botocore's default for a custom endpoint
    config["region"] = region
    if endpoint:
        # both keys: the variables obstore reads itself must not override the options
        config["endpoint"] = config["aws_endpoint_url_s3"] = endpoint
    if environ.get("AWS_CA_BUNDLE") and not str(endpoint).startswith("http://"):
        config[_CA_BUNDLE] = environ["AWS_CA_BUNDLE"]  # trusted beside the system's roots
    return config


def _config_file_matters(environ: Mapping[str, str], region_given: bool) -> bool:
    """Whether the default profile of the AWS config file holds a setting botocore would act
    on here (an endpoint, S3 settings, a CA bundle, a region when none is given otherwise).
    Credentials files do not matter: the credentials used here come first in botocore's
    chain."""
    home = environ.get("HOME") or os.path.expanduser("~")
    path = environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config")
    if not os.path.exists(path):
        return False
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except (configparser.Error, OSError, UnicodeDecodeError):
        return True
    if not parser.has_section("default"):
        return False
    keys = [k for k in parser["default"] if k.startswith(_CONFIG_KEYS)]
    return any(k != "region" or not region_given for k in keys)


_RUNTIME_PID: int | None = None
_PID_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _PID_LOCK, _RUNTIME_PID
    _PID_LOCK = threading.Lock()  # the parent's may have been held by a thread not copied
    if "obstore" in sys.modules and _RUNTIME_PID is None:
        _RUNTIME_PID = -1  # another user of obstore in the parent may have started its runtime


os.register_at_fork(after_in_child=_after_fork_in_child)


def usable() -> bool:
    """Whether this process may use obstore: it has, or nobody before a fork of it did."""
    global _RUNTIME_PID
    with _PID_LOCK:
        if _RUNTIME_PID is None:
            _RUNTIME_PID = os.getpid()
        return _RUNTIME_PID == os.getpid()


def used_here() -> bool:
    """Whether obstore's runtime is this process's (for tests)."""
    return _RUNTIME_PID == os.getpid()


class S3Client:
    """Requests to one bucket through obstore. Paths are ``bucket/key`` as s3fs writes them;
    the methods raise FileNotFoundError, PermissionError, FileExistsError or ConnectionError
    (:func:`_translated`)."""

    retries_creates = False
    """object_store never sends a conditional PUT twice: its "exists" answers this request
    (see :func:`snapcache.store.fs_s3.create_exclusive`)."""

    def __init__(self, bucket: str, config: dict):
        import obstore
        from obstore.store import S3Store

        config = dict(config)
        endpoint = str(config.get("endpoint") or "")
        self.bucket = bucket
        self.endpoint = endpoint
        self._obstore = obstore
        client: dict[str, Any] = {"allow_http": endpoint.startswith("http://"),
                                  "connect_timeout": timedelta(seconds=60),
                                  "read_timeout": timedelta(seconds=60),
                                  "timeout": timedelta(minutes=30)}
        ca_bundle = config.pop(_CA_BUNDLE, None)
        if ca_bundle:
            with open(ca_bundle, "rb") as f:
                client["root_certificate"] = f.read()
        self._store = S3Store(
            bucket, config=config, client_options=client,
            retry_config={"max_retries": 4, "retry_timeout": timedelta(seconds=60),
                          "backoff": {"init_backoff": timedelta(milliseconds=100),
                                      "max_backoff": timedelta(seconds=15), "base": 2}})

    def _key(self, path: str) -> str:
        bucket, _, key = path.strip("/").partition("/")
        if bucket != self.bucket:
            raise ValueError(f"s3://{path} is not in bucket {self.bucket}")
        return key

    def _call(self, what: str, path: str, fn, *args, **kwargs):
        try:
            return fn(self._store, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - obstore's errors, translated
            raise _translated(e, what, f"s3://{path.strip('/')}", self.endpoint) from e

    # -- queries ---------------------------------------------------------------------------------
    def head(self, path: str) -> dict | None:
        """The object's metadata (``size``, ``e_tag``, ``last_modified``), None if missing."""
        try:
            return self._call("HEAD", path, self._obstore.head, self._key(path))
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        """A file, or a folder with something in it (one HEAD, then one LIST)."""
        key = self._key(path)
        if not key:
            return self.bucket_exists()
        try:
            return self.head(path) is not None or bool(self._first_page(path, key))
        except FileNotFoundError:  # no bucket
            return False

    def _first_page(self, path: str, key: str) -> list:
        stream = self._call("LIST", path, self._obstore.list, key, chunk_size=1)
        try:
            return next(iter(stream), [])
        except Exception as e:  # noqa: BLE001
            raise _translated(e, "LIST", f"s3://{path.strip('/')}", self.endpoint) from e

    def bucket_exists(self) -> bool:
        try:
            self._first_page(self.bucket, "")
        except FileNotFoundError:
            return False
        return True

    def list_names(self, path: str) -> list[str]:
        """Full paths (``bucket/key``) of the entries directly inside ``path``: one LIST per
        1,000 entries."""
        key = self._key(path).rstrip("/")
        found = self._call("LIST", path, self._obstore.list_with_delimiter, key or None)
        return [f"{self.bucket}/{name}" for name in found["common_prefixes"]] + \
            [f"{self.bucket}/{o['path']}" for o in found["objects"]]

    def find(self, path: str) -> list[dict]:
        """Every object below the folder ``path`` (recursively): ``path`` (``bucket/key``),
        ``size``, ``last_modified``; one LIST per 1,000."""
        key = self._key(path).rstrip("/")
        out = []
        try:
            for chunk in self._obstore.list(self._store, key or None, chunk_size=1000):
                out.extend({"path": f"{self.bucket}/{o['path']}", "size": o["size"],
                            "last_modified": o["last_modified"]} for o in chunk)
        except Exception as e:  # noqa: BLE001
            raise _translated(e, "LIST", f"s3://{path.strip('/')}", self.endpoint) from e
        return out

    # -- reads -------------------------------------------------------------------------------
    def read(self, path: str, size: int | None = None) -> "bytes | memoryview":
        """The whole object: one GET, or ranged GETs of about :data:`RANGE_BYTES` in parallel
        when its ``size`` is known and at least 1.5 times that. With ``size`` given (a shard)
        a read-only view of obstore's buffer (no copy of the shard), else bytes."""
        parts = 1 if size is None else max(1, round(size / RANGE_BYTES))
        if parts == 1:
            body = self._body(self._get(path), path)
            return body.to_bytes() if size is None else memoryview(body)
        step = -(-size // parts)
        starts = list(range(0, size, step))
        with ThreadPoolExecutor(len(starts)) as pool:
            pieces = list(pool.map(lambda s: self.read_range(path, s, min(size, s + step)),
                                   starts))
        if sum(len(p) for p in pieces) != size:  # shorter than said: what is there, whole
            return self.read_versioned(path)[0]
        return b"".join(pieces)

    def _get(self, path: str) -> Any:
        return self._call("GET", path, self._obstore.get, self._key(path))

    def _body(self, result: Any, path: str) -> Any:
        """The response's body (obstore's Bytes), read whole."""
        try:
            return result.bytes()
        except Exception as e:  # noqa: BLE001 - the body failed half-way
            raise _translated(e, "GET", f"s3://{path.strip('/')}", self.endpoint) from e

    def read_streaming(self, path: str, into: streamed.Streamed) -> streamed.Body:
        """The whole object, one GET, its body taken into ``into`` as it streams in (other
        threads may read it meanwhile: :meth:`Streamed.wait_for
        <snapcache.store.streamed.Streamed.wait_for>`)."""
        result = self._get(path)
        try:
            for chunk in result.stream(min_chunk_size=streamed.STREAM_CHUNK):
                into.add(chunk)
        except Exception as e:  # noqa: BLE001 - the body failed half-way
            raise _translated(e, "GET", f"s3://{path.strip('/')}", self.endpoint) from e
        return into.result()

    def read_versioned(self, path: str) -> tuple[bytes, tuple]:
        """The whole object and (ETag, size) from one GET."""
        result = self._get(path)
        data = self._body(result, path).to_bytes()
        meta = result.meta
        return data, (str(meta["e_tag"]), int(meta["size"]))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer if the object is shorter): one ranged GET."""
        if end <= start:
            return b""
        head = None
        try:
            return self._call("GET", path, self._obstore.get_range, self._key(path),
                              start=start, end=end).to_bytes()
        except OSError as e:
            if isinstance(e, (FileNotFoundError, PermissionError, ConnectionError)):
                raise
            head = self.head(path)  # obstore refuses a range past the end; s3fs shortens it
            if head is None:
                raise FileNotFoundError(f"s3://{path.strip('/')}") from e
        if start >= head["size"]:
            return b""
        return self.read_range(path, start, min(end, head["size"]))

    # -- writes ------------------------------------------------------------------------------
    def put(self, path: str, data: bytes) -> None:
        """One PUT (replacing what is there)."""
        self._call("PUT", path, self._obstore.put, self._key(path), data, use_multipart=False)

    def create(self, path: str, data: bytes) -> bool:
        """One conditional PUT (``If-None-Match: *``): True if it created ``path``, False if
        something was there."""
        try:
            self._call("PUT", path, self._obstore.put, self._key(path), data, mode="create")
            return True
        except FileExistsError:
            return False

    def upload(self, path: str, data: bytes | str, part_bytes: int, concurrency: int) -> None:
        """``data`` (bytes, or a local file's name): one PUT below ``2 * part_bytes``, else a
        multipart upload of ``part_bytes`` parts, ``concurrency`` at a time."""
        import pathlib

        size = len(data) if isinstance(data, bytes) else os.path.getsize(data)
        body: Any = data if isinstance(data, bytes) else pathlib.Path(data)
        self._call("PUT", path, self._obstore.put, self._key(path), body,
                   use_multipart=size >= 2 * part_bytes, chunk_size=part_bytes,
                   max_concurrency=concurrency)

    def remove(self, path: str, recursive: bool) -> None:
        """Delete the object ``path`` (missing: no error) with one DELETE; ``recursive``:
        with everything below it (a LIST, then one bulk POST per 1,000 objects)."""
        keys = [self._key(path)]
        if recursive:
            keys += [self._key(o["path"]) for o in self.find(path)]
        if len(keys) == 1:
            self._call("DELETE", path, self._obstore.delete, keys[0])
            return
        for start in range(0, len(keys), 1000):
            self._call("DELETE", path, self._obstore.delete, keys[start:start + 1000])


def _translated(error: Exception, what: str, url: str, endpoint: str) -> Exception:
    """obstore's error as the builtin one s3fs would raise (:func:`s3_errors.error
    <snapcache.store.s3_errors.error>`)."""
    import obstore.exceptions as ox

    text = str(error)
    if "NoSuchBucket" in text:  # (a listing's 404 is a GenericError)
        kind = s3_errors.NO_BUCKET
    elif isinstance(error, (FileNotFoundError, ox.NotFoundError)) or "404 Not Found" in text:
        kind = s3_errors.MISSING
    elif isinstance(error, (FileExistsError, ox.AlreadyExistsError)):
        kind = s3_errors.EXISTS
    elif isinstance(error, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or \
            "403 Forbidden" in text:
        kind = s3_errors.REFUSED
    elif isinstance(error, OSError):
        return error
    elif "error sending request" in text or "connect" in text.lower() or "dns" in text.lower():
        kind = s3_errors.UNREACHABLE
    else:
        kind = s3_errors.FAILED
    return s3_errors.error(kind, what, url, endpoint, s3_errors.cause_of(error))
