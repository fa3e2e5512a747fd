"""Writing an example of N bytes needs at most about 2N (the example and the writer's copy)
plus the shard buffer. Peak RSS is measured in a child process; no timing is involved."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).parent.parent.parent
N = 200 << 20

CHILD = """
import json, resource, sys, tempfile
import numpy as np
import snapcache as sc

N, codec, small_first = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def example(i):
    if i < small_first:
        return {"x": np.full(1000, i, np.uint8)}
    return {"x": np.full(N, 7, np.uint8)}

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

with tempfile.TemporaryDirectory() as root:
    warm = sc.Dataset.range(3).map(lambda i: {"x": np.full(1000, i, np.uint8)})
    list(warm.snapshot(root, compression=codec, progress=False))   # libraries loaded, warm
    before = peak()
    ds = sc.Dataset.range(small_first + 1).map(example).snapshot(root, compression=codec,
                                                                  progress=False)
    sizes = [int(e["x"].nbytes) for e in ds]
    after = peak()
    again = [int(e["x"].nbytes) for e in ds]                       # reads back
print(json.dumps({"before": before, "after": after, "sizes": sizes, "again": again}))
"""


@pytest.mark.parametrize("codec,small_first", [("none", 0), ("zstd", 0), ("zstd", 3)])
def test_writing_a_huge_example_needs_about_twice_its_size(codec, small_first):
    out = subprocess.run([sys.executable, "-c", CHILD, str(N), codec, str(small_first)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["sizes"] == result["again"] == [1000] * small_first + [N]
    extra = result["after"] - result["before"]
    # the example (N) + the writer's copy (N); the compressed shard buffer of this example is
    # small; 0.25 N of slack for allocator rounding and the read-back path
    assert extra <= 2.25 * N, f"writing {N >> 20} MB peaked {extra / N:.2f} N above baseline"
