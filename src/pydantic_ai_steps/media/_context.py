"""`MediaContext`: the per-operation bag every media store method and user callable receives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_NO_METADATA: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, kw_only=True)
class MediaContext:
    """What is known about a payload when it is stored or read.

    All fields default, so callers pass what they have. Stores persist `metadata`; database stores
    and S3 also keep `media_type` (as a column or `Content-Type`). `filename` is informational and
    is not persisted by the shipped stores.
    """

    media_type: str | None = None
    filename: str | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: _NO_METADATA)


EMPTY_CONTEXT = MediaContext()
"""The shared context used when a caller passes none."""
