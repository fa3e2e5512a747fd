"""The import rules of docs/architecture.md, checked on every module's imports (module level
and inside functions), so a forbidden dependency fails here instead of in review.

- ``store/`` never imports ``pipeline``, ``runtime``, ``adapters`` or ``cli``;
- ``fingerprint/`` never imports ``store``;
- only ``store/fs.py``, ``store/fs_s3.py`` and ``store/fs_obstore.py`` (its S3-specific
  parts) import fsspec, s3fs or obstore;
- only ``adapters/`` import torch, tensorflow or ray at module level;
- nobody outside ``pipeline/`` reads ``Dataset._op``;
- only ``store/protocol/`` writes the protocol's files (leases, progress records, stream
  markers, the manifest, the last-use record): nobody else calls the two primitives they are
  written with (``Storage.write_atomic``, ``Storage.create_exclusive``, implemented in
  ``store/fs.py``) or builds a marker, progress or lease file name; the one stated exception
  is in :data:`OTHER_WRITES` (a shard's page checksum file).
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

import snapcache

PACKAGE = pathlib.Path(snapcache.__file__).parent
FRAMEWORKS = ("torch", "tensorflow", "ray")
FS_MODULES = ("snapcache.store.fs", "snapcache.store.fs_s3", "snapcache.store.fs_obstore")


@dataclass(frozen=True)
class Import:
    module: str      # what is imported, absolute ("snapcache.store.fs", "torch.utils.data")
    line: int
    module_level: bool


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, name: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (of module ``name``), with relative imports resolved, and
    whether it runs when the module is imported (not inside a function or TYPE_CHECKING)."""
    found: list[Import] = []
    package = name if is_package else name.rpartition(".")[0]

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, child.lineno, module_level)
                             for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                found.append(Import(base, child.lineno, module_level))
                # ``from snapcache.pipeline import ops`` imports snapcache.pipeline.ops
                found.extend(Import(f"{base}.{alias.name}", child.lineno, module_level)
                             for alias in child.names if alias.name != "*")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), module_level)
            else:
                visit(child, module_level)

    visit(ast.parse(source), True)
    return found


PROTOCOL_WRITES = ("write_atomic", "create_exclusive")
PROTOCOL_NAMES = ("marker_name", "progress_name", "lease_name", "reader_lease_name")
# Files outside the protocol written with its primitive, each for a stated reason.
OTHER_WRITES = {
    # a shard's page checksum file: an index beside the shard, pinned by the manifest's
    # pages_checksum, replaced whole (never part-written), not a protocol record
    ("snapcache.store.indexed_file", "write_atomic"),
}


def protocol_writes(source: str, name: str = "") -> list[tuple[int, str]]:
    """Calls of the protocol's write primitives (but those :data:`OTHER_WRITES` allows module
    ``name``) and uses of its file names: (line, what)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in PROTOCOL_WRITES and (name, node.func.attr) not in OTHER_WRITES:
            found.append((node.lineno, f"calls .{node.func.attr}()"))
        elif isinstance(node, (ast.Attribute, ast.Name)) and \
                (node.attr if isinstance(node, ast.Attribute) else node.id) in PROTOCOL_NAMES:
            name = node.attr if isinstance(node, ast.Attribute) else node.id
            found.append((node.lineno, f"names protocol files with {name}"))
    return found


def op_reads(source: str) -> list[int]:
    """Lines reading an attribute named ``_op``."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr == "_op"]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(name: str, source: str, is_package: bool = False) -> list[str]:
    """The broken rules of one module, as readable lines."""
    problems = []
    for imp in imports_of(source, name, is_package):
        if _within(name, "snapcache.store"):
            for upper in ("pipeline", "runtime", "adapters", "cli"):
                if _within(imp.module, f"snapcache.{upper}"):
                    problems.append(f"{name}:{imp.line} imports {imp.module}: the store never "
                                    f"imports snapcache.{upper}")
        if _within(name, "snapcache.fingerprint") and _within(imp.module, "snapcache.store"):
            problems.append(f"{name}:{imp.line} imports {imp.module}: fingerprinting is pure "
                            "(it receives file identities), it never imports the store")
        if name not in FS_MODULES and any(_within(imp.module, lib)
                                          for lib in ("fsspec", "s3fs", "obstore")):
            problems.append(f"{name}:{imp.line} imports {imp.module}: only snapcache.store.fs "
                            "(with fs_s3, fs_obstore) talks to fsspec and S3 clients")
        if imp.module_level and not _within(name, "snapcache.adapters") and any(
                _within(imp.module, lib) for lib in FRAMEWORKS):
            problems.append(f"{name}:{imp.line} imports {imp.module} at module level: only "
                            "snapcache.adapters imports frameworks, and only when used")
    if not _within(name, "snapcache.store.protocol") and name not in (
            "snapcache.store.fs", "snapcache.store.layout"):
        problems.extend(f"{name}:{line} {what}: only snapcache.store.protocol writes leases, "
                        "progress records, stream markers and manifests"
                        for line, what in protocol_writes(source, name))
    if not _within(name, "snapcache.pipeline"):
        problems.extend(f"{name}:{line} reads ._op: outside snapcache.pipeline, use the "
                        "Dataset's public methods" for line in op_reads(source))
    return problems


