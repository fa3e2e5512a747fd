"""Random access against the peers (issue #15): ``snap[i]`` vs LitData's and Mosaic streaming's
``dataset[i]`` on the same data, local disk and the loopback S3 server.

    python -m benchmarks.bench_access [--examples 20000] [--s3-examples 10000] [--no-write]

LitData and Mosaic streaming are benchmark-only baselines (``benchmarks/requirements.txt``, in a
venv with ``--system-site-packages``, see ``benchmarks/run_all.py``); one that cannot be
imported is reported as missing, never estimated.

Every system holds the same examples (``bench_resume.example``: a 32x32x3 uint8 noise image and
a label) in ~4 MiB shards (snapcache ``shard_size=4 MiB``, LitData ``chunk_bytes``, Mosaic
``size_limit``), uncompressed (noise does not compress; snapcache stores such shards raw). Each
read is checked: the returned label must equal the index.

- open: constructing the dataset object (snapcache ``open_snapshot``, LitData
  ``StreamingDataset``, Mosaic ``StreamingDataset``).
- cold: the first ``dataset[i]`` after open, with every library cache empty (a fresh object, a
  fresh local cache folder for remote data, fsspec's instance cache cleared); the OS page cache
  is not dropped (the files were just written). One sample per fresh open.
- warm: ``dataset[i]`` for random ``i`` on one object after a pass that touched every shard.

Results go to docs/benchmarks.md between the ``access-benchmarks`` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import shutil
import sys
import tempfile
import time
import types
import warnings

import numpy as np

import snapcache as sc
from benchmarks.bench_resume import example
from benchmarks.loopback_s3 import loopback_s3
from benchmarks.report import load_average
from snapcache.options import ReadOptions

START, END = "<!-- access-benchmarks:start -->", "<!-- access-benchmarks:end -->"
SHARD = 4 << 20
SMALL_BUDGET = 8 << 20   # bytes: far below the data, for the "does not fit" row
SMALL_BATCHES = 64 << 10  # record_batch_size of the configuration tuned for random access
TUNED = f"snapcache, record_batch_size={SMALL_BATCHES >> 10} KiB"
OURS = ("snapcache", TUNED)  # the configurations the target is judged on, each
NOTES: list[str] = []   # what the run had to do to make a peer work, printed and written


def note(text: str) -> None:
    NOTES.append(text)
    print(f"note: {text}", file=sys.stderr, flush=True)


# -- the peers, imported on demand ---------------------------------------------------------------
def import_litdata():
    import litdata

    return litdata


def import_streaming():
    """Mosaic streaming. ``import streaming`` imports ``streaming.vision``, which imports
    torchvision; PyPI's torchvision wheels for torch 2.13 are CUDA builds that cannot load beside
    the CPU torch, and the CPU wheels are not on PyPI. The vision datasets are not used here, so
    when torchvision cannot be imported ``streaming.vision`` is replaced by an empty module."""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken torchvision raises RuntimeError too
        if "streaming.vision" not in sys.modules:
            sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
            note(f"torchvision cannot be imported ({type(e).__name__}: {str(e)[:80]}); "
                 "`streaming.vision` (Mosaic's torchvision datasets, unused here) replaced by an "
                 "empty module so that `import streaming` works")
    import streaming

    return streaming


def missing(importer) -> str | None:
    try:
        importer()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


# -- writing the same data three ways ------------------------------------------------------------
def write_snapcache(root: str, n: int, storage_options=None,
                    record_batch_size: int = 16 << 20) -> int:
    ds = sc.Dataset.range(n).map(example).snapshot(root, shard_size=SHARD, progress=False,
                                                   storage_options=storage_options,
                                                   record_batch_size=record_batch_size)
    for _ in ds.batch(1024):
        pass
    return len(sc.open_snapshot(root, storage_options=storage_options).manifest.shards)


def write_litdata(out: str, n: int) -> int:
    litdata = import_litdata()
    with contextlib.redirect_stdout(sys.stderr):
        litdata.optimize(fn=_litdata_item, inputs=list(range(n)), output_dir=out,
                         chunk_bytes=SHARD, num_workers=1, verbose=False,
                         start_method="fork")
    return sum(f.endswith(".bin") for f in os.listdir(out))


def _litdata_item(i: int) -> dict:
    e = example(i)
    return {"image": e["image"], "label": int(e["label"])}


def write_mosaic(out: str, n: int) -> int:
    streaming = import_streaming()
    columns = {"image": "ndarray:uint8:32,32,3", "label": "int64"}
    with streaming.MDSWriter(out=out, columns=columns, size_limit=SHARD) as writer:
        for i in range(n):
            writer.write(example(i))
    return sum(f.endswith(".mds") for f in os.listdir(out))


# -- reading ---------------------------------------------------------------------------------------
def snapcache_open(root: str, storage_options=None, read=None):
    return lambda cache: sc.open_snapshot(root, storage_options=storage_options, read=read)


def litdata_open(path: str, storage_options=None, **options):
    litdata = import_litdata()
    from litdata.streaming.resolver import Dir

    def open_(cache: str):
        if path.startswith("s3://"):
            return litdata.StreamingDataset(Dir(path=cache, url=path),
                                            storage_options=storage_options or {}, **options)
        return litdata.StreamingDataset(path, **options)
    return open_


def mosaic_open(path: str, storage_options=None):
    streaming = import_streaming()

    def open_(cache: str):
        if path.startswith("s3://"):
            return streaming.StreamingDataset(remote=path, local=cache, batch_size=1)
        return streaming.StreamingDataset(local=path, remote=None, batch_size=1)
    return open_


def label_of(item) -> int:
    return int(item["label"])


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def checked(ds, i: int) -> float:
    seconds, item = timed(lambda: ds[i])
    if label_of(item) != i:
        raise RuntimeError(f"{type(ds).__module__}: dataset[{i}] returned the example labelled "
                           f"{label_of(item)}; the benchmark would measure the wrong thing")
    return seconds


def measure(open_, n: int, workdir: str, cold_indices, warm_indices, fresh=lambda: None,
            requests=None) -> dict:
    opens, cold = [], []
    for k, i in enumerate(cold_indices):
        fresh()
        cache = os.path.join(workdir, f"cache-{k}")
        seconds, ds = timed(lambda: open_(cache))
        opens.append(seconds)
        cold.append(checked(ds, i))
        del ds
        gc.collect()
        shutil.rmtree(cache, ignore_errors=True)
    fresh()
    ds = open_(os.path.join(workdir, "cache-warm"))
    for i in range(0, n, 97):     # touch every shard (a shard holds > 1,000 examples)
        checked(ds, i)
    before = requests() if requests else 0
    warm = [checked(ds, i) for i in warm_indices]
    warm_requests = (requests() - before) / len(warm) if requests else None
    del ds
    gc.collect()
    q = lambda xs, p: float(np.quantile(xs, p)) * 1e3  # noqa: E731
    first = [a + b for a, b in zip(opens, cold)]
    return {"open_ms": q(opens, 0.5), "first_ms": q(first, 0.5), "cold_median_ms": q(cold, 0.5),
            "cold_p99_ms": q(cold, 0.99), "warm_median_ms": q(warm, 0.5),
            "warm_p99_ms": q(warm, 0.99), "cold_n": len(cold), "warm_n": len(warm),
            "warm_requests": warm_requests}


def indices(n: int, cold: int, warm: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(0)
    return rng.integers(0, n, cold).tolist(), rng.integers(0, n, warm).tolist()


# (name, importer, writer, opener(path, storage_options)); LitData twice: its default
# ``batch_decode="auto"`` decodes a whole batch of items around the one asked for, which is
# what its ``dataset[i]`` does unless told otherwise; ``batch_decode=False`` decodes one.
PEERS = (
    ("LitData", import_litdata, write_litdata, litdata_open),
    ("LitData, batch_decode=False", import_litdata, write_litdata,
     lambda path, options=None: litdata_open(path, options, batch_decode=False)),
    ("Mosaic streaming", import_streaming, write_mosaic, mosaic_open),
)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())


def run_system(name, storage, write, open_, n, workdir, cold_i, warm_i, fresh=lambda: None,
               requests=None):
    print(f"{name} on {storage} ...", file=sys.stderr, flush=True)
    try:
        shards = write()
        row = measure(open_(), n, os.path.join(workdir, "caches-" + slug(name)), cold_i, warm_i,
                      fresh, requests)
    except Exception as e:  # noqa: BLE001 - reported in the table and the report, not hidden
        text = str(e).strip()
        message = f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"
        print(f"  failed: {message}", file=sys.stderr, flush=True)
        return {"system": name, "storage": storage, "error": message}
    row.update(system=name, storage=storage, shards=shards)
    print(f"  {row}", file=sys.stderr, flush=True)
    return row


def peer_rows(storage, workdir, n, cold_i, warm_i, place, options=None, fresh=lambda: None,
              requests=None):
    """Rows of the peers: each writes its data once (``place(writer, local)`` puts it where it
    is read and returns the path), then is read as configured."""
    rows, written = [], {}
    for name, importer, write, opener in PEERS:
        why = missing(importer)
        if why:
            rows.append({"system": name, "storage": storage, "error": f"not installed ({why})"})
            continue

        def write_once(write=write) -> int:
            if write not in written:
                local = os.path.join(workdir, write.__name__)
                shards = write(local, n)
                written[write] = (place(write, local), shards)
            return written[write][1]

        rows.append(run_system(name, storage, write_once,
                               lambda write=write, opener=opener: opener(written[write][0],
                                                                         options),
                               n, workdir, cold_i, warm_i, fresh, requests))
    return rows


def request_counter(server, bucket: str):
    """The number of requests for ``bucket`` in the loopback server's access log so far (the
    server logs a request after answering it: read until the log stops growing)."""
    pattern = re.compile(rb'"(?:GET|PUT|HEAD|POST|DELETE) /' + re.escape(bucket.encode())
                         + rb'[/?" ]')

    def count() -> int:
        text, deadline = b"", time.monotonic() + 5
        while time.monotonic() < deadline:
            size = os.fstat(server.log.fileno()).st_size
            new = os.pread(server.log.fileno(), size, 0)
            if new == text:
                break
            text = new
            time.sleep(0.2)
        return len(pattern.findall(text))
    return count


def local_rows(workdir: str, n: int, cold: int, warm: int) -> list[dict]:
    cold_i, warm_i = indices(n, cold, warm)
    root = os.path.join(workdir, "snapcache")
    rows = [run_system("snapcache", "local disk", lambda: write_snapcache(root, n),
                       lambda: snapcache_open(root), n, workdir, cold_i, warm_i)]
    # Record batches of 64 KiB (21 examples) instead of the default (a quarter of the 4 MiB
    # shard): a first row of a record batch reads and verifies 64 KiB instead of 1 MiB.
    tuned = os.path.join(workdir, "snapcache-small-batches")
    rows.append(run_system(TUNED, "local disk",
                           lambda: write_snapcache(tuned, n, record_batch_size=SMALL_BATCHES),
                           lambda: snapcache_open(tuned), n, workdir, cold_i, warm_i))
    # The same with a read budget far below the data: decoded record batches (and open shards)
    # do not all stay, so a warm row is often a record batch decode again.
    small = ReadOptions(prefetch_bytes=SMALL_BUDGET)
    rows.append(run_system(f"snapcache, prefetch_bytes={SMALL_BUDGET >> 20} MiB", "local disk",
                           lambda: rows[0]["shards"], lambda: snapcache_open(root, read=small),
                           n, workdir, cold_i, warm_i))
    return rows + peer_rows("local disk", workdir, n, cold_i, warm_i,
                            place=lambda write, local: local)


def s3_rows(workdir: str, n: int, cold: int, warm: int) -> list[dict]:
    cold_i, warm_i = indices(n, cold, warm)
    storage = "loopback S3 (moto)"
    rows = []
    with contextlib.ExitStack() as stack:
        try:
            server, bucket, s3server = stack.enter_context(loopback_s3())
        except Exception as e:  # noqa: BLE001
            return [{"system": "all", "storage": storage, "error": f"no S3 server: {e}"}]
        fs = server.filesystem()
        fresh = s3server.clear_filesystem_caches
        requests = request_counter(server, bucket)
        root = f"s3://{bucket}/snapcache"
        rows.append(run_system("snapcache", storage, lambda: write_snapcache(root, n),
                               lambda: snapcache_open(root), n, workdir, cold_i, warm_i, fresh,
                               requests))
        tuned = f"s3://{bucket}/snapcache-small-batches"
        rows.append(run_system(TUNED, storage,
                               lambda: write_snapcache(tuned, n,
                                                       record_batch_size=SMALL_BATCHES),
                               lambda: snapcache_open(tuned), n, workdir, cold_i, warm_i,
                               fresh, requests))

        def upload(write, local: str) -> str:
            fs.put(local, f"{bucket}/{write.__name__}", recursive=True)
            return f"s3://{bucket}/{write.__name__}"

        # The loopback server speaks plain http. LitData downloads whole chunks through
        # obstore, which refuses http unless allow_http, and builds its store with fixed client
        # options (AWS_ALLOW_HTTP in the environment is not read): add allow_http to them.
        # Mosaic takes its endpoint from S3_ENDPOINT_URL.
        if not missing(import_litdata):
            from litdata.streaming import downloader

            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
            note("LitData on the loopback S3 server (plain http): "
                 "`litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS['allow_http'] = True` "
                 "(its obstore chunk downloads fail with `HTTP error: builder error ... "
                 "BadScheme` otherwise, and `AWS_ALLOW_HTTP=true` does not reach them); "
                 "`dataset[i]` itself did not need it: it reads the example's bytes with a "
                 "boto3 range GET (LitData's default `on_demand_bytes`), endpoint and "
                 "credentials given as `storage_options`")
        os.environ["S3_ENDPOINT_URL"] = server.endpoint
        note("Mosaic streaming on the loopback S3 server: `S3_ENDPOINT_URL` set to it")
        options = {"endpoint_url": server.endpoint,
                   "aws_access_key_id": server.env["AWS_ACCESS_KEY_ID"],
                   "aws_secret_access_key": server.env["AWS_SECRET_ACCESS_KEY"]}
        rows += peer_rows(storage, workdir, n, cold_i, warm_i, place=upload, options=options,
                          requests=requests)
    return rows


# Written with the numbers of the run that produced docs/benchmarks.md; revisit after changes.
WHY = """What decides each column:

