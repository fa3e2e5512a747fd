"""Say why two fingerprint trees differ, in words.

:func:`diff_trees` walks an old and a new tree side by side, pairing children by label, and
returns one line per difference::

    map #2 `decode_and_resize`: global `SIZE` changed (224 -> 256)
    map #3 `f`: helper `normalize` changed: bytecode changed
    source: 3 files added

:func:`closeness` scores how much two trees share, to pick the nearest existing snapshot when
explaining a cache miss; :func:`describe` makes the short value summaries shown in parentheses.
"""

from __future__ import annotations

import difflib
import enum
import pathlib
import re
import types
from collections import Counter
from typing import Any, Sequence

import numpy as np

from snapcache.fingerprint.tree import VERSION_LABEL, FingerprintNode, shorten

__all__ = ["diff_trees", "closeness", "describe"]

_MAX_LINES = 10  # per group of changed siblings; the rest are counted
_NUMBER = re.compile(r" #(\d+)")


def diff_trees(old: FingerprintNode, new: FingerprintNode) -> list[str]:
    """Human lines describing why ``new`` differs from ``old``; ``[]`` when they are equal.

    >>> from snapcache.fingerprint.tree import leaf, combine
    >>> a = combine("map #1 `f`", [leaf("global `N`", "value", b"1", "1")])
    >>> b = combine("map #1 `f`", [leaf("global `N`", "value", b"2", "2")])
    >>> diff_trees(a, b)
    ['map #1 `f`: global `N` changed (1 -> 2)']
    """
    if old.digest == new.digest:
        return []
    if old.label == new.label == "pipeline":
        old_version, new_version = _version(old), _version(new)
        if old_version != new_version:
            return [f"fingerprint version changed ({old_version} -> {new_version})"]
        lines = _diff_ops(_ops(old), _ops(new))
    else:
        element = new.label if old.label == new.label else f"{new.label} (was {old.label})"
        lines = _diff_node(old, new, [element])
    return lines or [f"{new.label} changed"]  # e.g. ops reordered with equal labels


def closeness(old: FingerprintNode, new: FingerprintNode) -> float:
    """The share of leaf digests two trees have in common, from 0.0 to 1.0."""
    a = Counter(n.digest for n in old.leaves())
    b = Counter(n.digest for n in new.leaves())
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 1.0


# -- pipelines ---------------------------------------------------------------------------------

def _version(root: FingerprintNode) -> str | None:
    return next((c.summary for c in root.children if c.label == VERSION_LABEL), None)


def _ops(root: FingerprintNode) -> list[FingerprintNode]:
    return [c for c in root.children if c.label != VERSION_LABEL]


def _op_key(label: str) -> str:
    return _NUMBER.sub("", label)


def _op_number(label: str, fallback: int) -> int:
    match = _NUMBER.search(label)
    return int(match.group(1)) if match else fallback


