"""numpy/JAX iterator, and the frameworks staying optional."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

import snapcache as sc


def test_as_numpy_iterator_gives_dicts_of_numpy_arrays(root):
    ds = sc.Dataset.range(10).map(lambda i: {"x": np.full(2, i, np.float32), "y": i,
                                             "name": f"n{i}"}).snapshot(root, progress=False)
    batches = list(ds.batch(4).as_numpy_iterator())
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(isinstance(b["x"], np.ndarray) and b["x"].dtype == np.float32 for b in batches)
    examples = list(ds.as_numpy_iterator(epoch=0))
    assert isinstance(examples[3]["y"], np.ndarray) and examples[3]["y"].shape == ()
    assert examples[3]["name"] == "n3"
    assert [int(t[0]) for t in sc.Dataset.range(3).map(lambda i: (i, i)).as_numpy_iterator()] \
        == [0, 1, 2]


BLOCKER = textwrap.dedent('''
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "tensorflow"):
                raise ImportError(f"No module named {name!r} (blocked)")

    sys.meta_path.insert(0, Block())
    import snapcache as sc
    assert not any(m.split(".")[0] in ("torch", "tensorflow") for m in sys.modules)
    ds = sc.Dataset.range(3)
    assert list(ds.as_numpy_iterator()) == [0, 1, 2]
    for call in (ds.to_torch, ds.to_tf):
        try:
            call()
        except ImportError as e:
            print(e)
''')


def test_import_works_without_torch_or_tensorflow_and_adapters_say_what_to_install():
    result = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ds.to_torch() needs PyTorch: pip install 'snapcache[torch]'",
        "ds.to_tf() needs TensorFlow: pip install 'snapcache[tf]'",
    ]