- **cold, local**: Mosaic's first `dataset[i]` reads that one sample (3 KB) from the shard
  file and decodes it, checking nothing. snapcache's first `snap[i]` reads only pages of the
  sample's record batch (`pread`s of 16 KiB pages here: the one holding the batch's IPC
  metadata and the image's offsets, the one holding the image, the one holding its shape and
  label), checks each page's xxh3 against the shard's page table (raw local shards have one
  beside them, `<shard>.pages`: the digest of each page, 64 a record batch, itself checked
  against the manifest; read when the snapshot is opened for snapshots of up to 32 shards,
  else at the shard's first row), parses the record batch metadata
  (field nodes, buffers) itself, bounds-checks the row's offsets and shape against their
  buffers, and decodes the row from the pages: no byte returned unverified, without reading
  or hashing the other 255 rows' bytes. Before page checksums it read and hashed the whole
  1 MiB record batch and validated it with Arrow (0.75 ms). Everything that does not depend on
  `i` (the manifest, the row decoder compiled from the schema, the record batches' first rows
  as a list, the page tables) is prepared by `open_snapshot`, which stays cheaper than the
  peers' open. With 64 KiB record batches the pages are 4 KiB.
- **cold, S3 (met)**: snapcache's first `snap[i]` is one ranged GET of the record batch (the
  manifest came at open); Mosaic downloads the whole shard (4 MiB), LitData makes a range GET
  of the example but through its own slower path. Open on S3: snapcache's S3 client is
  obstore here (the storage options say keys and an endpoint; s3fs serves what obstore
  cannot express, see docs/cli.md), which starts in milliseconds, then a LIST of the root
  and the manifest GET; the peers create boto3 clients (0.15-1 s each here, varying run to
  run) before their index GET.