def _diff_ops(old: list[FingerprintNode], new: list[FingerprintNode]) -> list[str]:
    lines: list[str] = []
    matcher = difflib.SequenceMatcher(None, [_op_key(o.label) for o in old],
                                      [_op_key(n.label) for n in new], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for o, n in zip(old[i1:i2], new[j1:j2]):
                if o.digest != n.digest:
                    element = n.label if o.label == n.label else f"{n.label} (was {o.label})"
                    lines += _diff_node(o, n, [element])
            continue
        lines += [f"op #{_op_number(o.label, i)} removed: {_op_key(o.label)}"
                  for i, o in enumerate(old[i1:i2], i1)]
        lines += [f"op #{_op_number(n.label, j)} added: {_op_key(n.label)}"
                  for j, n in enumerate(new[j1:j2], j1)]
    return lines


# -- any node ----------------------------------------------------------------------------------

def _transparent(node: FingerprintNode, path: list[str]) -> bool:
    """Nodes the path already names: an op's function, a child labelled like its parent."""
    label = node.label
    return label == "function" or label.startswith("function `") or label == path[-1]


def _values(old: FingerprintNode, new: FingerprintNode) -> str:
    if old.summary and new.summary and old.summary != new.summary:
        return f" ({old.summary} -> {new.summary})"
    return ""


def _render(path: list[str], tail: str) -> str:
    """``op: a changed: b changed: tail``: the first element (an op, the root) names a place."""
    return ": ".join(path[:1] + [f"{p} changed" for p in path[1:]] + [tail])


def _diff_node(old: FingerprintNode, new: FingerprintNode, path: list[str]) -> list[str]:
    """Lines for two paired nodes with different digests; ``path`` ends with their label."""
    if old.children and new.children:
        lines = _diff_children(old.children, new.children, path)
        if lines:
            return lines
        if [c.label for c in old.children] != [c.label for c in new.children]:
            return [_render(path, "order changed")]
    return [_render(path[:-1], f"{path[-1]} changed{_values(old, new)}")]


def _diff_child(old: FingerprintNode, new: FingerprintNode, path: list[str]) -> list[str]:
    if path and _transparent(new, path):
        return _diff_node(old, new, path)
    return _diff_node(old, new, path + [new.label])


def _keyed(children: Sequence[FingerprintNode]) -> dict[tuple[str, int], FingerprintNode]:
    seen: Counter[str] = Counter()
    keyed = {}
    for child in children:
        keyed[(child.label, seen[child.label])] = child
        seen[child.label] += 1
    return keyed


def _word(node: FingerprintNode) -> str:
    return node.label.split(" ", 1)[0]


def _diff_children(olds: Sequence[FingerprintNode], news: Sequence[FingerprintNode],
                   path: list[str]) -> list[str]:
    old_keyed, new_keyed = _keyed(olds), _keyed(news)
    removed = [o for k, o in old_keyed.items() if k not in new_keyed]
    added = [n for k, n in new_keyed.items() if k not in old_keyed]
    pairs = [(old_keyed[k], n) for k, n in new_keyed.items() if k in old_keyed]
    if len(removed) == len(added) == 1 and _word(removed[0]) == _word(added[0]) != "file":
        pairs.append((removed[0], added[0]))  # one child renamed, e.g. the function of an op
        removed, added = [], []
    changed = []
    for o, n in pairs:
        if o.digest != n.digest:
            changed += _diff_child(o, n, path)
        elif o.label != n.label:
            changed.append(_render(path, f"{o.label} renamed to {n.label}"))
    if len(changed) > _MAX_LINES:
        changed[_MAX_LINES:] = [_render(path, f"{len(changed) - _MAX_LINES} more changes")]
    return _group(removed, "removed", path) + _group(added, "added", path) + changed


def _group(nodes: list[FingerprintNode], verb: str, path: list[str]) -> list[str]:
    """``3 files added`` for files and long lists, ``global `N` added (3)`` otherwise."""
    by_word: dict[str, list[FingerprintNode]] = {}
    for n in nodes:
        by_word.setdefault(_word(n), []).append(n)
    lines = []
    for word, group in by_word.items():
        if word == "file" or len(group) > 5:
            noun = word + "s" * (len(group) != 1)
            lines.append(_render(path, f"{len(group)} {noun} {verb}"))
        else:
            lines += [_render(path, f"{n.label} {verb}" + (f" ({n.summary})" if n.summary else ""))
                      for n in group]
    return lines


# -- summaries ---------------------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _is_simple(v: Any, depth: int = 0) -> bool:
    if type(v) in _SCALARS:
        return True
    if type(v) in (list, tuple, set, frozenset) and depth < 3 and len(v) <= 8:
        return all(_is_simple(x, depth + 1) for x in v)
    if type(v) is dict and depth < 3 and len(v) <= 8:
        return all(_is_simple(k, depth + 1) and _is_simple(x, depth + 1) for k, x in v.items())
    return False


def describe(v: Any) -> str:
    """A short, address-free description of ``v`` for explanations: ``224``, ``float32[3, 4]``."""
    if _is_simple(v):
        return shorten(repr(v))
    if isinstance(v, np.ndarray):
        return shorten(f"{v.dtype}[{', '.join(map(str, v.shape))}]")
    if isinstance(v, np.generic):
        return shorten(f"{v.dtype}({v.item()!r})")
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        return f"{type(v).__name__} of {len(v)}"
    if isinstance(v, enum.Enum):
        return shorten(f"{type(v).__qualname__}.{v.name}")
    if isinstance(v, (range, slice, pathlib.PurePath)):
        return shorten(str(v))
    if isinstance(v, types.ModuleType):
        return shorten(f"<module {v.__name__}>")
    if isinstance(v, type):
        return shorten(f"<class {v.__qualname__}>")
    name = getattr(getattr(v, "func", v), "__qualname__", None)  # functions, partials, ufuncs
    if callable(v) and isinstance(name, str):
        return shorten(f"<function {name}>")
    return shorten(f"<{type(v).__qualname__} object>")
