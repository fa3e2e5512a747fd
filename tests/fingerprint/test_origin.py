"""origin: which code is the user's (hashed by its code) and which a library's (by version)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import time
import types

import snapcache as sc
from snapcache.fingerprint import hash_function, origin
from snapcache.fingerprint.origin import is_library_path, is_user_module, module_version

from fp_user_code import make


def test_stdlib_and_installed_modules_are_library_code():
    assert not is_user_module("json") and not is_user_module("numpy")
    assert not is_user_module("sys") and not is_user_module("itertools")  # no file: by name
    assert module_version("json") == f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert is_library_path("json.decoder") and is_library_path("sys")
    assert is_user_module("__main__") and is_user_module(None)


def test_a_user_module_named_like_a_stdlib_module_is_user_code(tmp_path, monkeypatch):
    """A user's ``colorsys.py`` beside the script is what ``import colorsys`` imports there: it
    is user code, judged by where its file is, not by its name."""
    def digest(k: int) -> str:
        path = tmp_path / f"v{k}" / "colorsys.py"
        path.parent.mkdir()
        path.write_text(f"def shift(x):\n    return x + {k}\n")
        spec = importlib.util.spec_from_file_location("colorsys", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, "colorsys", module)
        assert is_user_module("colorsys") and module_version("colorsys") == ""
        return hash_function(make("def f(x):\n    return colorsys.shift(x)\n",
                                  colorsys=module), "f").digest
    assert digest(2) != digest(3)
    monkeypatch.undo()
    import colorsys  # the standard library's again
    assert colorsys.__file__.startswith(sys.base_prefix) and not is_user_module("colorsys")


# -- a user package held as a value: its walk and its files, remembered in one process ----------

def _configured(x, cfg=None):
    return x


def _pipeline_holding(package) -> str:
    """The fingerprint of a fresh pipeline holding ``package`` (a sweep, a notebook cell run
    again): ``ds.map(functools.partial(f, cfg=package))``."""
    return sc.Dataset.range(3).map(functools.partial(_configured, cfg=package)).fingerprint()


def _make_package(user_package, tmp_path, modules: int = 6) -> types.ModuleType:
    """``fp_pkg`` re-exporting from ``modules`` modules, each importing the one before, its
    files dated a minute ago (their digests are remembered: see ``_source_digest``)."""
    for i in range(modules):
        before = f"from fp_pkg import m{i - 1}\n" if i else ""
        user_package(f"m{i}", f"{before}K = {i}\ndef scale(x):\n    return x * K\n")
    (tmp_path / "fp_pkg" / "__init__.py").write_text(
        "".join(f"from fp_pkg.m{i} import scale as scale{i}\n" for i in range(modules)))
    _age(tmp_path / "fp_pkg")
    return importlib.import_module("fp_pkg")


def _age(folder, seconds: int = 60) -> None:
    stamp = time.time_ns() - seconds * 1_000_000_000
    for path in folder.rglob("*.py"):
        os.utime(path, ns=(stamp, stamp))


def _count_reads(monkeypatch) -> list:
    """The values whose module the walk looks up (once per value of a namespace it walks)."""
    looked: list = []
    real = origin._module_read_through

    def counted(value, *args, **kwargs):
        looked.append(value)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(origin, "_module_read_through", counted)
    return looked


def test_a_fresh_pipeline_holding_the_same_package_reuses_the_walk(user_package, tmp_path,
                                                                   monkeypatch):
    package = _make_package(user_package, tmp_path)
    looked = _count_reads(monkeypatch)
    first = _pipeline_holding(package)
    assert len(origin.user_module_sources(package)) == 7  # __init__ and m0..m5
    walked = len(looked)
    assert walked > 0
    assert _pipeline_holding(package) == first
    assert len(looked) == walked, "a fresh pipeline walked the package's namespaces again"
    # a module reloaded after an edit is walked again, alone: its namespace holds new objects
    (tmp_path / "fp_pkg" / "m5.py").write_text("from fp_pkg import m4\nK = 50\n"
                                               "def scale(x):\n    return x * K\n")
    importlib.reload(package.m5)
    assert _pipeline_holding(package) != first
    assert looked[walked:] == list(vars(package.m5).values())


def test_an_edited_file_changes_the_fingerprint_of_a_fresh_pipeline(user_package, tmp_path):
    """An edit is seen by the file's size or mtime, whether or not its module is reloaded."""
    package = _make_package(user_package, tmp_path)
    m3 = tmp_path / "fp_pkg" / "m3.py"
    seen = {_pipeline_holding(package)}
    m3.write_text(m3.read_text().replace("K = 3", "K = 4"))  # the same size, a new mtime
    _age(tmp_path / "fp_pkg", seconds=30)
    seen.add(_pipeline_holding(package))
    m3.write_text(m3.read_text().replace("K = 4", "K = 40"))  # another size, mtime restored
    os.utime(m3, ns=(m3.stat().st_atime_ns, m3.stat().st_mtime_ns - 1))
    _age(tmp_path / "fp_pkg", seconds=30)
    seen.add(_pipeline_holding(package))
    assert len(seen) == 3
    m3.write_text(m3.read_text().replace("K = 40", "K = 3"))  # back to the first version
    _age(tmp_path / "fp_pkg", seconds=10)
    assert _pipeline_holding(package) in seen