- **warm**: a shard that keeps being read is held (`snapcache/store/random_access.py`), within
  half the read budget (`ReadOptions.prefetch_bytes`, by default a share of RAM up to 256 MiB,
  so all of this data): on local disk from its second row read alone in a handle, mapped
  read-only (a shard of up to 16 MiB, as here, with its pages populated and checked whole
  against its checksum, one hash; a larger one page by page as rows use them); on S3
  once its ranged GETs have cost what fetching it whole costs (each counted as its bytes plus
  1 MiB, the transfer one request's latency is worth), fetched whole once (one GET), checked
  against the shard's checksum. A row of a held shard is decoded from it without a system call
  or a request (~20 us of Python: the record batch's flatbuffer metadata, kept parsed for its
  next rows, ~10 us, then the row's offsets, shape and label, bounds-checked); a record batch
  is read whole, verified and kept decoded (later rows an index, ~6 us) once 64 of its rows
  were read alone (an Arrow decode and validation costs ~300 us, with 16 or 256 rows alike). The warm pass (every 97th example)
  touches every 1 MiB record batch but only one in five 64 KiB ones, so with 64 KiB batches a
  warm probe is mostly the first read of its record batch: before shards were held that was a
  file open, page reads and hashes locally (0.085 ms) and a ranged GET on S3 (5.5 ms), and a
  batch's second row decoded it whole (0.3 ms). With a budget far below the data (the
  `prefetch_bytes=8 MiB` row) shards and decoded batches do not all stay. Mosaic reads
  the sample from its (page-cached) shard file each time; LitData's default
  `batch_decode="auto"` decodes a batch of items around the one asked for and keeps none, and
  on S3 its `dataset[i]` is a range GET of the example every time (`on_demand_bytes`), warm or
  not. Numbers vary by 2-3x from run to run on this shared machine; ratios within a run are
  what to read.
"""


# -- the report -----------------------------------------------------------------------------------
def verdicts(rows: list[dict]) -> list[str]:
    out = []
    for storage in dict.fromkeys(r["storage"] for r in rows):
        peers = [r for r in rows if r["storage"] == storage
                 and not r["system"].startswith("snapcache") and "error" not in r]
        for name in OURS:
            ours = next((r for r in rows if r["storage"] == storage and r["system"] == name
                         and "error" not in r), None)
            if ours is None or not peers:
                out.append(f"- {storage}, {name}: not compared (it or every peer failed).")
                continue
            for key, what in (("cold_median_ms", "cold"), ("warm_median_ms", "warm"),
                              ("first_ms", "open + cold")):
                best = min(peers, key=lambda r: r[key])
                ratio = ours[key] / best[key]
                met = all(ours[key] < r[key] for r in peers)
                out.append(f"- {storage}, {what} median: {name} {ours[key]:.3f} ms vs "
                           f"{best['system']} {best[key]:.3f} ms (the faster peer) = "
                           f"{ratio:.2f}x: target (faster than both) "
                           f"{'**met**' if met else '**MISSED**'}.")
    return out


def report(args, rows: list[dict], elapsed: float) -> str:
    L = [START, "", "## Random access against LitData and Mosaic streaming", "",
         f"`{args.command}` (took {elapsed:.0f} s; 2 cores shared with other jobs, load "
         f"average {args.load} at the start, {load_average()} at the end). "
         f"{args.examples} examples local, {args.s3_examples} on the loopback S3 server (moto, "
         "as the tests use), of a 32x32x3 uint8 noise image and a label, in ~4 MiB shards, "
         "uncompressed in all three. Same random indices for every system; every read checks "
         "that the label equals the index. open: constructing the dataset object; cold: the "
         "first `dataset[i]` after open with every library cache empty (fresh object, fresh "
         "local cache folder, fsspec instances cleared; OS page cache not dropped), "
         f"{args.cold} opens locally and {args.s3_cold} on S3, so cold p99 is close to the "
         "maximum; warm: random `dataset[i]` on one object after a pass that touched every "
         f"shard ({args.warm} probes locally, {args.s3_warm} on S3); warm requests per read: "
         "the requests to the run's bucket in the loopback server's access log during the warm "
         "probes, per probe.", "",
         "Reads: snapcache `snapcache.open_snapshot(root)[i]`; LitData "
         "`litdata.StreamingDataset(dir)[i]` (S3: `StreamingDataset(Dir(path=cache, "
         "url='s3://...'), storage_options=...)`); Mosaic "
         "`streaming.StreamingDataset(local=dir, remote=None, batch_size=1)[i]` (S3: "
         "`remote='s3://...', local=cache`, endpoint from `S3_ENDPOINT_URL`). Versions: "
         f"{versions()}.", "",
         "| system | storage | shards | open | cold median | cold p99 | open + cold median "
         "| warm median | warm p99 | warm requests per read |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            L.append(f"| {r['system']} | {r['storage']} | failed: {r['error']} ||||||||")
            continue
        per = r.get("warm_requests")
        L.append(f"| {r['system']} | {r['storage']} | {r['shards']} | {r['open_ms']:.2f} ms | "
                 f"{r['cold_median_ms']:.2f} ms | {r['cold_p99_ms']:.2f} ms | "
                 f"{r['first_ms']:.2f} ms | {r['warm_median_ms']:.3f} ms | "
                 f"{r['warm_p99_ms']:.3f} ms | {'-' if per is None else f'{per:.2f}'} |")
    L += ["", "Target: `snap[i]` faster than both peers' `dataset[i]`.", ""]
    L += verdicts(rows)
    L += ["", WHY]
    if NOTES:
        L += ["", "What the run did to make the peers work:", ""]
        L += [f"- {n}" for n in dict.fromkeys(NOTES)]
    L += ["", END]
    return "\n".join(L)


def versions() -> str:
    out = [f"snapcache {sc.__version__}"]
    for name, importer in (("litdata", import_litdata), ("mosaicml-streaming", import_streaming)):
        try:
            out.append(f"{name} {importer().__version__}")
        except Exception:  # noqa: BLE001
            out.append(f"{name} not installed")
    return ", ".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--s3-examples", type=int, default=6_000)
    parser.add_argument("--cold", type=int, default=20)
    parser.add_argument("--s3-cold", type=int, default=8)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--s3-warm", type=int, default=100)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.command = "python -m benchmarks.bench_access" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-write")
    warnings.filterwarnings("ignore")
    args.load = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="snapcache-access-") as workdir:
        rows = local_rows(os.path.join(workdir, "local"), args.examples, args.cold, args.warm)
        if not args.no_s3:
            rows += s3_rows(os.path.join(workdir, "s3"), args.s3_examples, args.s3_cold,
                            args.s3_warm)
    text = report(args, rows, time.perf_counter() - started)
    print(text)
    if not args.no_write:
        from benchmarks.report import write_doc

        write_doc(text, START, END)


if __name__ == "__main__":
    main()
