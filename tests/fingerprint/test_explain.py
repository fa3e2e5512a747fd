"""diff_trees and closeness on trees built the way the pipeline builds them."""

from __future__ import annotations

import textwrap

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcache.fingerprint import FingerprintNode, diff_trees, hash_function, hash_value
from snapcache.fingerprint.explain import closeness
from snapcache.fingerprint.sources import hash_range_source
from snapcache.fingerprint.tree import (FINGERPRINT_VERSION, combine, leaf, pipeline_root,
                                        version_node)


def user_functions(size=224, helper_factor=2, op="+"):
    src = f"""
    SIZE = {size}

    def normalize(x):
        return x * {helper_factor}

    def decode_and_resize(x):
        return x[:SIZE]

    def f(x):
        return normalize(x) {op} 1

    def keep(x):
        return len(x) > 0
    """
    ns = {"__name__": "fp_explain_fixture", "np": np}
    exec(textwrap.dedent(src), ns)
    return ns


def op(kind, number, fn, **params):
    name = fn.__name__
    label = f"{kind} #{number} `{name}`"
    children = [hash_value(v, f"argument `{k}`", where=label) for k, v in sorted(params.items())]
    children.append(hash_function(fn, f"function `{name}`", where=label))
    return combine(label, children, kind=f"op:{kind}")


def pipeline(ns, *, extra_ops=(), stop=100):
    ops = [hash_range_source(0, stop, 1),
           op("map", 1, ns["f"]),
           op("map", 2, ns["decode_and_resize"]),
           *extra_ops]
    return pipeline_root(ops)


def test_identical_trees_have_no_lines():
    assert diff_trees(pipeline(user_functions()), pipeline(user_functions())) == []


def test_global_changed_with_values():
    old, new = pipeline(user_functions(size=224)), pipeline(user_functions(size=256))
    assert diff_trees(old, new) == [
        "map #2 `decode_and_resize`: global `SIZE` changed (224 -> 256)"]


def test_bytecode_changed():
    old, new = pipeline(user_functions(op="+")), pipeline(user_functions(op="-"))
    assert diff_trees(old, new) == ["map #1 `f`: bytecode changed"]


def test_helper_changed_is_a_nested_path():
    old, new = pipeline(user_functions(helper_factor=2)), pipeline(user_functions(helper_factor=3))
    assert diff_trees(old, new) == ["map #1 `f`: helper `normalize` changed: constants changed"]


def test_op_added_and_removed():
    ns = user_functions()
    old, new = pipeline(ns), pipeline(ns, extra_ops=[op("filter", 3, ns["keep"])])
    assert diff_trees(old, new) == ["op #3 added: filter `keep`"]
    assert diff_trees(new, old) == ["op #3 removed: filter `keep`"]


def test_op_inserted_in_the_middle_keeps_the_rest_paired():
    ns = user_functions()
    old = pipeline_root([hash_range_source(0, 9, 1), op("map", 1, ns["f"])])
    new = pipeline_root([hash_range_source(0, 9, 1), op("filter", 1, ns["keep"]),
                         op("map", 2, ns["f"])])
    assert diff_trees(old, new) == ["op #1 added: filter `keep`"]


def test_source_changed():
    ns = user_functions()
    assert diff_trees(pipeline(ns, stop=100), pipeline(ns, stop=200)) == [
        "source changed (range(0, 100, 1) -> range(0, 200, 1))"]


def test_argument_and_dict_key_changes():
    ns = user_functions()
    old = pipeline_root([op("map", 1, ns["f"], cfg={"size": 224, "flip": True})])
    new = pipeline_root([op("map", 1, ns["f"], cfg={"size": 256, "flip": True})])
    assert diff_trees(old, new) == ["map #1 `f`: argument `cfg` changed: key `size` changed "
                                    "(224 -> 256)"]


