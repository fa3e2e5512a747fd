"""Optional frameworks, imported on first use with a hint naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

_EXTRAS = {"torch": ("PyTorch", "torch"), "tensorflow": ("TensorFlow", "tf")}


def require(module: str, call: str) -> ModuleType:
    """Import ``module`` for ``call`` (e.g. ``"ds.to_torch()"``), or raise an ImportError that
    says which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        name, extra = _EXTRAS[module]
        raise ImportError(f"{call} needs {name}: pip install 'snapcache[{extra}]'") from e
