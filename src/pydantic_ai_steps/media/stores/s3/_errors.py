"""The failures of `S3MediaStore`: one type per failure class, each naming the bucket and key."""

from __future__ import annotations

from ..._errors import MediaIntegrityError


class S3Error(RuntimeError):
    """Base of every S3MediaStore failure; names the operation, bucket and key, never a credential.

    A `RuntimeError`, as the upstream store's S3 failures are, so `except RuntimeError` keeps
    working; the subclasses are also the matching built-in (`PermissionError`,
    `FileNotFoundError`, `ConnectionError`) where there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        bucket: str,
        key: str,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.bucket = bucket
        self.key = key
        self.status = status
        self.code = code
        self.request_id = request_id


class S3AuthError(S3Error, PermissionError):
    """401/403 (or a credential error code): wrong credentials, token or region, a skewed clock, no permission."""


class S3NotFound(S3Error, FileNotFoundError):
    """The object does not exist (a `FileNotFoundError`, as the MediaStore protocol requires)."""


class S3RequestError(S3Error):
    """Any other 4xx (or 3xx) answer: the request itself is wrong (e.g. no such bucket); never retried."""


class S3ThrottledError(S3Error):
    """The server kept asking us to slow down (429, `SlowDown`) until the retries ran out."""


class S3ServerError(S3Error):
    """The server kept failing (5xx) until the retries ran out."""


class S3ConnectionError(S3Error, ConnectionError):
    """The server could not be reached or did not answer in time, on every attempt."""


class S3IntegrityError(S3Error, MediaIntegrityError):
    """The bytes read back do not hash to the digest they are stored under (read as missing, like every store)."""
