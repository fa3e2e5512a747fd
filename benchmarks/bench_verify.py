"""What verifying every shard's checksum costs on read.

Run: python -m benchmarks.bench_verify [--write-doc]

Writes an uncompressed image-like snapshot (the case where the checksum is the largest share
of the work: nothing to decompress), then reads it back in batches of 256, copied into a
staging buffer, with ``verify=True`` (the default) and ``verify=False``, alternating, each in
a fresh process, best of 3. Reports the ratio.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from benchmarks.report import markers, publish
from benchmarks.workloads import MAKERS, consume, example_bytes, staging

N = 4096
BATCH = 256
START, END = markers("verify-benchmark")


def pipeline(root: str, verify: bool):
    import snapcache as sc

    return sc.Dataset.range(N).map(MAKERS["image"]).snapshot(
        root, compression="none", verify=verify, progress=False)


def child(root: str, verify: bool) -> float:
    stage = staging("image", BATCH)
    ds = pipeline(root, verify).batch(BATCH)
    for batch in ds:  # warm the page cache and the process
        consume(stage, batch)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for batch in ds:
            consume(stage, batch)
        best = min(best, time.perf_counter() - start)
    return N * example_bytes("image") / best / 1e6


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3] == "1")))
        return
    with tempfile.TemporaryDirectory() as root:
        for _ in pipeline(root, True):
            pass
        runs = {True: [], False: []}
        for _ in range(3):
            for verify in (True, False):
                out = subprocess.run([sys.executable, "-m", "benchmarks.bench_verify", "--child",
                                      root, "1" if verify else "0"], check=True,
                                     capture_output=True, text=True).stdout
                runs[verify].append(json.loads(out))
    on, off = max(runs[True]), max(runs[False])
    text = (f"{START}\n## Cost of verifying checksums on read\n\n"
            f"`python -m benchmarks.bench_verify --write-doc`: {N} image-like examples "
            "(uint8 128x128x3 + label, uncompressed, so nothing else dilutes the cost), batches "
            "of 256 copied into a staging buffer, best of 3 fresh processes each.\n\n"
            "| reading | MB/s |\n|---|---|\n"
            f"| verify=False | {off:,.0f} |\n| verify=True (default) | {on:,.0f} |\n\n"
            f"Verifying costs {100 * (1 - on / off):.0f}% of the read throughput here "
            f"(ratio {on / off:.2f}); with compression the share is smaller.\n{END}")
    publish(text, START, END, write="--write-doc" in sys.argv)


if __name__ == "__main__":
    main()
