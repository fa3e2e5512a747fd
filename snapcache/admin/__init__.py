"""See, verify and reclaim what a snapshot root holds: the API behind ``snapcache ls``,
``info``, ``verify`` and ``purge``.

Example::

    import snapcache

    for snap in snapcache.ls("s3://bucket/snaps"):
        print(snap.short_id, snap.name, snap.state, snap.size_bytes, snap.last_used)
    report = snapcache.purge("s3://bucket/snaps", older_than="30d", dry_run=True)
    print(f"would free {report.freed_bytes} bytes")

Every function takes a root (a local folder or an fsspec URL; default ``$SNAPCACHE_ROOT``, else
``~/.cache/snapcache``) and raises ``FileNotFoundError`` if it does not exist, ``ValueError``
for an unknown or ambiguous snapshot id or a malformed size or duration.
"""

from snapcache.admin.inventory import STATES, SnapshotInfo, info, ls
from snapcache.admin.purge import OldVersions, PurgeItem, PurgeReport, purge
from snapcache.admin.verify import SnapshotCheck, VerifyProgress, VerifyReport, verify
from snapcache.units import format_size, parse_duration, parse_size

__all__ = [
    "STATES", "SnapshotInfo", "ls", "info",
    "OldVersions", "PurgeItem", "PurgeReport", "purge",
    "SnapshotCheck", "VerifyProgress", "VerifyReport", "verify",
    "format_size", "parse_duration", "parse_size",
]
