"""Fingerprint trees: one node per op, per captured value, per file.

A :class:`FingerprintNode` carries a human label ("map #2 `prep`", "global `SIZE`"), a digest and
its children. The digest is an xxh3-128 over the node's kind tag, its own content and, in order,
its children's labels and digests, so a parent's digest changes exactly when something beneath it
changes, and :func:`snapcache.fingerprint.explain.diff_trees` can walk two trees to say what.

A :class:`Walk` is the state of one fingerprinting call (what is being hashed now, to cut
cycles); :class:`Unhashable` is raised inside a walk and becomes a
:class:`~snapcache.errors.FingerprintError` naming where the value was captured.

The digest scheme is pinned by tests. To change it on purpose, bump :data:`FINGERPRINT_VERSION`:
it is mixed into every pipeline root by :func:`pipeline_root`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import xxhash

from snapcache.errors import FingerprintError

__all__ = ["FINGERPRINT_VERSION", "FingerprintNode", "combine", "leaf", "node", "pipeline_root"]

FINGERPRINT_VERSION = 2
"""Mixed into every pipeline fingerprint. Bump it whenever the hashing scheme changes.
2: dicts are hashed in their order (1 sorted them: a reordered dict was a false hit)."""

VERSION_LABEL = "fingerprint version"
"""Label of the child of a pipeline root that carries :data:`FINGERPRINT_VERSION`."""

_DOMAIN = b"snapcache.fingerprint\x00"
_SUMMARY_MAX = 60
_MAX_NODES = 50_000  # functions/objects/classes reachable from one value before giving up


@dataclass(frozen=True)
class FingerprintNode:
    """One node of a fingerprint tree.

    >>> node = leaf("global `SIZE`", "value", b"224", summary="224")
    >>> len(node.digest)
    32
    """

    label: str
    digest: str
    summary: str = ""
    children: tuple["FingerprintNode", ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A plain JSON-able dict, the form stored in snapshot manifests."""
        return {
            "label": self.label,
            "digest": self.digest,
            "summary": self.summary,
            "children": [c.to_json() for c in self.children],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FingerprintNode":
        """Inverse of :meth:`to_json`; tolerates a missing ``summary`` or ``children``."""
        return cls(
            label=str(d["label"]),
            digest=str(d["digest"]),
            summary=str(d.get("summary") or ""),
            children=tuple(cls.from_json(c) for c in d.get("children") or ()),
        )

    def leaves(self) -> list["FingerprintNode"]:
        """The nodes without children, depth first."""
        if not self.children:
            return [self]
        return [n for c in self.children for n in c.leaves()]


def _frame(h: "xxhash.xxh3_128", data: bytes) -> None:
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def node_digest(kind: str, payload: bytes, children: Sequence[FingerprintNode] = ()) -> str:
    """The digest of a node: kind tag, own content, then children's labels and digests."""
    h = xxhash.xxh3_128()
    h.update(_DOMAIN)
    _frame(h, kind.encode())
    _frame(h, payload)
    h.update(len(children).to_bytes(8, "little"))
    for child in children:
        _frame(h, child.label.encode("utf-8", "surrogatepass"))
        h.update(bytes.fromhex(child.digest))
    return h.hexdigest()


def shorten(text: str, limit: int = _SUMMARY_MAX) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def node(label: str, kind: str, payload: bytes = b"", children: Sequence[FingerprintNode] = (),
         summary: str = "") -> FingerprintNode:
    """The general constructor: a node whose digest covers kind, payload and children."""
    children = tuple(children)
    return FingerprintNode(label, node_digest(kind, payload, children), shorten(summary), children)


def leaf(label: str, kind: str, payload: bytes, summary: str = "") -> FingerprintNode:
    """A node without children whose digest covers ``kind`` and ``payload``."""
    return FingerprintNode(label, node_digest(kind, payload), shorten(summary))


def combine(label: str, children: Sequence[FingerprintNode], *, kind: str = "node",
            summary: str = "") -> FingerprintNode:
    """A node whose digest covers ``kind`` and its children's labels and digests, in order."""
    return node(label, kind, b"", children, summary)


def version_node(version: int = FINGERPRINT_VERSION) -> FingerprintNode:
    """The child of a pipeline root that records the fingerprint scheme's version."""
    return leaf(VERSION_LABEL, "version", str(version).encode(), summary=str(version))


def pipeline_root(op_nodes: Sequence[FingerprintNode]) -> FingerprintNode:
    """The root of a pipeline's tree: the version node, then the op nodes in order.

    Its ``digest`` (32 hex characters) names the snapshot folder.
    """
    return combine("pipeline", [version_node(), *op_nodes], kind="pipeline",
                   summary=f"{len(op_nodes)} ops")


# -- the walk that builds trees ----------------------------------------------------------------

class Unhashable(Exception):
    """Raised inside a walk; turned into a FingerprintError at the public boundary."""

    def __init__(self, value: Any, reason: str = "") -> None:
        super().__init__(reason)
        self.type_name = type_name(type(value))
        self.reason = reason
        self.path: list[str] = []  # innermost first, appended while unwinding
        self.holder = ""  # the outermost library object the value is in (see inside())
        self.inner = 0  # how many entries of path lie inside that object
        self.to_register = self.type_name

    def inside(self, holder: type, *, internals: bool) -> None:
        """The value is in an object of the library type ``holder``, which the user holds
        (called while unwinding, so the message names the outermost one). ``internals``: the
        path runs through the object's attributes, the library's internals, so ``holder`` is
        the type to register (a DataFrame, not a weakref inside it); otherwise it runs through
        snapcache's form of the object's content (a column's items, an OrderedDict's values),
        a path not worth showing, and the value's own type is the one to register."""
        if internals:
            self.to_register = type_name(holder)
        else:
            del self.path[:]
        self.holder = type_name(holder)
        self.inner = len(self.path)

    def to_error(self, label: str, where: str) -> FingerprintError:
        chain = " of ".join([*self.path[self.inner:], label] + ([where] if where else []))
        subject = f"object of type `{self.type_name}`"
        if self.holder and (self.inner or self.holder != self.type_name):
            inner = f" ({' of '.join(self.path[:self.inner])})" if self.inner else ""
            subject += f"{inner} inside the `{self.holder}`"
        reason = f"{self.reason} " if self.reason else ""
        return FingerprintError(
            f"A captured value cannot be fingerprinted: {subject} captured as {chain}. "
            f"{reason}Teach snapcache how with "
            f"snapcache.fingerprint.register({self.to_register}, fn), or name the version "
            f'yourself with snapshot(path, key="my-version-1").')


class Walk:
    """The state of one fingerprinting call: what is being hashed now, to cut cycles.

    A value met again while it is still being hashed becomes a back-reference to its distance
    up the stack. Nodes of functions, classes and objects are memoized for the call when their
    subtree has no back-reference above them (so the memoized digest does not depend on where
    they were reached).
    """

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.index: dict[int, int] = {}
        self.floor = math.inf  # lowest stack index a back-reference in the current subtree hit
        self.memo: dict[int, tuple[Any, FingerprintNode]] = {}  # holds obj: its id stays unique
        self.built = 0

    def enter(self, obj: Any) -> int | None:
        """Push ``obj``; if it is already on the stack return the back-reference distance."""
        i = self.index.get(id(obj))
        if i is not None:
            self.floor = min(self.floor, i)
            return len(self.stack) - i
        self.index[id(obj)] = len(self.stack)
        self.stack.append(obj)
        return None

    def leave(self, obj: Any) -> None:
        self.stack.pop()
        del self.index[id(obj)]

    def guarded(self, obj: Any, label: str,
                build: Callable[[], FingerprintNode]) -> FingerprintNode:
        """``build()`` the node of ``obj`` once per call, cutting cycles through it."""
        known = self.memo.get(id(obj))
        if known is not None:
            return dataclasses.replace(known[1], label=label)
        depth = len(self.stack)
        distance = self.enter(obj)
        if distance is not None:
            return leaf(label, "backref", distance.to_bytes(8, "little"), "<cycle>")
        self.built += 1
        if self.built > _MAX_NODES:
            raise Unhashable(obj, f"More than {_MAX_NODES} functions and objects are reachable "
                                  "from it, too many to fingerprint.")
        saved, self.floor = self.floor, math.inf
        try:
            result = build()
        finally:
            self.leave(obj)
            mine, self.floor = self.floor, min(saved, self.floor)
        if mine >= depth:
            self.memo[id(obj)] = (obj, result)
        return result


def type_name(t: type) -> str:
    """``module.QualName`` of a class, as users import it."""
    module = getattr(t, "__module__", None)
    qualname = getattr(t, "__qualname__", t.__name__)
    return qualname if module in (None, "builtins") else f"{module}.{qualname}"
