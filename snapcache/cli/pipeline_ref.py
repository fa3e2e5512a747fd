"""Load a pipeline named on the command line as ``module:attr`` or ``path/to/file.py:attr``.

The module is imported: its top-level code runs. A training script whose loop sits at top
level (not under ``if __name__ == "__main__":``) therefore trains, and may build the very
snapshot it was asked about; :func:`committed_since` finds such snapshots so that ``snapcache
explain`` can say so.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import socket
import sys
from datetime import datetime
from typing import Any


def load_pipeline(ref: str) -> Any:
    """The Dataset named by ``ref``; ``attr`` may also be a function returning one, called
    without arguments."""
    from snapcache.pipeline.dataset import Dataset

    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--pipeline must look like 'module:attr' or 'file.py:attr', got {ref!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.exists(path):
            raise ValueError(f"--pipeline: no file {module_name!r}")
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(path))[0], path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise ValueError(f"--pipeline: cannot import {module_name!r} ({e})") from None
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise ValueError(f"--pipeline: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    if isinstance(value, Dataset):
        return value
    if not _callable_without_arguments(value):
        raise ValueError(f"--pipeline: `{attr}` in {module_name} is not a Dataset or a function "
                         f"returning one ({_kind(value)}); name the Dataset, or a function that "
                         "builds it and takes no arguments")
    result = value()
    if not isinstance(result, Dataset):
        raise ValueError(f"--pipeline: `{attr}` in {module_name} returned "
                         f"{_kind(result)}, not a snapcache.Dataset")
    return result


def _callable_without_arguments(value: Any) -> bool:
    if not callable(value) or isinstance(value, type):
        return False
    try:
        inspect.signature(value).bind()
    except TypeError:  # required arguments
        return False
    except ValueError:  # no signature to read (some builtins): let the call decide
        return True
    return True


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    if callable(value):
        try:
            return f"a function taking arguments {inspect.signature(value)}"
        except ValueError:
            return "a callable taking arguments"
    return f"an object of type {type(value).__name__}"


def committed_since(root: str, since: datetime, storage_options: dict | None = None
                    ) -> list:
    """The snapshots of ``root`` (``SnapshotInfo``) that this machine committed at or after
    ``since``: when ``since`` is the moment a module started being imported, those its
    top-level code built (or another process here, in that very interval)."""
    from snapcache.admin import ls
    from snapcache.admin.inventory import parse_time

    try:
        snaps = ls(root, storage_options=storage_options)
    except (FileNotFoundError, NotADirectoryError):
        return []
    since = since.replace(microsecond=since.microsecond // 1000 * 1000)  # manifests keep ms
    host = socket.gethostname()

    def built(snap) -> bool:
        committed = parse_time(snap.manifest.committed_at)
        return (snap.manifest.writer or {}).get("host") == host and committed is not None \
            and committed >= since

    return [s for s in snaps if s.manifest is not None and built(s)]


def import_warning(ref: str, built: list) -> str:
    """What ``snapcache explain`` says when importing ``ref``'s module built snapshots."""
    module = ref.rpartition(":")[0]
    which = ", ".join(s.short_id + (f" ({s.name})" if s.name else "") for s in built)
    return (f"warning: importing {module} built snapshot {which} (it was committed during "
            "the import): the module's top-level code ran the pipeline (a training loop not "
            "under `if __name__ == \"__main__\":`?), so what follows describes the snapshot "
            "the import just built, not what was there before. Keep the loop under "
            "`if __name__ == \"__main__\":` or in a function")
