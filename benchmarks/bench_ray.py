"""What building a snapshot on Ray buys and costs on this machine.

    python -m benchmarks.bench_ray [--examples 300] [--ms 20] [--repeat 2] [--write-doc]

One pipeline, ``range(examples).map(expensive).snapshot(...)`` where ``expensive`` spends
``ms`` milliseconds of pure-Python CPU work (it holds the GIL, so threads cannot help), is
written four ways into fresh roots: by one plain process (no Ray), and by
``snapcache.ray.build`` with 1, 2 and 4 tasks on a local Ray cluster of 2 CPUs. Each time is
the best of ``--repeat`` runs, after a warm-up build that loads snapcache into the workers.
``--write-doc`` replaces the "Ray build" section of docs/benchmarks.md (appended if absent).
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time

import numpy as np

import snapcache as sc
from benchmarks.report import command_line, markers, publish

START, END = markers("ray-benchmark")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def expensive(i, ms):
    """``ms`` milliseconds of pure-Python work, then a small example."""
    end = time.perf_counter() + ms / 1000
    total = 0
    while time.perf_counter() < end:
        total += sum(range(200))
    return {"x": np.full(256, i, np.float32), "i": i}


def pipeline(root: str, examples: int, ms: float) -> sc.Dataset:
    return (sc.Dataset.range(examples).map(expensive_fn(ms))
            .snapshot(root, progress=False))


def expensive_fn(ms):
    def fn(i):
        return expensive(i, ms)
    return fn


def timed(run, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        root = tempfile.mkdtemp(prefix="snapcache-bench-ray-")
        try:
            start = time.perf_counter()
            run(root)
            best = min(best, time.perf_counter() - start)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return best


def main(argv=None) -> dict:
    parser = command_line(__doc__)
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)

    import ray

    import snapcache.ray as scr

    load = os.getloadavg()[0]
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    init_seconds = time.perf_counter() - start
    try:
        warm = tempfile.mkdtemp(prefix="snapcache-bench-ray-")
        start = time.perf_counter()
        scr.build(pipeline(warm, 8, 1.0), num_tasks=2)
        warmup_seconds = time.perf_counter() - start
        shutil.rmtree(warm, ignore_errors=True)

        n, ms = args.examples, args.ms
        results = {"plain process (no Ray)": timed(lambda r: list(pipeline(r, n, ms)),
                                                   args.repeat)}
        for tasks in (1, 2, 4):
            results[f"Ray, {tasks} task{'s' if tasks > 1 else ''}"] = timed(
                lambda r, t=tasks: scr.build(pipeline(r, n, ms), num_tasks=t), args.repeat)
    finally:
        ray.shutdown()

    ideal = n * ms / 1000
    report = {"ray": ray.__version__, "examples": n, "ms": ms, "ideal_serial": ideal,
              "init_seconds": init_seconds, "warmup_seconds": warmup_seconds,
              "results": results, "cpus": os.cpu_count(), "load": load,
              "python": platform.python_version()}
    publish(f"{START}\n{render(report)}\n{END}", START, END, write=args.write)
    return report


def render(report: dict) -> str:
    results = report["results"]
    one, two = results["Ray, 1 task"], results["Ray, 2 tasks"]
    plain = results["plain process (no Ray)"]
    lines = [
        "## Ray build", "",
        f"`python -m benchmarks.bench_ray --write-doc`: `snapcache.ray.build` of "
        f"`range({report['examples']}).map(f).snapshot(root)` where `f` spends "
        f"{report['ms']:g} ms of pure-Python CPU (serial work {report['ideal_serial']:.1f} s), "
        f"on a local Ray {report['ray']} cluster of 2 CPUs (machine: {report['cpus']} cores, "
        f"Python {report['python']}; 1-minute load average {report['load']:.1f} at the start, "
        "other jobs sharing the machine). Best of the runs, local disk, after a warm-up "
        "build.", "",
        "| writer | build time | vs Ray, 1 task |", "|---|---|---|",
    ]
    for name, seconds in results.items():
        lines.append(f"| {name} | {seconds:.2f} s | {one / seconds:.2f}x |")
    lines += [
        "",
        f"- **2 tasks vs 1: {one / two:.2f}x faster** (2.0x is the limit on 2 cores).",
        f"- Ray's cost per build with 1 task against a plain process: "
        f"{one - plain:+.2f} s (scheduling, shipping the pipeline, one more process); "
        f"starting the local cluster (`ray.init`) took {report['init_seconds']:.1f} s and the "
        f"first build, which imports snapcache into the workers, "
        f"{report['warmup_seconds']:.1f} s for 8 examples.",
        f"- 4 tasks on 2 CPUs, run two at a time: {one / results['Ray, 4 tasks']:.2f}x. "
        "Tasks smaller than a CPU's share even out uneven shares and CPUs shared with other "
        "jobs, and make a retry cheaper; they cannot beat the CPU count.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
