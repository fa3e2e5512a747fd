"""Load a pipeline named on the command line as ``module:attr`` or ``path/to/file.py:attr``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any


def load_pipeline(ref: str) -> Any:
    """The Dataset named by ``ref``; ``attr`` may also be a function returning one."""
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
    if callable(value) and not isinstance(value, Dataset):
        value = value()
    if not isinstance(value, Dataset):
        raise ValueError(f"--pipeline: {ref!r} is a {type(value).__name__}, not a "
                         "snapcache.Dataset (or a function returning one)")
    return value
