"""Writing a snapshot builds Arrow arrays from buffers: ``pa.array`` imports pandas on its first
call, which costs every writing epoch about a second before its first shard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_writing_epoch_does_not_import_pandas(tmp_path):
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import snapcache as sc

        def example(i):
            return {"t": np.arange(i % 5, dtype=np.int32), "img": np.full((2, 3), i, np.uint8),
                    "b": bool(i % 2), "s": "x" * i + "\\u00e9", "by": b"y" * (i % 3),
                    "f": float(i), "i": i, "c": np.complex64(i), "mask": np.array([True, i % 3 == 0])}

        ds = sc.Dataset.range(50).map(example).snapshot(sys.argv[1], progress=False)
        assert sum(1 for _ in ds) == 50
        print("pandas" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_reading_epochs_do_not_import_numpy_ma(tmp_path):
    """``np.unique`` imports ``numpy.ma`` on its first call (~30 ms, paid by the first epoch a
    process reads): the read path finds a piece's blocks without it, with or without a
    shuffle window."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import snapcache as sc

        ds = sc.Dataset.range(3000).map(lambda i: {"x": np.full(4, i, np.int32)}).snapshot(
            sys.argv[1], progress=False)
        assert sum(1 for _ in ds) == 3000
        assert "numpy.ma" not in sys.modules
        for epoch in (ds.batch(256), ds.shuffle(1000, seed=1).batch(256), ds):
            assert sum(np.reshape(b["x"], (-1, 4)).shape[0] for b in epoch) == 3000
        print("numpy.ma" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
