"""Where code comes from: user code, or the standard library and installed packages.

User code (``__main__``, modules outside the folders of
:func:`snapcache.errors.library_folders`) is fingerprinted by its bytecode and read for
randomness; library code counts by module, qualified name and package version
(:func:`module_version`), and is never imported to be read. snapcache itself counts as a
library, by its version, even when installed from a checkout.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import types

from snapcache.errors import library_folders

__all__ = ["is_library_path", "is_user_module", "module_version", "user_function"]


def _in_library(file: str) -> bool:
    """Is ``file`` (a module's ``__file__``, a spec's origin) in a folder of the standard
    library or of installed packages? Both sides are resolved through symbolic links."""
    return os.path.realpath(file).startswith(library_folders(resolved=True))


_LIBRARY_MODULES: dict[str, bool] = {}


def _library_module(name: str) -> bool | None:
    """Is module ``name`` stdlib or installed? None while it is not imported."""
    known = _LIBRARY_MODULES.get(name)
    if known is not None:
        return known
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "snapcache":
        # snapcache itself counts by version even when installed from a checkout (-e).
        result = True
    else:
        module = sys.modules.get(name) or sys.modules.get(top)
        if module is None:
            return None  # not imported (yet): do not remember a guess
        file = getattr(module, "__file__", None)
        result = bool(file) and _in_library(file)
    _LIBRARY_MODULES[name] = result
    return result


def is_user_module(name: str | None) -> bool:
    """Is ``name`` user code (hashed by bytecode), not stdlib or an installed package?"""
    return name is None or name == "__main__" or not _library_module(name)


def user_function(fn: types.FunctionType) -> bool:
    """Is ``fn``'s code user code? Judged by the module its code was written in (its globals):
    ``functools.wraps`` gives a library's wrapper the ``__module__`` of the function it wraps."""
    return is_user_module(fn.__globals__.get("__name__"))


@functools.lru_cache(maxsize=1024)
def _package_version(top: str) -> str:
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return f"python{sys.version_info[0]}.{sys.version_info[1]}"
    version = getattr(sys.modules.get(top), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        dists = importlib.metadata.packages_distributions().get(top) or [top]
        return importlib.metadata.version(dists[0])
    except Exception:  # no metadata: the name alone must do
        return ""


def module_version(name: str) -> str:
    """The version of the package that provides module ``name`` ("" for user code)."""
    return "" if is_user_module(name) else _package_version(name.partition(".")[0])



def is_library_path(path: str) -> bool:
    """Is the top-level module of ``path`` stdlib or installed? Decided without importing it
    when it is not imported yet."""
    top = path.partition(".")[0]
    known = _library_module(top)
    if known is not None:
        return known
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return bool(places) and all(_in_library(p) for p in places)
