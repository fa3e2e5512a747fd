"""Delta snapshots: what the run after a source grows costs, and million-file sources.

Run: python -m benchmarks.bench_delta [--write-doc] [--files 10000] [--big 100000]
[--parquet-files 8] (``--render RUN.jsonl`` writes the section from the four JSON lines a run
printed on stderr; ``--s3 N`` runs the S3 part alone, ``--parquet N`` the Parquet part.)

1. A source of ``--files`` small files, ``map`` sleeping 5 ms per file (a decode that waits,
   so the machine's two shared cores stay free), ``snapshot(delta=True)``. The first epoch
   builds version 1; 1% more files are added; the next epoch (a fresh pipeline object, as a
   new run would build) computes the new files and reads everything. Map calls and wall time
   of both epochs are compared.
2. A source of ``--big`` empty files: the time to fingerprint it (one ``stat`` a file, a key
   each, the lineage tree) in a fresh process, and the bytes of a version's manifest and its
   source record (the side file listing every file).
3. ``--s3-files`` (100,000) objects on a loopback S3 server: the requests (counted through
   botocore's events) and time to read their identities from the paginated listing.
4. Parquet row groups as units: ``--parquet-files`` (8) files of 8 row groups of 1,000 rows
   (an id and 1 KB of bytes a row). The cost of identifying the row groups (reading and
   hashing every column chunk) against a raw read of the same files and a ``stat`` of each;
   the identities of an unchanged source (taken from the newest version's record, no read);
   and one file re-exported with one row changed: identified by reading that file only, one
   row group computed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.loopback_s3 import loopback_s3
from benchmarks.report import command_line, markers, publish, target_rows, verdict

START, END = markers("delta-benchmark")
MAP_SECONDS = 0.005


def make_files(folder: str, start: int, stop: int, content: bool = True) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(start, stop):
        with open(os.path.join(folder, f"f{i:07d}.txt"), "w") as f:
            if content:
                f.write(str(i))


CALLS = [0]


def slow_map(path):
    CALLS[0] += 1
    time.sleep(MAP_SECONDS)
    return {"id": int(os.path.basename(path)[1:8])}


def epoch(src: str, root: str) -> tuple[float, int, int]:
    """(seconds, map calls, examples) of one epoch of a fresh pipeline object."""
    import snapcache as sc

    CALLS[0] = 0
    start = time.perf_counter()
    ds = (sc.Dataset.from_files(os.path.join(src, "*.txt")).map(slow_map)
          .snapshot(root, delta=True, progress=False))
    n = sum(1 for _ in ds)
    return time.perf_counter() - start, CALLS[0], n


def growth(files: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src, root = os.path.join(tmp, "src"), os.path.join(tmp, "root")
        make_files(src, 0, files)
        full_s, full_calls, full_n = epoch(src, root)
        added = max(1, files // 100)
        make_files(src, files, files + added)
        delta_s, delta_calls, delta_n = epoch(src, root)
        read_s, read_calls, _ = epoch(src, root)
    return {"load": os.getloadavg()[0], "files": files, "added": added, "full_s": full_s,
            "full_calls": full_calls,
            "full_n": full_n, "delta_s": delta_s, "delta_calls": delta_calls,
            "delta_n": delta_n, "read_s": read_s, "read_calls": read_calls}


def fingerprint_child(src: str) -> dict:
    """In a fresh process: expand the glob, then time the fingerprint of the source alone."""
    import snapcache as sc
    from snapcache.pipeline import delta_plan, plan
    from snapcache.pipeline.queries import last_snapshot  # noqa: F401  (warm imports)

    t0 = time.perf_counter()
    ds = sc.Dataset.from_files(os.path.join(src, "*.txt")).map(slow_map).snapshot(
        os.path.join(src, "..", "root"), delta=True, progress=False)
    expand = time.perf_counter() - t0
    snap = plan.last_snapshot(ds._op)
    t0 = time.perf_counter()
    units = delta_plan.source_units(plan.delta_source(snap))
    digest = units.digest
    plan.lineage_tree(snap)
    seconds = time.perf_counter() - t0
    return {"expand_s": expand, "fingerprint_s": seconds, "units": len(units.keys),
            "digest": digest}


def big_source(files: int) -> dict:
    import snapcache as sc
    from snapcache.store.fs import Storage
    from snapcache.store.protocol import versions

    with tempfile.TemporaryDirectory() as tmp:
        src, root = os.path.join(tmp, "src"), os.path.join(tmp, "root")
        make_files(src, 0, files, content=False)
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_delta", "--child", src],
                             check=True, capture_output=True, text=True).stdout
        fp = json.loads(out.strip().splitlines()[-1])
        ds = (sc.Dataset.from_files(os.path.join(src, "*.txt")).map(lambda p: {"n": 1})
              .snapshot(root, delta=True, progress=False))
        start = time.perf_counter()
        n = sum(1 for _ in ds)
        build_s = time.perf_counter() - start
        (name,) = os.listdir(root)
        storage = Storage(root).child(name)
        manifest = versions.newest(storage)
        manifest_bytes = storage.size(versions.manifest_name(manifest.version))
        record_bytes = manifest.source["record_bytes"]
    return {**fp, "files": files, "examples": n, "build_s": build_s,
            "manifest_bytes": manifest_bytes, "record_bytes": record_bytes,
            "segments": len(manifest.segments), "shards": len(manifest.shards)}


@contextlib.contextmanager
def seeded_s3(files: int):
    """A bucket holding ``files`` one-byte objects ``src/f<i>.txt`` on a moto S3 server in
    server mode on loopback, run in this process (moto's ThreadedMotoServer) so the objects
    can be created through its backend: over HTTP moto stores ~100 objects/s here, and the
    listing, not the creation, is what is measured. Yields ``(bucket, seconds to create)``
    with the server's endpoint and credentials in the environment (restored after)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    from tests import s3server

    port = s3server.free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = dict(os.environ)
    try:
        os.environ.update(s3server.client_env(f"http://127.0.0.1:{port}"))
        bucket = s3server.new_bucket_name()
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        backend.create_bucket(bucket, "us-east-1")
        start = time.perf_counter()
        for i in range(files):
            backend.put_object(bucket, f"src/f{i:07d}.txt", b"x")
        s3server.clear_filesystem_caches()
        yield bucket, time.perf_counter() - start
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def s3_listing(files: int) -> dict | None:
    """``files`` objects in one folder of a loopback S3 server: the requests and time it
    takes to read their identities (``store.source_files.file_identities``, what ``from_files`` on S3
    fingerprints), counted by botocore's events."""
    from tests import s3server  # noqa: F401  (seeded_s3 put the repository on the path)

    with contextlib.ExitStack() as stack:
        try:
            bucket, put_s = stack.enter_context(seeded_s3(files))
        except ImportError:  # no moto or s3fs here: the S3 row is left out
            return None
        from snapcache.store.fs import _filesystem
        from snapcache.store.source_files import file_identities

        urls = [f"s3://{bucket}/src/f{i:07d}.txt" for i in range(files)]
        fs, _ = _filesystem(urls[0], None)
        fs.ls(bucket, refresh=True)  # connect the client
        operations: list[str] = []
        fs.s3.meta.events.register("before-call.s3", lambda event_name, **_:
                                   operations.append(event_name.rsplit(".", 1)[-1]))
        start = time.perf_counter()
        identities = file_identities(urls)
        seconds = time.perf_counter() - start
        assert len(identities) == files and all("etag" in i for i in identities)
    return {"files": files, "seconds": seconds, "put_s": put_s,
            "list_requests": operations.count("ListObjectsV2"),
            "other_requests": len(operations) - operations.count("ListObjectsV2")}


PQ_ROWS, PQ_GROUPS, PQ_BYTES = 1000, 8, 1024
PQ_CALLS = [0]


def pq_map(row):
    PQ_CALLS[0] += 1
    return {"id": row["id"], "n": len(row["blob"])}


def write_parquet(path: str, first: int, changed: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = list(range(first, first + PQ_ROWS * PQ_GROUPS))
    blobs = [(i.to_bytes(8, "little") * (PQ_BYTES // 8)) for i in ids]
    if changed is not None:
        blobs[changed] = b"changed!" * (PQ_BYTES // 8)
    pq.write_table(pa.table({"id": ids, "blob": blobs}), path, row_group_size=PQ_ROWS,
                   compression="none")


def parquet_units(files: int) -> dict:
    import snapcache as sc
    from snapcache.pipeline import plan
    from snapcache.store.source_files import file_identities

    def units_of(src, root):
        PQ_CALLS[0] = 0  # pq_map refers to PQ_CALLS: its value counts in the lineage
        ds = sc.Dataset.from_parquet(os.path.join(src, "*.parquet")).map(pq_map).snapshot(
            root, progress=False)
        snap = plan.last_snapshot(ds._op)
        start = time.perf_counter()
        units = plan.delta_units(snap, plan.delta_source(snap))
        return ds, time.perf_counter() - start, units

    with tempfile.TemporaryDirectory() as tmp:
        src, root = os.path.join(tmp, "src"), os.path.join(tmp, "root")
        os.makedirs(src)
        paths = [os.path.join(src, f"part-{i:03d}.parquet") for i in range(files)]
        for i, path in enumerate(paths):
            write_parquet(path, i * PQ_ROWS * PQ_GROUPS)
        size = sum(os.path.getsize(p) for p in paths)
        start = time.perf_counter()
        for path in paths:
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
        raw_s = time.perf_counter() - start
        start = time.perf_counter()
        file_identities(paths)
        stat_s = time.perf_counter() - start
        ds, first_s, units = units_of(src, root)
        build_start = time.perf_counter()
        n = sum(1 for _ in ds)
        build_s, build_calls = time.perf_counter() - build_start, PQ_CALLS[0]
        _, same_s, _ = units_of(src, root)
        write_parquet(paths[0], 0, changed=PQ_ROWS + 5)  # one row of row group 1
        ds, changed_s, changed_units = units_of(src, root)
        start = time.perf_counter()
        assert sum(1 for _ in ds) == n
        delta_s, delta_calls = time.perf_counter() - start, PQ_CALLS[0]
    return {"files": files, "row_groups": len(units.keys), "mb": size / 1e6, "raw_s": raw_s,
            "stat_s": stat_s, "first_s": first_s, "same_s": same_s, "changed_s": changed_s,
            "build_s": build_s, "build_calls": build_calls, "delta_s": delta_s,
            "delta_calls": delta_calls, "examples": n, "load": os.getloadavg()[0],
            "changed_units": len(changed_units.keys)}


def render_parquet(p: dict | None) -> str:
    if not p:
        return ""
    return (
        f"\nParquet row groups as units (`--parquet-files {p['files']}`): {p['files']} files "
        f"of {PQ_GROUPS} row groups of {PQ_ROWS:,} rows (an id and {PQ_BYTES:,} bytes a row, "
        f"uncompressed, in the page cache), {p['mb']:.0f} MB, {p['row_groups']} units. "
        f"Identifying every row group (reading and hashing its column chunks) takes "
        f"**{p['first_s'] * 1e3:.0f} ms** ({p['mb'] / p['first_s']:,.0f} MB/s), against "
        f"{p['raw_s'] * 1e3:.0f} ms for a raw read of the same files and "
        f"{p['stat_s'] * 1e3:.1f} ms for a `stat` of each; the build it "
        f"precedes took {p['build_s']:.2f} s ({p['build_calls']:,} map calls). With the "
        f"source unchanged the identities come from the newest version's record: "
        f"**{p['same_s'] * 1e3:.0f} ms**, no file read. One file re-exported with one row "
        f"changed: identified in **{p['changed_s'] * 1e3:.0f} ms** (that file read), then "
        f"**{p['delta_calls']:,} map calls** (its changed row group; {PQ_ROWS:,} rows) and "
        f"{p['delta_s']:.2f} s for the run. Load average {p['load']:.1f}.\n")


def render(g: dict, b: dict, s3: dict | None = None, p: dict | None = None) -> str:
    calls_pct = 100 * g["delta_calls"] / g["full_calls"]
    time_pct = 100 * g["delta_s"] / g["full_s"]
    return (
        f"{START}\n## Delta snapshots\n\n"
        f"`python -m benchmarks.bench_delta --write-doc`. A source of {g['files']:,} small "
        f"files, `map` sleeping {MAP_SECONDS * 1e3:.0f} ms a file, `snapshot(delta=True)`; then "
        f"{g['added']:,} files ({100 * g['added'] / g['files']:.0f}%) are added and a fresh "
        "pipeline object runs one epoch (it computes the new files and reads all examples "
        "back).\n\n"
        "| epoch | map calls | seconds | examples |\n|---|---|---|---|\n"
        f"| full build (version 1) | {g['full_calls']:,} | {g['full_s']:.2f} | {g['full_n']:,} |\n"
        f"| after adding {g['added']:,} files (version 2) | {g['delta_calls']:,} | "
        f"{g['delta_s']:.2f} | {g['delta_n']:,} |\n"
        f"| unchanged source (read) | {g['read_calls']:,} | {g['read_s']:.2f} | "
        f"{g['delta_n']:,} |\n\n"
        f"The delta run does **{calls_pct:.1f}%** of the full build's map calls (target <= 2%: "
        f"{verdict(calls_pct <= 2)}) in **{time_pct:.1f}%** of its time (target <= 5%: "
        f"{verdict(time_pct <= 5)}). The machine's load average was "
        f"{g['load']:.1f} on its 2 cores (other test suites running): the full build sleeps, the "
        "delta run's CPU work (listing, keying, copying none, reading "
        f"{g['delta_n']:,} rows back) is "
        "slowed by it.\n\n"
        f"A source of {b['files']:,} empty local files: expanding the glob takes "
        f"{b['expand_s']:.2f} s; fingerprinting it (one `stat` a file, the digest of the "
        f"identity columns, the lineage tree) takes **{b['fingerprint_s']:.2f} s** in a fresh "
        f"process (target < 1 s: {verdict(b['fingerprint_s'] < 1)}). Its version 1 ({b['examples']:,} examples, "
        f"{b['segments']:,} segments, {b['shards']:,} shards, built in {b['build_s']:.1f} s) "
        f"has a manifest of **{b['manifest_bytes'] / 1e6:.2f} MB** and a source record (the "
        f"side file listing every file) of **{b['record_bytes'] / 1e6:.2f} MB** (target for "
        f"the manifest: < 2 MB: {verdict(b['manifest_bytes'] < 2e6)}).\n"
        + (f"\nThe same source on S3: {s3['files']:,} objects in one folder of a loopback S3 "
           "server (moto in server mode on 127.0.0.1, run in the benchmark's process so the "
           "objects could be created through its backend in "
           f"{s3['put_s']:.1f} s; over HTTP it stores ~100 a second): their identities (size, "
           f"ETag) take **{s3['list_requests']} ListObjectsV2 requests** and "
           f"{s3['other_requests']} other requests (target: "
           f"{(s3['files'] + 999) // 1000} listing requests, none per object: "
           f"{verdict(s3['list_requests'] <= (s3['files'] + 999) // 1000 and not s3['other_requests'])}"
           f"; {s3['seconds']:.0f} s with the server in the same process, which serves and the "
           "client parses every page of 1,000 keys: not a target).\n" if s3 else
           "\nThe S3 part did not run (moto or s3fs missing).\n")
        + render_parquet(p) + "\n"
        + "\n".join(target_rows(targets(g, b, s3))) + "\n"
        + f"{END}\n")


def targets(g: dict, b: dict, s3: dict | None = None) -> list[tuple[str, str, bool]]:
    calls_pct = 100 * g["delta_calls"] / g["full_calls"]
    time_pct = 100 * g["delta_s"] / g["full_s"]
    return [
        ("delta run: <= 2% of the full build's map calls", f"{calls_pct:.1f}%",
         calls_pct <= 2),
        ("delta run: <= 5% of the full build's time", f"{time_pct:.1f}%", time_pct <= 5),
        (f"fingerprint of {b['files']:,} files in a fresh process: < 1 s",
         f"{b['fingerprint_s']:.2f} s", b["fingerprint_s"] < 1),
        ("manifest of that version: < 2 MB", f"{b['manifest_bytes'] / 1e6:.2f} MB",
         b["manifest_bytes"] < 2e6),
    ] + ([(f"identities of {s3['files']:,} S3 objects: {(s3['files'] + 999) // 1000} listing "
           "requests, none per object",
           f"{s3['list_requests']} ListObjectsV2 + {s3['other_requests']} other",
           s3["list_requests"] <= (s3["files"] + 999) // 1000 and not s3["other_requests"])]
          if s3 else [])


def main() -> None:
    if sys.argv[1:2] == ["--s3"]:  # only the S3 listing part
        print(json.dumps(s3_listing(int(sys.argv[2]))))
        return
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(fingerprint_child(sys.argv[2])))
        return
    if sys.argv[1:2] == ["--parquet"]:  # only the Parquet row-group part
        print(json.dumps(parquet_units(int(sys.argv[2]))))
        return
    if sys.argv[1:2] == ["--render"]:  # the doc section from a run's JSON lines
        lines = [json.loads(line) for line in open(sys.argv[2]).read().splitlines()[:4]]
        publish(render(*lines), START, END, write=True)
        return
    parser = command_line(__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--s3-files", type=int, default=100_000)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--parquet-files", type=int, default=8)
    args = parser.parse_args(sys.argv[1:])
    g = growth(args.files)
    print(json.dumps(g), file=sys.stderr)
    b = big_source(args.big)
    print(json.dumps(b), file=sys.stderr)
    s3 = s3_listing(args.s3_files) if not args.no_s3 else None
    print(json.dumps(s3), file=sys.stderr)
    p = parquet_units(args.parquet_files)
    print(json.dumps(p), file=sys.stderr)
    publish(render(g, b, s3, p), START, END, write=args.write)


if __name__ == "__main__":
    main()
