"""The first batch of a fresh process reading a snapshot on S3, each request delayed as a
distant server's would be: the requests before the first shard overlapped (this code) against
made in a row (the same code with the overlap switched off, in the same run).

    python -m benchmarks.bench_first_batch [--scale 1.0] [--runs 7] [--write-doc]

The snapshots are built straight on the loopback moto server; the reading processes reach it
through ``benchmarks/latency_proxy.py``, which holds each request for the given time (the
answers pass at once). A fresh process reads its manifest (one GET), takes its read lease (a
PUT), records the use (a PUT) and checks that no purge removed the snapshot meanwhile (a HEAD),
then gets its first shard. Overlapped, the shard's GET goes out beside the lease's requests, its
body taken as it streams in (each record batch is decoded as soon as it has arrived, not once
the whole shard is in), and the last-use PUT beside the HEAD
(``EarlyFetches.start``,
``snapshot_exec._hold``); in a row, each waits for the one before (``EarlyFetches.start`` a no-op and
``_hold``'s two requests one after the other), and the first batch waits for its whole shard. Each process is timed from building the
pipeline object (after its imports) to its first batch and to the end of its epoch; the two
settings alternate process by process; medians of ``--runs`` processes each.

Needs moto's server (the test extras); nothing else.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

from benchmarks.report import command_line, load_average, markers, publish

START, END = markers("first-batch-benchmark")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETWORKS = ((0.0, 0), (0.01, 0), (0.025, 0), (0.025, 100))
"""(seconds each request is held, MB/s a connection at most or 0): the loopback server itself;
10 and 25 ms (a request to S3 in the same region takes ~10-30 ms to its first byte); and 25 ms
with each connection's answers at 100 MB/s, about what one S3 connection delivers."""
MODES = ("in a row", "whole shard first", "overlapped")
"""The settings compared, each in its own processes: the overlap switched off; overlapped but
the first batch decoded from the whole shard (nothing taken as it streams in); this code."""
BATCH = 256
LARGE_IMAGES = "image, one 61 MB shard"
"""1,250 images (61 MB, stored raw): a shard above ``early_fetch.STREAMED_SHARD_BYTES`` whose first
record batch (256 images, 12.6 MB) is a whole first batch of 256."""
LARGE = "token, one 35 MB shard"
"""120,000 token rows (62 MB decoded, one lz4 shard of 35 MB): a shard above
``early_fetch.STREAMED_SHARD_BYTES``, whose first batch waits for its first record batch
(the first 0.3 MB of the shard's GET), not for the whole shard."""

