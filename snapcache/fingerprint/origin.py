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
import operator
import os
import sys
import time
import types
import weakref

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
#
# A sweep or a notebook builds a fresh pipeline holding the same package again and again; each
# takes its fingerprint. Walking the namespaces of a package's modules and resolving their files
# is most of that cost (~30 ms for 500 modules), so within one process the walk is remembered
# per module object, and each file's real path and digest per file: valid while what decided
# them is unchanged, and only that is checked again (the namespace's values, the modules it
# resolves to by name; each file's stat). An edited file is seen by its size or mtime, as
# ``_source_digest`` says, whether or not its module was reloaded; a reloaded module is walked
# again (its namespace holds new objects).

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
        todo += [read for read in _namespace_reads(m) if read.__name__ not in found]
    files: dict[str, tuple[str, os.stat_result]] = {}  # real path -> (a name of it, its stat)
    for m in found.values():
        file = getattr(m, "__file__", None)
        if isinstance(file, str) and file.endswith(".py"):
            try:
                st = os.stat(file)
            except OSError:  # gone since it was imported: nothing to read
                continue
            files.setdefault(_real_path(file, st), (file, st))
    base = _folder(module)
    out = []
    for real, (file, st) in files.items():
        digest = _source_digest(file, st)
        if digest is not None:
            out.append((_relative(real, base), digest))
    return sorted(out)


class _Reads:
    """What one module's namespace reads (:func:`_namespace_reads`), and what that was
    decided from: the namespace's values, and what each name looked up in ``sys.modules``
    gave."""

    __slots__ = ("values", "names", "gave", "modules")

    def __init__(self, values: tuple, looked: dict[str, object],
                 modules: tuple[types.ModuleType, ...]) -> None:
        self.values, self.modules = values, modules
        self.names, self.gave = tuple(looked), tuple(looked.values())

    def holds(self, namespace: dict) -> bool:
        """Is this still what ``namespace`` reads? The same objects in it (an assignment, an
        import, a reload put others), the same modules under the names looked up."""
        values = tuple(namespace.values())  # at once: another thread may import meanwhile
        return len(values) == len(self.values) and all(
            map(operator.is_, values, self.values)) and all(
            map(operator.is_, map(sys.modules.get, self.names), self.gave))


_READS: "weakref.WeakKeyDictionary[types.ModuleType, _Reads]" = weakref.WeakKeyDictionary()
_READS_KEPT = 20_000  # modules: beyond, the table starts again (a cache, not state)


def _namespace_reads(m: types.ModuleType) -> tuple[types.ModuleType, ...]:
    """The user modules ``m``'s namespace reads by name (:func:`_module_read_through` of each
    value), in namespace order; remembered per module object while :meth:`_Reads.holds`."""
    namespace = vars(m)
    known = _READS.get(m)
    if known is not None and known.holds(namespace):
        return known.modules
    values = tuple(namespace.values())
    looked: dict[str, object] = {}
    met: dict[int, types.ModuleType] = {}
    for value in values:
        read = _module_read_through(value, looked)
        if read is not None:
            met.setdefault(id(read), read)
    reads = []
    for read in met.values():
        name = getattr(read, "__name__", None)
        if isinstance(name, str):
            top = name.partition(".")[0]  # what is_user_module looks up
            looked[name], looked[top] = sys.modules.get(name), sys.modules.get(top)
            if is_user_module(name):
                reads.append(read)
    found = _Reads(values, looked, tuple(reads))
    if len(_READS) >= _READS_KEPT:
        _READS.clear()
    try:
        _READS[m] = found
    except TypeError:  # a module subclass that cannot be weakly referenced
        pass
    return found.modules


def _folder(module: types.ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        return os.path.dirname(os.path.realpath(file))
    path = list(getattr(module, "__path__", None) or ())  # a namespace package
    return os.path.realpath(path[0]) if path else None


@functools.lru_cache(maxsize=65536)
def _relative(file: str, base: str | None) -> str:
    """``file`` relative to ``base`` (both real, absolute paths: a pure function of the two)."""
    try:
        return os.path.relpath(file, base).replace(os.sep, "/") if base else file
    except ValueError:  # another drive
        return file


_REAL_PATHS: dict[str, tuple[int, int, str]] = {}  # file -> (st_dev, st_ino, its real path)


def _real_path(file: str, st: os.stat_result) -> str:
    """``os.path.realpath(file)``, remembered for an absolute ``file`` while it names the same
    file (device and inode of ``st``, its stat through any symbolic links): a link pointed
    elsewhere, or a file replaced (an editor saving by rename), is resolved again."""
    known = _REAL_PATHS.get(file)
    if known is not None and known[:2] == (st.st_dev, st.st_ino):
        return known[2]
    real = os.path.realpath(file)
    if os.path.isabs(file):  # a relative one depends on the working folder
        _REAL_PATHS[file] = (st.st_dev, st.st_ino, real)
    return real


def _module_read_through(value: object, looked: dict[str, object] | None = None
                         ) -> types.ModuleType | None:
    """The module ``value`` is (``import consts``), or the one whose code it runs (a
    function's, a class's, an object's class's); the names looked up in ``sys.modules`` go
    into ``looked``, with what they gave."""
    if isinstance(value, types.ModuleType):
        return value
    if isinstance(value, types.FunctionType):
        name = value.__globals__.get("__name__")
    else:
        name = (value if isinstance(value, type) else type(value)).__module__
    if not isinstance(name, str):
        return None
    module = sys.modules.get(name)
    if looked is not None:
        looked[name] = module
    return module


_SOURCE_DIGESTS: dict[str, tuple[int, int, bytes]] = {}  # file -> (mtime_ns, size, digest)
_RECENT_NS = 2_000_000_000  # a file changed this recently may change again in the same mtime


def _source_digest(file: str, st: os.stat_result) -> bytes | None:
    """The xxh3 digest of a Python source file's bytes (``st``: its stat, just taken),
    remembered while its size and mtime stay the same: an edit is seen when it changes either
    (a module reloaded after an edit or not). A file changed in the last two seconds is read
    every time: the clock that stamps mtimes ticks in milliseconds (seconds on some file
    systems), and two writes in one tick would look alike. Not seen: a rewrite to the same
    size that puts the old mtime back (``os.utime``, ``cp -p``), as for ``from_files``'
    identities (path, size, mtime)."""
    known = _SOURCE_DIGESTS.get(file)
    if known is not None and known[:2] == (st.st_mtime_ns, st.st_size):
        return known[2]
    try:
        with open(file, "rb") as f:
            digest = xxhash.xxh3_128_digest(f.read())
    except OSError:
        return None
    if time.time_ns() - st.st_mtime_ns > _RECENT_NS:
        _SOURCE_DIGESTS[file] = (st.st_mtime_ns, st.st_size, digest)
    return digest
