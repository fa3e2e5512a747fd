"""Fixtures of the fingerprint tests."""

from __future__ import annotations

import sys
import textwrap

import pytest


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A user package ``fp_pkg`` on sys.path: ``write(name, src)`` (re)writes a module of it and
    drops it from sys.modules, as a fresh process would see the file."""
    (tmp_path / "fp_pkg").mkdir()
    (tmp_path / "fp_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, src: str) -> None:  # name: "helpers", "sub/helpers"
        path = tmp_path / "fp_pkg" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(src))
        for m in [m for m in sys.modules if m == "fp_pkg" or m.startswith("fp_pkg.")]:
            del sys.modules[m]
    yield write
    for m in [m for m in sys.modules if m == "fp_pkg" or m.startswith("fp_pkg.")]:
        del sys.modules[m]


@pytest.fixture
def clean_registry():
    """The registry of canonical forms as it was before the test, after it."""
    from snapcache.fingerprint import canonical

    saved = dict(canonical._REGISTRY), dict(canonical._DEFAULTS), dict(canonical._LAZY)
    yield
    for table, before in zip((canonical._REGISTRY, canonical._DEFAULTS, canonical._LAZY), saved):
        table.clear()
        table.update(before)
    canonical._clear_lookups()
