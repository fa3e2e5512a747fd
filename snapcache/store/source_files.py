"""Source files of a pipeline (``from_files``, ``from_parquet``): expanding globs and lists into
file URLs, what identifies each file's content cheaply (path, size, mtime or ETag: the
fingerprint of a file source and the units of a delta snapshot), and opening them. Local paths
take the standard library (one ``scandir`` a folder, one ``stat`` a file); other URLs go
through the filesystem :mod:`snapcache.store.fs` makes (on S3 one listing request per 1,000
keys, none per file)."""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
from typing import IO, Any, Sequence

import xxhash

from snapcache.store import fs_s3
from snapcache.store.fs import _filesystem, _protocol, is_local


def expand_files(patterns: str | os.PathLike | Sequence[str | os.PathLike],
                 storage_options: dict | None = None) -> list[str]:
    """Expand a glob or a list of paths/URLs into a sorted-per-pattern list of file URLs.

    A list keeps the user's order (each glob within it expands sorted); a pattern that matches
    nothing raises ``FileNotFoundError``.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    urls: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        fs, path = _filesystem(pattern, storage_options)
        fs.invalidate_cache()  # list what is there now, not what an earlier listing saw
        protocol = _protocol(fs)
        if any(ch in path for ch in "*?["):
            if is_local(fs):  # the standard library: no fsspec stat a file (10k files: ~20x)
                matches = _local_glob(path)
            else:
                found = fs.glob(path, detail=True)  # types from the listing, no request a match
                matches = sorted(m for m, info in found.items()
                                 if info.get("type") != "directory")
        else:
            matches = [path] if fs.exists(path) else []
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern!r}")
        for m in matches:
            urls.append(m if protocol in ("file", "local") else fs.unstrip_protocol(m))
    return urls


def _local_glob(path: str) -> list[str]:
    """Files matching a local glob, sorted. A pattern whose wildcards are all in its last part
    (``data/*.jpg``) is one ``scandir`` of the folder, directories told apart by the entries'
    types (no ``stat`` a file); others go through :func:`glob.glob`."""
    folder, name = os.path.split(path)
    if any(ch in folder for ch in "*?[") or name == "**":
        return sorted(m for m in glob.glob(path, recursive=True) if not os.path.isdir(m))
    hidden = name.startswith(".")  # as glob: a wildcard does not match a leading dot
    try:
        with os.scandir(folder or ".") as entries:
            found = [os.path.join(folder, e.name) for e in entries
                     if (hidden or not e.name.startswith(".")) and
                     fnmatch.fnmatchcase(e.name, name) and not e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found)


def file_identity(url: str, strict: bool = False, storage_options: dict | None = None) -> dict:
    """What identifies a source file's content cheaply: path, size and mtime or ETag.

    ``strict=True`` adds an xxh3-128 hash of the file's bytes.
    """
    fs, path = _filesystem(url, storage_options)
    if is_local(fs):
        st = os.stat(path)
        identity: dict[str, Any] = {"path": url, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        info: dict[str, Any] = {}
    else:
        fs.invalidate_cache(path)
        info = fs.info(path)
        identity = {"path": url, "size": int(info.get("size") or 0)}
    etag = info.get("ETag") or info.get("etag")
    if "mtime_ns" in identity:
        pass
    elif etag:
        identity["etag"] = str(etag).strip('"')
    else:
        mtime = (info.get("mtime") or info.get("LastModified") or info.get("last_modified")
                 or info.get("created"))
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        if mtime is not None:
            identity["mtime_ns"] = int(round(float(mtime) * 1e9)) if not isinstance(mtime, int) \
                else mtime
    if strict:
        h = xxhash.xxh3_128()
        with fs.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        identity["xxh3_128"] = h.hexdigest()
    return identity


def file_identities(urls: Sequence[str], strict: bool = False,
                    storage_options: dict | None = None) -> list[dict]:
    """:func:`file_identity` of many files at once, in order. Local paths: one ``stat`` each,
    no fsspec call. Object stores: the identities come from one paginated listing of each
    folder the files are in (on S3 one request per 1,000 keys, not one per file); a file the
    listing does not show is asked for alone."""
    urls = [str(u) for u in urls]
    if strict:
        return [file_identity(url, True, storage_options) for url in urls]
    identities: list[dict | None] = [None] * len(urls)
    remote: dict[str, list[int]] = {}
    for i, url in enumerate(urls):
        if "://" not in url or url.startswith("file://"):
            path = url[len("file://"):] if url.startswith("file://") else url
            st = os.stat(path)
            identities[i] = {"path": url, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        else:
            remote.setdefault(posixpath.dirname(url), []).append(i)
    for folder, indices in remote.items():
        if len(indices) == 1:
            identities[indices[0]] = file_identity(urls[indices[0]], False, storage_options)
            continue
        listed = fs_s3.listed_identities(*_filesystem(folder, storage_options))
        for i in indices:
            found = listed.get(posixpath.basename(urls[i]))
            identities[i] = {"path": urls[i], **found} if found else \
                file_identity(urls[i], False, storage_options)
    return identities  # type: ignore[return-value]


def is_dir(url: str, storage_options: dict | None = None) -> bool:
    fs, path = _filesystem(url, storage_options)
    return bool(fs.isdir(path))


def open_input(url: str, storage_options: dict | None = None) -> IO[bytes]:
    """A seekable binary file object reading ``url`` (local path or any fsspec URL)."""
    fs, path = _filesystem(url, storage_options)
    return fs.open(path, "rb")