def test_a_rewrite_keeping_size_and_mtime_is_seen_only_while_recent(user_package, tmp_path,
                                                                    monkeypatch):
    """What is guaranteed, as for ``from_files`` (path, size, mtime): a file rewritten to the
    same size with its old mtime put back (``os.utime``, ``cp -p``) keeps the digest read
    before, except while its mtime is recent (the last two seconds, ``_RECENT_NS``): then it
    is read every time, since two writes within one tick of the mtime clock look alike."""
    package = _make_package(user_package, tmp_path)
    m3 = tmp_path / "fp_pkg" / "m3.py"

    def rewrite(old: str, new: str) -> None:
        stamp = m3.stat().st_mtime_ns
        m3.write_text(m3.read_text().replace(old, new))
        os.utime(m3, ns=(stamp, stamp))

    recent_ns = origin._RECENT_NS
    monkeypatch.setattr(origin, "_RECENT_NS", 10 ** 18)  # every file is recent
    first = _pipeline_holding(package)
    rewrite("K = 3", "K = 7")
    second = _pipeline_holding(package)
    assert second != first
    monkeypatch.setattr(origin, "_RECENT_NS", recent_ns)  # a minute old again: remembered
    assert _pipeline_holding(package) == second
    rewrite("K = 7", "K = 3")
    assert _pipeline_holding(package) == second  # the remembered digest holds


def test_modules_a_package_reads_later_count_in_a_fresh_pipeline(user_package, tmp_path):
    """The remembered walk follows the namespaces: a submodule imported since (it appears in
    its package's namespace), or one a reloaded module imports now, counts, and so do its
    edits."""
    package = _make_package(user_package, tmp_path)
    first = _pipeline_holding(package)
    (tmp_path / "fp_pkg" / "late.py").write_text("K = 1\n")
    (tmp_path / "fp_pkg" / "extra.py").write_text("K = 2\n")
    _age(tmp_path / "fp_pkg")
    importlib.import_module("fp_pkg.late")
    late = _pipeline_holding(package)
    assert late != first
    (tmp_path / "fp_pkg" / "m0.py").write_text("from fp_pkg import extra\nK = 0\n"
                                               "def scale(x):\n    return x * K\n")
    importlib.reload(package.m0)
    with_extra = _pipeline_holding(package)
    assert with_extra != late
    assert any(path == "extra.py" for path, _ in origin.user_module_sources(package))
    (tmp_path / "fp_pkg" / "extra.py").write_text("K = 22\n")
    _age(tmp_path / "fp_pkg")
    assert _pipeline_holding(package) != with_extra
