"""Where code comes from: user code, or the standard library and installed packages.

User code (``__main__``, modules outside the folders of
:func:`snapcache.errors.library_folders`) is fingerprinted by its bytecode and read for
randomness; library code counts by module, qualified name and package version
(:func:`module_version`), and is never imported to be read. An imported module is judged by
where its file is, by its name only when it has no file (built into the interpreter) or is not
imported. snapcache itself counts as a library, by its version, even when installed from a
checkout.
"""

from __future__ import annotations

import builtins
import functools
import importlib.metadata
import importlib.util
import os
import sys
import time
import types

import xxhash

from snapcache.errors import library_folders

__all__ = ["is_library_path", "is_user_module", "module_version", "user_class", "user_function",
           "user_module_sources"]


def _in_library(file: str) -> bool:
    """Is ``file`` (a module's ``__file__``, a spec's origin) in a folder of the standard
    library or of installed packages? Both sides are resolved through symbolic links."""
    return os.path.realpath(file).startswith(library_folders(resolved=True))


_LIBRARY_MODULES: dict[str, tuple[object, bool]] = {}  # name -> (its __file__, decision)


def _stdlib_name(top: str) -> bool:
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def _imported_library_module(name: str) -> bool | None:
    """Is the imported module ``name`` stdlib or installed? None while it is not imported.

    Decided by where its file is, when it has one: a user's ``calendar.py`` beside the script
    is what ``import calendar`` imports, and it is user code. By name only for a module without
    a file (``sys``, ``itertools``: built into the interpreter). The decision is remembered
    with the file it was made for."""
    top = name.partition(".")[0]
    if top == "snapcache":  # counts by version even when installed from a checkout (-e)
        return True
    module = sys.modules.get(name) or sys.modules.get(top)
    known = _LIBRARY_MODULES.get(name)
    if module is None:
        return None if known is None else known[1]  # imported once, since dropped
    file = getattr(module, "__file__", None)
    if known is not None and known[0] == file:
        return known[1]
    result = _in_library(file) if isinstance(file, str) and file else _stdlib_name(top)
    _LIBRARY_MODULES[name] = (file, result)
    return result


def _library_module(name: str) -> bool:
    """Is module ``name`` stdlib or installed? A module not imported counts by its name."""
    known = _imported_library_module(name)
    return _stdlib_name(name.partition(".")[0]) if known is None else known


def is_user_module(name: str | None) -> bool:
    """Is ``name`` user code (hashed by bytecode), not stdlib or an installed package?"""
    return name is None or name == "__main__" or not _library_module(name)


def user_function(fn: types.FunctionType) -> bool:
    """Is ``fn``'s code user code? Judged by the module its code was written in (its globals):
    ``functools.wraps`` gives a library's wrapper the ``__module__`` of the function it wraps."""
    return is_user_module(fn.__globals__.get("__name__"))


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: made by a class statement or type(), not static C


def user_class(cls: type) -> bool:
    """Is ``cls`` user code (its methods hashed by bytecode)? Judged by its module; a class
    made by ``exec(source, {})`` takes ``__module__`` "builtins" from a namespace without
    ``__name__``, and counts as user code: the builtins module does not own it, and it was not
    made in C (the builtins' classes are static types)."""
    module = cls.__module__
    if module == "builtins":
        return bool(cls.__flags__ & _HEAPTYPE) and getattr(builtins, cls.__name__, None) is not cls
    return is_user_module(module)


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
    known = _imported_library_module(top)
    if known is not None:
        return known
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin in ("built-in", "frozen"):
        return _stdlib_name(top)  # nothing to import it from here, or no file: by its name
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return bool(places) and all(_in_library(p) for p in places)


# -- what a user module held as a value reads -------------------------------------------------

def user_module_sources(module: types.ModuleType) -> list[tuple[str, bytes]]:
    """(path, digest of the bytes) of the source files of ``module`` and of every user module
    its code can read by name: recursively, the user modules in its namespace (``import
    consts``, a package's submodules) and those its functions and classes come from (``from
    .impl import scale`` in a package's ``__init__.py``). Library modules are not followed;
    a module without a Python source file gives nothing.

    Each path is relative to ``module``'s folder, with ``/`` (``impl.py``, ``../consts.py``):
    so neither the project's place nor a module's name (``__main__`` when run as a script)
    counts, and a file met under two names counts once. Sorted by path."""
    found: dict[str, types.ModuleType] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        name = getattr(m, "__name__", None)
        if not isinstance(name, str) or name in found:
            continue
        found[name] = m
        for value in list(vars(m).values()):
            read = _module_read_through(value)
            if read is not None and read.__name__ not in found and is_user_module(read.__name__):
                todo.append(read)
    files = {os.path.realpath(f) for m in found.values()
             if isinstance(f := getattr(m, "__file__", None), str) and f.endswith(".py")}
    base = _folder(module)
    out = []
    for file in files:
        digest = _source_digest(file)
        if digest is not None:
            out.append((_relative(file, base), digest))
    return sorted(out)


def _folder(module: types.ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        return os.path.dirname(os.path.realpath(file))
    path = list(getattr(module, "__path__", None) or ())  # a namespace package
    return os.path.realpath(path[0]) if path else None


def _relative(file: str, base: str | None) -> str:
    try:
        return os.path.relpath(file, base).replace(os.sep, "/") if base else file
    except ValueError:  # another drive
        return file


def _module_read_through(value: object) -> types.ModuleType | None:
    """The module ``value`` is (``import consts``), or the one whose code it runs (a
    function's, a class's, an object's class's)."""
    if isinstance(value, types.ModuleType):
        return value
    if isinstance(value, types.FunctionType):
        name = value.__globals__.get("__name__")
    else:
        name = (value if isinstance(value, type) else type(value)).__module__
    return sys.modules.get(name) if isinstance(name, str) else None


_SOURCE_DIGESTS: dict[str, tuple[int, int, bytes]] = {}  # file -> (mtime_ns, size, digest)
_RECENT_NS = 2_000_000_000  # a file changed this recently may change again in the same mtime


def _source_digest(file: str) -> bytes | None:
    """The xxh3 digest of a Python source file's bytes, remembered while its size and mtime
    stay the same (a module reloaded after an edit is read again). A file changed in the last
    two seconds is read every time: the clock that stamps mtimes ticks in milliseconds, and two
    writes in one tick would look alike."""
    try:
        st = os.stat(file)
        known = _SOURCE_DIGESTS.get(file)
        if known is not None and known[:2] == (st.st_mtime_ns, st.st_size):
            return known[2]
        with open(file, "rb") as f:
            digest = xxhash.xxh3_128_digest(f.read())
    except OSError:
        return None
    if time.time_ns() - st.st_mtime_ns > _RECENT_NS:
        _SOURCE_DIGESTS[file] = (st.st_mtime_ns, st.st_size, digest)
    return digest