def test_sources_wrapped_in_a_source_op_like_the_pipeline_does(tmp_path):
    from snapcache.fingerprint.sources import (hash_files_source, hash_generator_source,
                                               hash_iterable_source)

    from snapcache.store.source_files import file_identity

    def files_node(paths):
        return hash_files_source([file_identity(p) for p in paths])

    def wrapped(node):
        return pipeline_root([combine("source", [node], kind="op:source", summary="source")])
    paths = []
    for name in "abcd":
        (tmp_path / name).write_bytes(b"x")
        paths.append(str(tmp_path / name))
    assert diff_trees(wrapped(files_node(paths[:2])), wrapped(files_node(paths))) \
        == ["source: 2 files added"]
    assert diff_trees(wrapped(hash_iterable_source([1, 2], label="items")),
                      wrapped(hash_iterable_source([1, 2, 3], label="items"))) == [
        "source: items changed (2 items -> 3 items)"]
    assert diff_trees(wrapped(hash_range_source(0, 5, 1)), wrapped(hash_range_source(0, 6, 1))) \
        == ["source changed (range(0, 5, 1) -> range(0, 6, 1))"]

    def gen(n):
        yield from range(n)
    assert diff_trees(wrapped(hash_generator_source(gen, (3,), {})),
                      wrapped(hash_generator_source(gen, (4,), {}))) == [
        "source: argument #0 changed (3 -> 4)"]


def test_fingerprint_version_changed():
    ops = [hash_range_source(0, 3, 1)]
    old = pipeline_root(ops)
    new = combine("pipeline", [version_node(FINGERPRINT_VERSION + 1), *ops], kind="pipeline")
    assert diff_trees(old, new) == [
        f"fingerprint version changed ({FINGERPRINT_VERSION} -> {FINGERPRINT_VERSION + 1})"]


def test_function_renamed_in_an_op():
    ns = user_functions()
    g = ns["f"]
    old = pipeline_root([combine("map #1 `f`", [hash_function(g, "function `f`")])])
    new = pipeline_root([combine("map #1 `g`", [hash_function(g, "function `g`")])])
    assert diff_trees(old, new) == ["map #1 `g` (was map #1 `f`): function `f` renamed to "
                                    "function `g`"]


def test_global_added():
    a = leaf("bytecode", "bytecode", b"1")
    old = combine("map #1 `f`", [a])
    new = combine("map #1 `f`", [a, hash_value(3, "global `N`")])
    assert diff_trees(old, new) == ["map #1 `f`: global `N` added (3)"]


def test_closeness():
    ns = user_functions()
    a = pipeline(ns)
    assert closeness(a, a) == 1.0
    near = pipeline(user_functions(size=256))
    far = pipeline(user_functions(size=256, helper_factor=5, op="-"), stop=7)
    assert 1.0 > closeness(a, near) > closeness(a, far) > 0.0
    assert closeness(leaf("x", "k", b"1"), leaf("x", "k", b"2")) == 0.0


labels = st.sampled_from(["a", "b", "global `X`", "file `f`", "function `g`", "map #1 `f`",
                          "fingerprint version", "pipeline"])
trees = st.recursive(
    st.builds(lambda lab, d, s: FingerprintNode(lab, d, s), labels,
              st.sampled_from(["0" * 32, "1" * 32]), st.sampled_from(["", "1", "2"])),
    lambda kids: st.builds(lambda lab, d, ch: FingerprintNode(lab, d, "", tuple(ch)), labels,
                           st.sampled_from(["2" * 32, "3" * 32, "4" * 32]),
                           st.lists(kids, max_size=4)),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(trees, trees)
def test_never_crashes_on_trees_of_any_shape(old, new):
    lines = diff_trees(old, new)
    assert isinstance(lines, list) and all(isinstance(x, str) for x in lines)
    assert (lines == []) == (old.digest == new.digest)
    assert 0.0 <= closeness(old, new) <= 1.0
    assert FingerprintNode.from_json(old.to_json()) == old
