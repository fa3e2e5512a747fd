"""A process that builds (or reads) a delta snapshot: ``python delta_child.py SRC ROOT OUT
[INDEX COUNT]`` (with INDEX and COUNT: as stream INDEX of COUNT).

Each map call appends the file's name to ``$DELTA_CALLS``; the examples read are written to OUT
as JSON. ``SNAPCACHE_TEST_DELTA_PAUSE`` (see ``delta_segment._crash_hook``) makes the build stop
after its first segment until the parent deletes the pause file (or kills this process)."""

import json
import os
import sys

import snapcache as sc
from snapcache.pipeline import delta_plan


def load(path):
    with open(os.environ["DELTA_CALLS"], "a") as f:
        f.write(os.path.basename(path) + "\n")
    with open(path) as f:
        return {"name": os.path.basename(path), "value": int(f.read())}


def main(src, root, out, index=None, count=None):
    delta_plan.SEGMENT_UNITS = 4
    ds = (sc.Dataset.from_files(os.path.join(src, "*.txt")).map(load)
          .snapshot(root, delta=True, progress=False, lease_ttl=5.0))
    stream = None if index is None else (int(index), int(count))  # stream i of n's share
    got = sorted([x["name"], int(x["value"])] for x in ds.iterate(epoch=0, stream=stream))
    with open(out, "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
