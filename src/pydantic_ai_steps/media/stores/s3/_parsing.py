"""Reading what S3 answers: its XML documents (errors, listings, upload ids) and its dates.

Server answers are small, so one parser serves them all, and it refuses DTDs outright rather
than trust the XML parser's entity limits.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from xml.etree import ElementTree

from ...._records import utc_now


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a ListObjectsV2 answer: `(key, size, LastModified)` of each object."""

    objects: list[tuple[str, int, datetime]]
    truncated: bool
    next_token: str | None


def xml_field(content: bytes, name: str) -> str | None:
    """The text of the first element called `name` anywhere in the document, or `None`."""
    root = _parse_xml(content)
    if root is None:
        return None
    for element in root.iter():
        if _local(element.tag) == name:
            return (element.text or '').strip()
    return None


def error_document(content: bytes) -> tuple[str | None, str | None, str | None] | None:
    """(Code, Message, RequestId) of an S3 `<Error>` document, or None if `content` is not one."""
    root = _parse_xml(content)
    if root is None or _local(root.tag) != 'Error':
        return None
    fields: dict[str, str] = {}
    for child in root:
        fields[_local(child.tag)] = (child.text or '').strip()
    return fields.get('Code') or None, fields.get('Message') or None, fields.get('RequestId') or None


def listing(content: bytes) -> Page | None:
    """Parse a ListObjectsV2 answer (`None` if it is not one)."""
    root = _parse_xml(content)
    if root is None or _local(root.tag) != 'ListBucketResult':
        return None
    objects: list[tuple[str, int, datetime]] = []
    truncated, token = False, None
    for child in root:
        name = _local(child.tag)
        if name == 'Contents':
            fields = {_local(field.tag): field.text or '' for field in child}
            size = fields.get('Size', '').strip()
            modified = _iso_date(fields.get('LastModified', ''))
            # A time that cannot be read is taken as now: such an object is never collected.
            objects.append((fields.get('Key', ''), int(size) if size.isdigit() else 0, modified or utc_now()))
        elif name == 'IsTruncated':
            truncated = (child.text or '').strip().lower() == 'true'
        elif name == 'NextContinuationToken':
            token = (child.text or '').strip() or None
    return Page(objects, truncated, token)


def http_date(text: str | None) -> datetime | None:
    """An HTTP date (`Last-Modified: Wed, 01 May 2024 12:00:00 GMT`), aware UTC; `None` if absent or unreadable."""
    if not text:
        return None
    try:
        value = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return _as_utc(value)


def _iso_date(text: str) -> datetime | None:
    """An ISO 8601 time as S3 lists it (`2024-05-01T12:00:00.000Z`), aware UTC; `None` if unreadable."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return _as_utc(value)


def _as_utc(value: datetime) -> datetime:
    """A naive time read as UTC; an aware one converted to it."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _parse_xml(content: bytes) -> ElementTree.Element | None:
    if not content.lstrip().startswith(b'<') or b'<!DOCTYPE' in content or b'<!ENTITY' in content:
        return None
    try:
        return ElementTree.fromstring(content)
    except ElementTree.ParseError:
        return None


def _local(tag: str) -> str:
    """An element's name without its namespace."""
    return tag.rsplit('}', 1)[-1]
