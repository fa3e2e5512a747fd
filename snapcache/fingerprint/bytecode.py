"""Reading code: what a code object computes and reads, from its bytecode.

:func:`code_info` analyses a code object once (cached by identity: code is immutable): the
digests of its bytecode and of its constants, nested code included, the globals it reads, and
its attribute chains (``np.random.rand``, through a global or a name the code imports itself)
with the number of arguments each is called with right there. :func:`module_reads` resolves
what those chains read out of user modules, importing them as the code would when it runs.

Both :mod:`snapcache.fingerprint.functions` (what a function computes) and
:mod:`snapcache.fingerprint.randomness` (what it draws at random) are made from this one
analysis. Requires the bytecode of one Python minor version.
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import inspect
import types
import weakref
from dataclasses import dataclass
from typing import Any

import xxhash

from snapcache.fingerprint import canonical
from snapcache.fingerprint.origin import is_library_path, is_user_module
from snapcache.fingerprint.tree import Walk

__all__ = ["ATTR_LOADS", "GLOBAL_LOADS", "LOCAL_LOADS", "NOT_IMPORTABLE", "CodeInfo",
           "code_info", "module_reads"]

GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})
ATTR_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK", "LOAD_CLOSURE"})
_HASCONST = frozenset(dis.hasconst)
# Code flags that change what runs (varargs, generator, coroutine, ...); not CO_NESTED (where
# the function was defined) nor the __future__ flags of the file it was written in.
_COMPUTATION_FLAGS = 0x3FF & ~inspect.CO_NESTED


@dataclass(frozen=True)
class CodeInfo:
    """What :func:`code_info` reads off a code object."""

    bytecode: bytes  # digest of instructions, names and shape
    constants: bytes  # digest of constants, nested code by its own digests
    digest: bytes  # both together: how a nested code object enters its parent's constants
    global_names: tuple[str, ...]  # globals read, this code and nested code, in order
    # ("global"|"import", root, attrs, arguments of the call right there: None if not called)
    chains: tuple[tuple[str, str, tuple[str, ...], int | None], ...]


_CODE_INFO: dict[int, tuple[weakref.ref, CodeInfo]] = {}


def code_info(code: types.CodeType) -> CodeInfo:
    """The analysis of ``code``, made once and kept while ``code`` lives."""
    cached = _CODE_INFO.get(id(code))
    if cached is not None and cached[0]() is code:
        return cached[1]
    info = _analyse(code)
    key = id(code)
    _CODE_INFO[key] = (weakref.ref(code, lambda _, k=key: _CODE_INFO.pop(k, None)), info)
    return info


def _analyse(code: types.CodeType) -> CodeInfo:
    instructions = list(dis.get_instructions(code))
    nested = [code_info(c) for c in code.co_consts if isinstance(c, types.CodeType)]
    h = xxhash.xxh3_128()
    h.update(code.co_code)
    h.update(b"\0" + getattr(code, "co_exceptiontable", b""))
    shape = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_nlocals,
             len(code.co_varnames), len(code.co_freevars), len(code.co_cellvars),
             code.co_flags & _COMPUTATION_FLAGS)
    h.update(repr(shape).encode() + "\0".join(code.co_names).encode())
    bytecode = h.digest()
    consts = list(code.co_consts)
    loads_first = any(i.opcode in _HASCONST and i.arg == 0 for i in instructions)
    if consts and isinstance(consts[0], str) and not loads_first:
        consts[0] = None  # the docstring: never read by the code
    h = xxhash.xxh3_128()
    walk = Walk()
    for c in consts:
        if isinstance(c, types.CodeType):
            h.update(b"C" + code_info(c).digest)
        else:
            canonical.feed_value(h, c, walk)
    constants = h.digest()
    # A global the code assigns (``global CALLS; CALLS += 1``) is state the function keeps, not
    # configuration of what it computes: hashing it would change the fingerprint every epoch.
    stored = {i.argval for i in instructions if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")}
    names = [i.argval for i in instructions if i.opname in GLOBAL_LOADS]
    names += [n for info in nested for n in info.global_names]
    names = [n for n in names if n not in stored]
    chains, imported = _attribute_chains(instructions)
    chains += [c for info in nested for c in info.chains] + _inherited_chains(code, imported)
    return CodeInfo(bytecode, constants, xxhash.xxh3_128(bytecode + constants).digest(),
                     tuple(dict.fromkeys(names)), tuple(dict.fromkeys(chains)))


def _attribute_chains(instructions: list[dis.Instruction], inherited: dict[str, str] | None = None
                      ) -> tuple[list[tuple[str, str, tuple, int | None]], dict[str, str]]:
    """Dotted reads like ``np.random.rand``: a global or locally imported name, then attributes,
    with the number of arguments it is called with right there (see :func:`_call_arguments`);
    and the names the code imports (local name -> module path).

    A name imported inside the code (``import helpers``, ``from helpers import scale``,
    ``from . import sibling``) is a chain of kind "import" whose root is the dotted path it was
    imported by, with a leading dot per level of a relative import (``.sibling``).
    ``inherited``: names an enclosing function imported, read here through closure cells."""
    chains: list[tuple[str, str, tuple, int | None]] = []
    imported: dict[str, str] = dict(inherited or {})  # local name -> module path
    current: tuple[str, str, list[str]] | None = None
    pending = pending_from = None
    fromlist: Any = None
    for k, ins in enumerate(instructions):
        op = ins.opname
        if current is not None and op in ATTR_LOADS:
            current[2].append(ins.argval)
            continue
        if current is not None:
            args = _call_arguments(instructions, k)
            chains.append((current[0], current[1], tuple(current[2]), args))
            current = None
        if op in GLOBAL_LOADS:
            current = ("global", ins.argval, [])
        elif op in LOCAL_LOADS and ins.argval in imported:
            current = ("import", imported[ins.argval], [])
        elif op == "IMPORT_NAME":  # after LOAD_CONST level, LOAD_CONST fromlist
            level, fromlist = (instructions[k - 2].argval, instructions[k - 1].argval) \
                if k >= 2 else (0, None)
            pending = "." * (level if isinstance(level, int) else 0) + ins.argval
            pending_from = None
        elif op == "IMPORT_FROM" and pending:
            if fromlist is None:  # ``import a.b as c``: IMPORT_FROM b binds the module a.b
                pending_from = pending
            else:
                pending_from = pending + ("" if pending.endswith(".") else ".") + ins.argval
        elif op.startswith("STORE_") and pending:
            if pending_from:
                imported[ins.argval], pending_from = pending_from, None
            else:
                top = pending.partition(".")[0]
                imported[ins.argval] = top if ins.argval == top else pending
                pending = None
        elif op == "POP_TOP" and pending_from and fromlist is None:
            pass  # ``import a.b.c as d``: IMPORT_FROM b, SWAP, POP_TOP, IMPORT_FROM c, STORE d
        elif op not in ("SWAP", "ROT_TWO"):
            pending = pending_from = None
    if current is not None:
        chains.append((current[0], current[1], tuple(current[2]), None))
    return chains, imported


def _inherited_chains(code: types.CodeType, imported: dict[str, str]
                      ) -> list[tuple[str, str, tuple, int | None]]:
    """The reads nested code (a comprehension, a lambda, an inner function) makes, through its
    closure cells, of names ``code`` imported: ``import helpers`` then
    ``[helpers.scale(v) for v in x]``."""
    found: list[tuple[str, str, tuple, int | None]] = []
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        inherit = {name: imported[name] for name in const.co_freevars if name in imported}
        if inherit:
            chains, inner = _attribute_chains(list(dis.get_instructions(const)), inherit)
            found += [c for c in chains if c[0] == "import"]
            found += _inherited_chains(const, inner)
    return found


_CALLS = frozenset({"PRECALL", "CALL", "CALL_KW"})  # PRECALL: 3.11; CALL_KW: 3.13
_JUMPS = frozenset(getattr(dis, "hasjump", dis.hasjrel + dis.hasjabs))


def _call_arguments(instructions: list[dis.Instruction], start: int) -> int | None:
    """How many arguments the value loaded just before ``instructions[start]`` is called with
    (a lone ``None`` counts as none: ``default_rng(None)`` is ``default_rng()``); None when it
    is not called there, or when the bytecode does not say (``f(*args)``, a branch among the
    arguments).

    The stack is followed from the load: the call that takes the value finds exactly its own
    arguments above it, while a call made among the arguments finds its callable as well."""
    depth = 0
    for k in range(start, len(instructions)):
        ins = instructions[k]
        if ins.opname in _CALLS and depth == ins.arg + (ins.opname == "CALL_KW"):
            args = [i for i in instructions[start:k] if i.opname != "KW_NAMES"]
            if ins.opname == "CALL_KW":
                args = args[:-1]  # the tuple of keyword names
            if len(args) == 1 and args[0].opname == "LOAD_CONST" and args[0].argval is None:
                return 0
            return ins.arg
        if ins.opcode in _JUMPS:
            return None
        try:
            depth += dis.stack_effect(ins.opcode,
                                      ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None)
        except ValueError:
            return None
        if depth < 0:  # taken by something else than a call
            return None
    return None


# -- what code reads from user modules ---------------------------------------------------------

NOT_IMPORTABLE = object()
"""What :func:`module_reads` gives for a path the code imports that cannot be imported here."""


def module_reads(fn: types.FunctionType, info: CodeInfo) -> list[tuple[str, Any]]:
    """(dotted path, value) of what the code reads out of user modules: ``utils.resize`` through
    a global module, and the names it imports itself, resolved by importing the user module as
    the code would when it runs (a snapshot that exists is read without running it, so its
    helpers must be known beforehand). Library modules are never imported here."""
    out: dict[str, Any] = {}
    for kind, root, attrs, _ in info.chains:
        if kind == "global":
            value, path = fn.__globals__.get(root), root
            if not isinstance(value, types.ModuleType):
                continue
        else:
            path = _absolute(root, fn.__globals__)
            if path is None or is_library_path(path):
                continue
            value = _import_path(path)
            if value is NOT_IMPORTABLE:
                out.setdefault(path, value)
                continue
        for attr in attrs:
            if not (isinstance(value, types.ModuleType) and is_user_module(value.__name__)):
                break
            value, path = getattr(value, attr, None), f"{path}.{attr}"
            if value is None and kind == "import":  # ``import a.b`` then ``a.b.f``
                value = _import_path(path)
                if value is NOT_IMPORTABLE:
                    value = None
        if value is not None and not isinstance(value, types.ModuleType):
            out.setdefault(path, value)
    return list(out.items())


def _absolute(path: str, namespace: dict) -> str | None:
    """The absolute module path of an import inside code whose module globals are ``namespace``
    (``.sibling`` in package ``pkg``: ``pkg.sibling``); None if it cannot be resolved."""
    if not path.startswith("."):
        return path
    package = namespace.get("__package__")
    if package is None:
        name = namespace.get("__name__") or ""
        package = name if "__path__" in namespace else name.rpartition(".")[0]
    try:
        return importlib.util.resolve_name(path, package)
    except (ImportError, ValueError):
        return None



def _import_path(path: str) -> Any:
    """What ``from a.b import c`` would bind for ``a.b.c`` (an attribute, else a submodule)."""
    parts = path.split(".")
    try:
        value = importlib.import_module(parts[0])
        for i, attr in enumerate(parts[1:], 2):
            nxt = getattr(value, attr, NOT_IMPORTABLE)
            if nxt is NOT_IMPORTABLE and isinstance(value, types.ModuleType):
                nxt = importlib.import_module(".".join(parts[:i]))
            value = nxt
    except Exception:  # not importable here: the code would fail the same way when it runs
        return NOT_IMPORTABLE
    return value