def all_modules() -> list[tuple[str, str, bool]]:
    return [(module_name(path), path.read_text(), path.name == "__init__.py")
            for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_module_follows_the_import_rules():
    problems = [p for name, source, is_package in all_modules()
                for p in violations(name, source, is_package)]
    assert not problems, "layering rules broken (see docs/architecture.md):\n" + \
        "\n".join(problems)


def test_the_checker_sees_all_modules():
    names = {name for name, _, _ in all_modules()}
    assert {"snapcache.store.fs", "snapcache.pipeline.ops.base", "snapcache.machine",
            "snapcache.adapters.torch"} <= names


@pytest.mark.parametrize("name, source, rule", [
    ("snapcache.store.writer", "from snapcache.runtime import autotune\n", "the store never"),
    ("snapcache.store.writer", "def f():\n    from snapcache.pipeline import ops\n",
     "the store never"),
    ("snapcache.store.reader", "from ..pipeline import plan\n", "the store never"),
    ("snapcache.store.reader", "from .. import cli\n", "the store never"),
    ("snapcache.fingerprint.sources", "import snapcache.store.fs\n", "fingerprinting is pure"),
    ("snapcache.fingerprint.sources", "def f():\n    from snapcache.store import fs\n",
     "fingerprinting is pure"),
    ("snapcache.store.cache", "import fsspec\n", "only snapcache.store.fs"),
    ("snapcache.store.fs_cache", "import s3fs\n", "only snapcache.store.fs"),
    ("snapcache.store.cache", "def f():\n    import obstore\n", "only snapcache.store.fs"),
    ("snapcache.pipeline.dataset", "def f():\n    from s3fs import S3FileSystem\n",
     "only snapcache.store.fs"),
    ("snapcache.pipeline.dataset", "import torch\n", "at module level"),
    ("snapcache.runtime.process", "try:\n    import tensorflow as tf\nexcept ImportError:\n"
     "    tf = None\n", "at module level"),
    ("snapcache.cli.main", "import ray.data\n", "at module level"),
    ("snapcache.adapters.tf", "x = ds._op\n", "reads ._op"),
    ("snapcache.cli.ls", "def f(ds):\n    return ds._op.parent\n", "reads ._op"),
    ("snapcache.admin.purge", "folder.create_exclusive(layout.MANIFEST, data)\n",
     "only snapcache.store.protocol writes"),
    ("snapcache.adapters.ray", "if layout.marker_name(n, i) in names: pass\n",
     "only snapcache.store.protocol writes"),
    ("snapcache.store.writer", "self.storage.write_atomic(name, data)\n",
     "only snapcache.store.protocol writes"),
    ("snapcache.store.indexed_file", "storage.create_exclusive(name, data)\n",
     "only snapcache.store.protocol writes"),
    ("snapcache.store.indexed_file", "x = layout.progress_name(1, 0, r)\n",
     "only snapcache.store.protocol writes"),
])
def test_the_checker_catches_each_rule(name, source, rule):
    problems = violations(name, source)
    assert problems and all(rule in p for p in problems), problems


@pytest.mark.parametrize("name, source", [
    ("snapcache.store.fs", "import fsspec\nimport s3fs\n"),
    ("snapcache.store.fs_s3", "import fsspec.asyn\n"),
    ("snapcache.store.fs_obstore", "def f():\n    from obstore.store import S3Store\n"),
    ("snapcache.adapters.ray_read", "import ray\n"),
    ("snapcache.pipeline.dataset", "def to_torch(self):\n    import torch\n"),
    ("snapcache.pipeline.ops.sources", "def f():\n    from snapcache.adapters.torch import x\n"),
    ("snapcache.pipeline.plan", "x = ds._op\n"),
    ("snapcache.store.writer", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    import torch\n"),
    ("snapcache.store.writer", "from snapcache.machine import available_cpus\n"),
    ("snapcache.store.options", "from snapcache.storefront import x\n"),
    ("snapcache.store.protocol.records", "storage.create_exclusive(name, data)\n"),
    ("snapcache.store.fs", "def write_atomic(self, rel, data):\n    pass\n"),
    ("snapcache.store.indexed_file", "storage.write_atomic(pages, table, durable=False)\n"),
])
def test_the_checker_allows_what_the_rules_allow(name, source):
    assert violations(name, source) == []
