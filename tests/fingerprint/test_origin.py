"""origin: which code is the user's (hashed by its code) and which a library's (by version)."""

from __future__ import annotations

import importlib.util
import sys

from snapcache.fingerprint import hash_function
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