CHILD = r"""
import json, sys, time
from concurrent.futures import Future

import snapcache as sc
from benchmarks.workloads import MAKERS

url, workload, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "whole shard first":
    from snapcache.store.early_fetch import EarlyFetches

    assert hasattr(EarlyFetches, "_stream_pays")  # what is switched off must exist
    EarlyFetches._stream_pays = lambda self, shard: False
if mode == "in a row":
    from snapcache.pipeline import snapshot_exec
    from snapcache.store.early_fetch import EarlyFetches

    class Serial:  # _hold's pool: each request waits for the one before
        def __init__(self, *args, **kwargs):
            pass
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return False
        def submit(self, fn, *args, **kwargs):
            future = Future()
            future.set_result(fn(*args, **kwargs))
            return future

    # what is switched off must exist, or both settings would measure the same code
    assert hasattr(snapshot_exec, "ThreadPoolExecutor") and hasattr(EarlyFetches, "start")
    snapshot_exec.ThreadPoolExecutor = Serial
    EarlyFetches.start = lambda self, shard: None
started = time.perf_counter()
ds = sc.Dataset.range(n).map(MAKERS[workload]).snapshot(url, progress=False).batch(%d)
it = iter(ds)
rows = len(next(iter(next(it).values())))
first = time.perf_counter() - started
rows += sum(len(next(iter(b.values()))) for b in it)
assert rows == n, rows
print(json.dumps({"first": first, "epoch": time.perf_counter() - started}))
""" % BATCH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proxy(endpoint: str, delay: float, rate: float) -> tuple[subprocess.Popen, str]:
    target = urllib.parse.urlparse(endpoint)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.latency_proxy", str(port),
                             target.hostname or "127.0.0.1", str(target.port), str(delay),
                             str(rate)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def _read(url: str, workload: str, n: int, mode: str, endpoint: str, server_endpoint: str
          ) -> dict:
    env = {k: v.replace(server_endpoint, endpoint) for k, v in os.environ.items()}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    out = subprocess.run([sys.executable, "-c", CHILD, url, workload, str(n), mode],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if out.returncode:
        raise RuntimeError(f"reading process failed: {out.stderr.strip()[-2000:]}")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(server, bucket: str, sizes: dict, runs: int) -> dict:
    import snapcache as sc
    from benchmarks.workloads import MAKERS

    results = {}
    for label, n in sizes.items():
        workload = label.split(",")[0]  # "token, one 35 MB shard": the token maker
        url = f"s3://{bucket}/{workload}-{n}"
        for _ in sc.Dataset.range(n).map(MAKERS[workload]).snapshot(url, progress=False):
            pass  # built straight on the server, not through the proxy
        for network in NETWORKS:
            proxy, endpoint = _proxy(server.endpoint, *network) if any(network) else (
                None, server.endpoint)
            try:
                got: dict[str, list[dict]] = {m: [] for m in MODES}
                for r in range(runs):
                    for mode in (MODES if r % 2 else MODES[::-1]):
                        got[mode].append(_read(url, workload, n, mode, endpoint,
                                               server.endpoint))
            finally:
                if proxy is not None:
                    proxy.kill()
                    proxy.wait()
            results[(label, network)] = {
                mode: {"first": statistics.median(r["first"] for r in rs),
                       "epoch": statistics.median(r["epoch"] for r in rs),
                       "firsts": [r["first"] for r in rs]}
                for mode, rs in got.items()}
            print(f"  {label} {network} {results[(label, network)]}",
                  file=sys.stderr, flush=True)
    return results


def render(args, sizes, results, elapsed, load) -> str:
    L = [START, "## First batch on S3: the start-up requests overlapped\n"]
    L.append(f"`python -m benchmarks.bench_first_batch --scale {args.scale} --runs {args.runs} "
             f"--write-doc` (took {elapsed:.0f} s; 2-core machine, 1-minute load average "
             f"{load[0]} at the start and {load[1]} at the end). A fresh process reads a "
             "snapshot on the loopback moto server through a proxy that holds each request "
             "for the time in the second column (0: the server directly) and, where a rate is "
             "given, passes each connection's answers at most at that rate. Its requests "
             "before the first shard: the manifest's GET, the read lease's PUT, the last-use "
             "PUT and the manifest's HEAD (the check against a purge). *In a row*: each waits "
             "for the one before, then the first shard's GET (this code with the overlap "
             "switched off); *whole shard first*: the first shard's GET goes out beside the "
             "lease's requests and the last-use PUT beside the HEAD, and the first batch is "
             "decoded from the whole shard; *overlapped* (this code): as that, but the shard's "
             "body is taken as it streams in and each record batch is decoded as soon as it "
             "has arrived, where the shard is 16 MiB or more (a stream's first record batch is "
             "cut at 1 MiB, at least 1,024 rows and at most the others': 1,024 token rows, 256 "
             "images like the rest): here the two one-shard rows; the other rows run the same "
             "code in both overlapped columns. Milliseconds from building the "
             "pipeline object (after the imports) to its "
             f"first batch of 256 and to the end of the epoch, medians of {args.runs} "
             "processes a setting, the settings alternating.\n")
    L.append("| workload | request held | first batch ms in a row | whole shard first | "
             "overlapped | saved | epoch ms in a row / whole shard first / overlapped |")
    L.append("|---|---|---|---|---|---|---|")
    for (workload, (delay, rate)), r in results.items():
        row, whole, over = (r[m] for m in MODES)
        network = f"{delay * 1e3:.0f} ms" + (f", {rate} MB/s" if rate else "")
        L.append(f"| {workload} ({sizes[workload]:,}) | {network} | "
                 f"{row['first'] * 1e3:.1f} | {whole['first'] * 1e3:.1f} | "
                 f"{over['first'] * 1e3:.1f} | {(row['first'] - over['first']) * 1e3:.1f} ms | "
                 f"{row['epoch'] * 1e3:.0f} / {whole['epoch'] * 1e3:.0f} / "
                 f"{over['epoch'] * 1e3:.0f} |")
    L.append(END)
    return "\n".join(L)


def main(argv=None):
    parser = command_line(__doc__, scale=1.0)
    parser.add_argument("--runs", type=int, default=7,
                        help="reading processes a setting and row (default 7)")
    args = parser.parse_args(argv)
    from benchmarks.loopback_s3 import loopback_s3

    sizes = {"image": max(20, int(200 * args.scale)),
             "token": max(2_000, int(20_000 * args.scale)),
             LARGE_IMAGES: max(300, int(1_250 * args.scale)),
             LARGE: max(2_000, int(120_000 * args.scale))}
    start_load, started = load_average(), time.perf_counter()
    with loopback_s3() as (server, bucket, _):
        results = measure(server, bucket, sizes, args.runs)
    section = render(args, sizes, results, time.perf_counter() - started,
                     (start_load, load_average()))
    publish(section, START, END, write=args.write)


if __name__ == "__main__":
    main()
