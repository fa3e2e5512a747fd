"""Sources from the ecosystem: Parquet files (local and S3) read lazily and split by file or
row group; fingerprinted by file identity and columns."""

from __future__ import annotations

import os

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import snapcache as sc
from snapcache.pipeline.ops import resumable
from snapcache.store import parquet

ROWS_PER_FILE = 12
ROW_GROUP = 5  # 3 row groups a file: 5 + 5 + 2


def table(first: int) -> pa.Table:
    ids = list(range(first, first + ROWS_PER_FILE))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"row {i}" for i in ids],
        "vec": pa.array([[float(i)] * (i % 3 + 1) for i in ids], pa.list_(pa.float32())),
        "pair": pa.array([[i, -i] for i in ids], pa.list_(pa.int16(), 2)),
        "flag": [i % 2 == 0 for i in ids],
    })


def write_files(base: str, count: int = 3) -> list[str]:
    """``count`` Parquet files written through fsspec (local folder or s3:// URL)."""
    urls = []
    for k in range(count):
        url = f"{base}/part-{k}.parquet"
        with fsspec.open(url, "wb") as f:
            pq.write_table(table(k * ROWS_PER_FILE), f, row_group_size=ROW_GROUP)
        urls.append(url)
    return urls


def test_rows_come_back_as_dicts_of_numpy_values_str_and_arrays(tmp_path):
    write_files(str(tmp_path))
    rows = list(sc.Dataset.from_parquet(str(tmp_path / "*.parquet")))
    assert [r["id"] for r in rows] == list(range(3 * ROWS_PER_FILE))
    row = rows[7]
    assert isinstance(row["id"], np.int64) and row["text"] == "row 7"
    assert row["vec"].dtype == np.float32 and row["vec"].tolist() == [7.0, 7.0]
    assert row["pair"].tolist() == [7, -7] and row["pair"].dtype == np.int16
    assert row["flag"] == np.False_
    row["vec"][0] = 1.0  # writable: a map may modify it in place

    folder = list(sc.Dataset.from_parquet(str(tmp_path), columns=["id"]))
    assert folder == [{"id": i} for i in range(3 * ROWS_PER_FILE)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 9])  # by file (count <= 3), by row group (> 3)
def test_streams_read_every_row_exactly_once(tmp_path, count):
    write_files(str(tmp_path))
    ds = sc.Dataset.from_parquet(str(tmp_path / "*.parquet"), columns=["id"])
    parts = [[r["id"] for r in ds.iterate(stream=(k, count))] for k in range(count)]
    everything = [i for part in parts for i in part]
    assert sorted(everything) == list(range(3 * ROWS_PER_FILE))
    assert all(parts) or count > 9  # every stream gets work here


def test_a_snapshot_written_as_streams_reads_back_whole(tmp_path, root, counter):
    write_files(str(tmp_path / "data"))

    def expensive(row):
        counter.hit()
        return {"id": row["id"], "twice": row["vec"] * 2}

    ds = sc.Dataset.from_parquet(str(tmp_path / "data")).map(expensive).snapshot(
        root, progress=False)
    parts = [[int(r["id"]) for r in ds.iterate(epoch=0, stream=(k, 4))] for k in range(4)]
    assert sorted(i for p in parts for i in p) == list(range(36))
    assert counter.count == 36
    assert sorted(int(r["id"]) for r in ds) == list(range(36))
    assert counter.count == 36
    assert resumable(ds._op.parent)


def test_skip_resumes_mid_stream(tmp_path):
    urls = write_files(str(tmp_path))
    for count in (1, 2, 5):
        for index in range(count):
            pieces = parquet.stream_pieces(urls, index, count)
            every = [r["id"] for r in parquet.read_pieces(pieces, ["id"])]
            for skip in (0, 1, 5, 7, len(every)):
                assert [r["id"] for r in parquet.read_pieces(pieces, ["id"], skip=skip)] == \
                    every[skip:]


def test_fingerprint_follows_file_identity_and_columns(tmp_path):
    urls = write_files(str(tmp_path))
    pattern = str(tmp_path / "*.parquet")
    a = sc.Dataset.from_parquet(pattern).fingerprint()
    assert sc.Dataset.from_parquet(pattern).fingerprint() == a
    assert sc.Dataset.from_parquet(pattern, columns=["id"]).fingerprint() != a
    pq.write_table(table(100), urls[1], row_group_size=ROW_GROUP)
    st = os.stat(urls[1])
    os.utime(urls[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert sc.Dataset.from_parquet(pattern).fingerprint() != a


def test_unstorable_columns_and_bad_arguments_raise_with_a_hint(tmp_path):
    path = str(tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"a": [1, None], "s": pa.array([{"x": 1}, {"x": 2}])}), path)
    with pytest.raises(sc.UnsupportedValueError, match="nulls.*columns="):
        list(sc.Dataset.from_parquet(path, columns=["a"]))
    with pytest.raises(sc.UnsupportedValueError, match="struct"):
        list(sc.Dataset.from_parquet(path, columns=["s"]))
    with pytest.raises(TypeError, match="columns"):
        sc.Dataset.from_parquet(path, columns="a")
    with pytest.raises(FileNotFoundError):
        sc.Dataset.from_parquet(str(tmp_path / "missing-*.parquet"))


def test_parquet_on_s3_is_read_split_and_snapshotted(s3_root):
    data = s3_root.rsplit("/", 1)[0] + "/data"
    write_files(data)
    ds = sc.Dataset.from_parquet(data + "/*.parquet", columns=["id", "text"])
    assert [r["id"] for r in ds] == list(range(36))
    parts = [[r["id"] for r in ds.iterate(stream=(k, 2))] for k in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(36)) and parts[0] and parts[1]
    tree = ds._op.fingerprint_children("source")[0]
    assert "etag" in tree.children[0].summary
    snap = ds.snapshot(s3_root, progress=False)
    assert [r["text"] for r in snap] == [f"row {i}" for i in range(36)]
    assert [r["text"] for r in snap] == [f"row {i}" for i in range(36)]
