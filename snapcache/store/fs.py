"""The module that talks to storage (with :mod:`snapcache.store.fs_s3`, its S3-specific part).

Everything else in snapcache addresses storage through :class:`Storage`, a thin wrapper around an
fsspec filesystem rooted at a URL (a local path, ``memory://...``, ...), or on ``s3://`` around
an S3 client (:class:`snapcache.store.fs_s3.S3Clients`: obstore where it can serve, else
s3fs). Paths handed to its methods are relative to that root and always use ``/``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import posixpath
import re
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import fsspec
import xxhash
from fsspec.core import url_to_fs

from snapcache.store import checks, fs_s3, layout
from snapcache.store.background_write import BackgroundFile
from snapcache.store.local_files import (create, flush_to_disk, fsync_dir, open_binary,
                                         silent_remove)
from snapcache.store.fs_s3 import S3Clients, Upload

if TYPE_CHECKING:
    import mmap

    import pyarrow as pa

    from snapcache.store.streamed import Streamed

_INSTALL_HINTS = {
    "s3": "s3fs (pip install 'snapcache[s3]')",
    "s3a": "s3fs (pip install 'snapcache[s3]')",
    "gs": "gcsfs (pip install gcsfs)",
    "gcs": "gcsfs (pip install gcsfs)",
    "az": "adlfs (pip install adlfs)",
    "abfs": "adlfs (pip install adlfs)",
}


def _filesystem(url: str, storage_options: dict | None) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        fs_s3.import_s3fs(url)
        return url_to_fs(url, **(storage_options or {}))
    except ImportError as e:  # fsspec knows the protocol but its backend is missing
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        hint = _INSTALL_HINTS.get(protocol, "the fsspec backend for it")
        raise ImportError(f"snapcache needs {hint} to access {protocol}:// URLs ({url!r})") from e


_ONE_SLASH = re.compile(r"^([a-z][a-z0-9+.-]*):/(?!/)")


def check_url(url: str | os.PathLike) -> None:
    """ValueError for a path that is a URL with a slash missing (``s3:/bucket/snaps``): taken
    as a local path it would silently make a folder named ``s3:`` in the working directory."""
    text = os.fspath(url)
    found = _ONE_SLASH.match(text)
    if found is None or (os.name == "nt" and len(found.group(1)) == 1):  # C:/ is a drive
        return
    scheme = found.group(1)
    raise ValueError(f"{text!r} looks like a URL with a slash missing: write "
                     f"'{scheme}://{text[found.end():]}' ({text!r} would be a local folder "
                     f"named '{scheme}:' in the working directory)")


_CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "obstore")


def is_storage_error(error: BaseException) -> bool:
    """Whether ``error`` is a failure of the storage (a full disk, a refused or lost request):
    an OSError, as every client's errors are translated to, or an error of an S3 client's
    libraries that no translation caught (told by its module: botocore is not imported
    here)."""
    return isinstance(error, OSError) or \
        type(error).__module__.split(".")[0] in _CLIENT_MODULES


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return _protocol(fs) in ("file", "local")


_MEMORY_LOCK = threading.Lock()
_PARSED: "collections.OrderedDict[tuple[str, str], tuple[tuple, Any]]" = \
    collections.OrderedDict()
_PARSED_LOCK = threading.Lock()
PARSED_ENTRIES = 256
"""Parsed files (manifests) kept per process by :meth:`Storage.read_parsed`."""


def normalized_url(url: str | os.PathLike) -> str:
    """``url`` as a :class:`Storage` names its folder: a URL as written, a local path made
    absolute, without a trailing slash."""
    url = os.fspath(url)
    if "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/")


class FileStat(NamedTuple):
    """One file found by :meth:`Storage.walk`."""

    path: str             # relative to the folder walked, ``/``-separated
    size: int
    mtime: float | None   # seconds since the epoch, if the filesystem reports it


class Storage:
    """A folder on some filesystem, addressed by relative ``/``-separated paths."""

    def __init__(self, url: str | os.PathLike, storage_options: dict | None = None):
        check_url(url)
        self.url = normalized_url(url)
        self.storage_options = dict(storage_options or {})
        self._s3: S3Clients | None = None
        if fs_s3.is_s3_url(self.url):  # requests through obstore or s3fs (created lazily)
            self._s3 = S3Clients(self.url, self.storage_options, _filesystem)
            self._fs: fsspec.AbstractFileSystem | None = None
            root, self.local, self.protocol = self._s3.root, False, "s3"
        else:
            self._fs, root = _filesystem(self.url, self.storage_options)
            self.local = is_local(self._fs)
            self.protocol = _protocol(self._fs)
        self.root = root.rstrip("/") or "/"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem (on S3: s3fs, imported on first use)."""
        return self._fs if self._s3 is None else self._s3.fs

    def before_fork(self) -> None:
        """Get ready for children about to be forked to use this storage (a DataLoader's
        workers): on S3 through obstore, import s3fs here, which a forked child uses instead
        (see :mod:`snapcache.store.fs_obstore`), and parse its S3 service model, so that each
        child inherits them rather than paying for them (~0.5 CPU s a process)."""
        if self._s3 is not None:
            self._s3.before_fork()

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    # -- paths ---------------------------------------------------------------------------------
    def full(self, rel: str) -> str:
        return posixpath.join(self.root, rel) if rel else self.root

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def child(self, rel: str) -> "Storage":
        """A Storage rooted at a sub-folder, sharing this one's filesystem instance."""
        sub = Storage.__new__(Storage)
        sub.url, sub.storage_options = self.url_of(rel), self.storage_options
        sub._fs, sub._s3, sub.root, sub.local = self._fs, self._s3, self.full(rel), self.local
        sub.protocol = self.protocol
        return sub

    # -- queries -------------------------------------------------------------------------------
    def _fresh(self, path: str) -> str:
        """Drop what the filesystem cached about ``path``: another process may have changed it
        (fsspec filesystems keep directory listings, and answer ``info``/``exists`` from
        them)."""
        if not self.local:
            self.fs.invalidate_cache(path)
        return path

    def exists(self, rel: str = "") -> bool:
        if self._s3:
            return self._s3.client().exists(self.full(rel))
        return self.fs.exists(self._fresh(self.full(rel)))

    def is_file(self, rel: str) -> bool:
        """Whether the file ``rel`` exists (on S3 one HEAD; ``exists`` also asks whether a
        folder of that name has files, a LIST more)."""
        if self.local:
            return os.path.isfile(self.full(rel))
        if self._s3:
            return self._s3.client().head(self.full(rel)) is not None
        return self.fs.isfile(self._fresh(self.full(rel)))

    def bucket_exists(self) -> bool:
        """Whether the bucket holding this root exists (an object store's first path
        component; for local storage, whether the root itself exists). A prefix with no
        objects under it does not "exist" on an object store, yet is a valid empty root."""
        if self.local:
            return self.exists()
        bucket = self.root.strip("/").split("/")[0]
        if self._s3:
            return self._s3.client().exists(bucket)
        return not bucket or self.fs.exists(self._fresh(bucket))

    def size(self, rel: str) -> int:
        if self._s3:
            head = self._s3.client().head(self.full(rel))
            if head is None:
                raise FileNotFoundError(self.url_of(rel))
            return int(head["size"])
        return int(self.fs.size(self._fresh(self.full(rel))))

    def listdir(self, rel: str = "") -> list[str]:
        """Names (not paths) directly inside ``rel``; empty if it does not exist. One LIST
        request on S3 (s3fs's ``ls`` lists the parent too when a folder is empty)."""
        path = self.full(rel)
        try:
            if self._s3:
                entries = self._s3.client().list_names(path)
            else:
                entries = self.fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        prefix = path.rstrip("/") + "/"
        names = []
        for entry in entries:
            entry = entry.rstrip("/")
            name = entry[len(prefix):] if entry.startswith(prefix) else posixpath.basename(entry)
            if name and "/" not in name:
                names.append(name)
        return sorted(set(names))

    # -- reads ---------------------------------------------------------------------------------
    def read_bytes(self, rel: str, size: int | None = None,
                   into: "Streamed | None" = None) -> bytes:
        """The whole file, in one request on object stores (s3fs would first ask for its size:
        a HEAD, and a LIST when it is missing): a file rewritten meanwhile (a lease's heartbeat)
        reads as either version, never as a failed partial read. With its ``size`` known (a
        shard, from the manifest), a large file is fetched as concurrent ranged GETs, and the
        result may be a read-only buffer of the bytes (obstore's, not copied) instead.

        ``into`` (a :class:`~snapcache.store.streamed.Streamed` of ``size`` bytes): on S3 the
        file comes in one GET whose body is taken into it as it streams in, so that other
        threads can read its first bytes meanwhile; elsewhere it is left empty."""
        if self.local:
            with open(self.full(rel), "rb") as f:
                return f.read()
        path = self.full(rel)
        if into is not None and self._s3:
            return self._s3.client().read_streaming(path, into)
        if not self._s3:
            return self.fs.cat_file(path)
        return self._s3.client().read(path, size)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file ``rel`` (one ranged GET on object stores);
        fewer when the file is shorter."""
        if self.local:
            fd = os.open(self.full(rel), os.O_RDONLY)
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)
        if self._s3:
            return self._s3.client().read_range(self.full(rel), start, end)
        return self.fs.cat_file(self.full(rel), start=start, end=end)

    def version(self, rel: str) -> tuple | None:
        """What changes whenever the file ``rel`` is replaced, or None if it is missing:
        (inode, size, mtime) on local disk, (ETag, size) on object stores (one HEAD)."""
        path = self.full(rel)
        if self.local:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return None
            return (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._s3:
            head = self._s3.client().head(path)
            return None if head is None or head["e_tag"] is None else \
                (str(head["e_tag"]), int(head["size"]))
        try:
            info = self.fs.info(self._fresh(path))
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or \
            info.get("mtime") or info.get("created")
        return (str(tag), info.get("size")) if tag is not None else None

    def read_parsed(self, rel: str, parse: Callable[[bytes], Any]) -> Any:
        """``parse(self.read_bytes(rel))``, reusing the value parsed before from the same
        bytes: on S3 a later read of an unchanged file (a manifest) is one HEAD (its ETag, the
        MD5 of its content), a new one one GET; locally the bytes are hashed, not parsed again.
        Inside :func:`snapcache.store.checks.shared_epoch` the processes of one epoch on this
        node check once between them. FileNotFoundError if missing. ``parse`` must return
        something immutable (values are shared)."""
        key = (self.protocol, self.full(rel))
        with _PARSED_LOCK:
            known = _PARSED.get(key)
        if self.local:
            data = self.read_bytes(rel)
            return _parsed(key, known, ("xxh3", xxhash.xxh3_128_digest(data)), data, parse)
        if checks.current() is not None:
            return checks.shared_parse(
                self.url_of(rel), known, parse,
                lambda version, value, data: _remember(key, version, value, data),
                lambda known: self._check_parsed(rel, key, known, parse))
        return self._check_parsed(rel, key, known, parse)[0]

    def _check_parsed(self, rel: str, key: tuple, known: tuple | None,
                      parse: Callable[[bytes], Any]) -> tuple[Any, tuple | None, bytes]:
        """(value, version, bytes) of the remote ``rel`` given what is ``known`` of it (version,
        value or None, bytes): a HEAD if known, a GET when new or changed."""
        if known is not None:
            version = self.version(rel)
            if version is None:
                with _PARSED_LOCK:
                    _PARSED.pop(key, None)
                raise FileNotFoundError(self.url_of(rel))
            if known[0] == version:
                return _parsed(key, known, version, known[2], parse), version, known[2]
        if self._s3:
            data, version = self._s3.client().read_versioned(self.full(rel))
            version = self._content_version(rel, data, version)
        else:
            data = self.read_bytes(rel)
            version = self._content_version(rel, data)
        return _parsed(key, known, version, data, parse), version, data

    def _content_version(self, rel: str, data: bytes, version: tuple | None = None
                         ) -> tuple | None:
        """The object's version (asked for if not given) if its ETag is the MD5 of ``data`` (a
        single-PUT object that has not changed since ``data`` was read), else None (not worth
        keeping)."""
        version = version or self.version(rel)
        if version is None or str(version[0]).strip('"') != hashlib.md5(data).hexdigest():
            return None
        return version

    def map_file(self, rel: str, size: int | None = None
                 ) -> "tuple[pa.Buffer, mmap.mmap | None]":
        """A whole local file as an Arrow buffer over a read-only shared memory map, and the
        map (so callers can drop resident pages with ``madvise``); elsewhere the downloaded
        bytes and None."""
        import mmap

        import pyarrow as pa

        if not self.local:
            return pa.py_buffer(self.read_bytes(rel, size)), None
        with open(self.full(rel), "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return pa.py_buffer(b""), None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return pa.py_buffer(mapped), mapped

    # -- writes --------------------------------------------------------------------------------
    def makedirs(self, rel: str = "") -> None:
        if self._s3:
            return  # no folders on S3; s3fs would check the bucket exists (a HEAD) every time
        self.fs.makedirs(self.full(rel), exist_ok=True)

    def open_output(self, rel: str, background: bool = False) -> Any:
        """A new local file to write into (its folder made if missing; local disk only: a
        remote file is stored whole by :meth:`upload`). ``background``: a
        :class:`~snapcache.store.background_write.BackgroundFile`, written out by a thread of
        its own at each ``flush``."""
        if not self.local:
            raise NotImplementedError(f"open_output on {self.url}: remote files are "
                                      f"uploaded whole")
        return create(self.full(rel), BackgroundFile if background else open_binary)

    def upload(self, rel: str, data: bytes | str) -> None:
        """Store a finished file whole on a remote filesystem: ``data`` is its bytes, or the
        name of a local file holding them. On S3 one PUT, or a multipart upload in parallel
        parts for a large file (:func:`snapcache.store.fs_s3.upload`)."""
        path = self.full(rel)
        if self._s3:
            fs_s3.upload(self._s3.client(), path, data)
        elif isinstance(data, str):
            self.fs.put_file(data, path)
        else:
            self.fs.pipe_file(path, data)

    def remove_if_empty(self) -> bool:
        """Remove this folder if nothing is in it (local disk; object stores have no empty
        folders); True if it is gone. A folder another process has just written into stays."""
        if not self.local:
            return not self.listdir()
        try:
            os.rmdir(self.root)
        except FileNotFoundError:
            return True
        except OSError:  # not empty (someone is using it) or not ours to remove
            return False
        return True

    def make_durable(self, rel: str) -> None:
        """Flush the bytes of the local file ``rel`` to the disk (``fdatasync``): a power
        loss after this leaves it whole. Nothing elsewhere (an object store's object is stored
        once its upload returns)."""
        if not self.local:
            return
        fd = os.open(self.full(rel), os.O_RDONLY)
        try:
            flush_to_disk(fd)
        finally:
            os.close(fd)

    def write_atomic(self, rel: str, data: bytes, *, make_folders: bool = True,
                     durable: bool = True) -> None:
        """Write ``data`` so that readers see either nothing or all of it: on local disk a
        temporary file beside the target, fsynced (unless not ``durable``: records void once
        their process is gone), renamed over it; on object stores one PUT.
        ``make_folders=False``: FileNotFoundError on local disk if the folder is gone (a lease's
        heartbeat never brings back a folder that purge removed)."""
        if self._s3:
            self._s3.client().put(self.full(rel), data)
            return
        if not self.local:
            self.fs.pipe_file(self.full(rel), data)
            return
        target = self.full(rel)
        if make_folders:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = layout.tmp_name(target)
        try:
            with (create(tmp) if make_folders else open(tmp, "wb")) as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            silent_remove(tmp)
            raise
        if durable:
            fsync_dir(os.path.dirname(target))

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` holding ``data`` only if it does not exist; True if this call created it.

        Exactly one of several concurrent callers wins: on local disk by hard-linking a finished
        temporary file into place (``link`` fails if the target exists), on S3 with a
        conditional PUT (``If-None-Match: *``; when its answer is lost, the object is read back:
        holding ``data`` it is this call's, :func:`snapcache.store.fs_s3.create_exclusive`), in
        ``memory://`` under a process-wide lock.
        Other filesystems have no atomic primitive through fsspec: there a check-then-write is
        used, and the commit protocol stays correct (see docs/format.md) at the cost of
        possibly duplicated work.
        """
        target = self.full(rel)
        if self.local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = layout.tmp_name(target)
            try:
                with create(tmp) as f:   # a full disk fails here: nothing may stay
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.link(tmp, target)
                return True
            except FileExistsError:
                return False
            finally:
                silent_remove(tmp)
        if self._s3:  # settled by reading back when the PUT's answer is lost
            return fs_s3.create_exclusive(self._s3.client(), target, data)
        with _MEMORY_LOCK:
            if self.fs.exists(target):
                return False
            self.fs.pipe_file(target, data)
            return True

    def modified(self, rel: str) -> float | None:
        """Last modification time (seconds since the epoch) of ``rel``, or None if absent."""
        if self._s3:
            head = self._s3.client().head(self.full(rel))
            return None if head is None else _mtime({"mtime": head["last_modified"]})
        try:
            return _mtime(self.fs.info(self._fresh(self.full(rel))))
        except FileNotFoundError:
            return None

    def walk(self, rel: str = "") -> list[FileStat]:
        """Every file below ``rel`` (recursively) with its size and modification time, in one
        listing (one LIST request per 1000 objects on S3); empty if ``rel`` does not exist."""
        base = self.full(rel).rstrip("/")
        try:
            if self._s3:
                found = {o["path"]: {"size": o["size"], "mtime": o["last_modified"]}
                         for o in self._s3.client().find(base)}
            else:
                found = self.fs.find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        stats = []
        for path, info in found.items():
            path = path.rstrip("/")
            name = path[len(base) + 1:] if path.startswith(base + "/") else posixpath.basename(path)
            if not name or info.get("type") == "directory":
                continue
            stats.append(FileStat(name, int(info.get("size") or 0), _mtime(info)))
        return sorted(stats, key=lambda s: s.path)

    def rename(self, src: str, dst: str) -> None:
        """Move a finished file into place, atomically (local disk only: a remote shard is
        stored whole by :meth:`upload` under its final name)."""
        if not self.local:
            raise NotImplementedError(f"rename on {self.url}: remote files are uploaded "
                                      f"under their final name")
        os.replace(self.full(src), self.full(dst))

    def incomplete_uploads(self) -> list[Upload]:
        """Multipart uploads started below this folder and never completed nor aborted (S3; an
        empty list elsewhere). A writer killed while uploading a large shard leaves one: its
        parts are billed but no listing shows them."""
        if not self._s3:
            return []
        return self._s3.s3fs().incomplete_uploads(self.root)

    def abort_upload(self, upload: Upload) -> None:
        self._s3.s3fs().abort_upload(self.root, upload)

    def link_target(self, rel: str = "") -> str | None:
        """Where ``rel`` points if it is a symbolic link (local disk), else None."""
        path = self.full(rel)
        if self.local and os.path.islink(path):
            return os.path.realpath(path)
        return None

    def remove_link(self, rel: str = "") -> None:
        """Remove the symbolic link ``rel`` itself, never what it points to."""
        path = self.full(rel)
        if not (self.local and os.path.islink(path)):
            raise ValueError(f"{self.url_of(rel)} is not a symbolic link")
        os.unlink(path)

    def remove(self, rel: str, recursive: bool = False) -> None:
        if self._s3:
            self._s3.client().remove(self.full(rel), recursive)
            return
        try:
            self.fs.rm(self.full(rel), recursive=recursive)
        except FileNotFoundError:
            pass


def _parsed(key: tuple, known: tuple | None, version: tuple | None, data: bytes,
            parse: Callable[[bytes], Any]) -> Any:
    """The value of ``data`` at ``version``: the known one if it is of that version."""
    if known is not None and known[0] == version and known[1] is not None:
        return known[1]
    value = parse(data)
    if version is not None:
        _remember(key, version, value, data)
    return value


def _remember(key: tuple, version: tuple, value: Any, data: bytes) -> None:
    with _PARSED_LOCK:
        _PARSED[key] = (version, value, data)
        _PARSED.move_to_end(key)
        while len(_PARSED) > PARSED_ENTRIES:
            _PARSED.popitem(last=False)


def _mtime(info: dict) -> float | None:
    """Seconds since the epoch of a file's last modification, from fsspec's ``info``."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(key)
        if value is not None:
            return value.timestamp() if hasattr(value, "timestamp") else float(value)
    return None
