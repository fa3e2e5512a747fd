"""The errors of S3 requests, worded once for both clients.

:class:`snapcache.store.fs_obstore.S3Client` and :class:`snapcache.store.fs_s3.S3fsClient`
each sort their library's failures into one of the kinds below; :func:`error` makes the
builtin exception of that kind, its message naming the object, the cause and the way out, so
that a failure reads the same whichever client served the request (a forked DataLoader worker
uses s3fs where its parent used obstore):

========================  ====================  =============================================
kind                      exception             when
========================  ====================  =============================================
:data:`NO_BUCKET`         FileNotFoundError     the bucket does not exist
:data:`MISSING`           FileNotFoundError     the object does not exist
:data:`EXISTS`            FileExistsError       a conditional create found the object there
:data:`REFUSED`           PermissionError       credentials refused or missing
:data:`UNREACHABLE`       ConnectionError       no answer: endpoint down, connection reset,
                                                timeout (the request may have been served)
:data:`FAILED`            OSError               any other failure the server reported
========================  ====================  =============================================
"""

from __future__ import annotations

NO_BUCKET = "no bucket"
MISSING = "missing"
EXISTS = "exists"
REFUSED = "refused"
UNREACHABLE = "unreachable"
FAILED = "failed"


def cause_of(error: BaseException) -> str:
    """The first line of ``error``'s message (its class name if it has none)."""
    text = str(error).strip().splitlines()
    return text[0][:400] if text else type(error).__name__


def error(kind: str, what: str, url: str, endpoint: str, cause: str) -> OSError:
    """The exception for a failed ``what`` (``"GET"``, ``"PUT"``, ...) of ``url``
    (``s3://bucket/key``) sent to ``endpoint`` ("" for AWS S3), ``cause`` being the client's
    own words (:func:`cause_of`)."""
    where = endpoint or "AWS S3"
    if kind == NO_BUCKET:
        return FileNotFoundError(2, f"the bucket of {url} does not exist on {where} "
                                    f"(create it, or check the URL)", url)
    if kind == MISSING:
        return FileNotFoundError(2, "No such file or S3 object", url)
    if kind == EXISTS:
        return FileExistsError(17, "S3 object exists", url)
    if kind == REFUSED:
        return PermissionError(13, f"{where} refused the {what} of {url} ({cause}): check the "
                                   f"credentials (storage_options key/secret/token or the "
                                   f"AWS_* variables) and their permissions on the bucket", url)
    if kind == UNREACHABLE:
        return ConnectionError(f"could not reach {where} for the {what} of {url} ({cause}): "
                               f"check the endpoint (storage_options client_kwargs.endpoint_url "
                               f"or AWS_ENDPOINT_URL) and the network")
    if kind == FAILED:
        return OSError(f"the {what} of {url} on {where} failed: {cause}")
    raise ValueError(f"unknown kind of S3 error {kind!r}")
