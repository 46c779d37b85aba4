"""Reading a run's message log back: which entry holds each position of a snapshot, patches applied.

The writing side (`history.HistoryTracker`, `message_log.MessageLog`) decides what a boundary
appends; every store's reads come here to turn the entries of a snapshot's log back into its
message texts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .patch import apply_ops, is_patch, patch_ops


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message version in a run's message log."""

    index: int
    position: int
    text: str


def resolve_history(entries: Iterable[LogEntry], message_count: int, log_size: int) -> list[str] | None:
    """The message texts of a snapshot, or `None` if a position has no entry or an unusable patch.

    A patch is resolved against its base entry, which must be among `entries` (within `log_size`),
    hold the same position at a smaller index, and be a full text; otherwise the snapshot is damaged.
    """
    latest: list[LogEntry | None] = [None] * message_count
    kept: list[LogEntry] = []
    for entry in entries:
        if entry.index < log_size and entry.position < message_count:
            kept.append(entry)
            current = latest[entry.position]
            if current is None or current.index < entry.index:
                latest[entry.position] = entry
    texts: list[str] = []
    by_index: dict[int, LogEntry] | None = None
    for entry in latest:
        if entry is None:
            return None
        text = entry.text
        if is_patch(text):
            if by_index is None:
                by_index = {item.index: item for item in kept}
            resolved = _resolve_patch(entry, by_index)
            if resolved is None:
                return None
            text = resolved
        texts.append(text)
    return texts


def resolve_log(
    entries: Iterable[LogEntry],
    missing: Collection[range],
    readable_end: int | None,
    message_count: int,
    log_size: int,
) -> list[str] | None:
    """`resolve_history`, distrusting whatever a missing (unreadable) entry could have superseded.

    A missing index below `log_size` (in a range of unreadable entries, or one at or past `readable_end`) could
    have held a newer version of any position, so each position's newest entry must lie above the
    highest such index. A history written in full after the damage reads; one that depended on
    the lost entry does not, rather than being rebuilt from an older version in silence.
    """
    gap = max((min(gap.stop, log_size) - 1 for gap in missing if gap.start < log_size), default=-1)
    if readable_end is not None and log_size > readable_end:
        gap = log_size - 1
    if gap >= 0:
        entries = [entry for entry in entries if entry.index > gap]
    return resolve_history(entries, message_count, log_size)


def _resolve_patch(entry: LogEntry, by_index: Mapping[int, LogEntry]) -> str | None:
    try:
        base_index, ops = patch_ops(entry.text)
        base = by_index.get(base_index)
        if base is None or base.position != entry.position or base.index >= entry.index or is_patch(base.text):
            return None
        return apply_ops(ops, base.text)
    except (ValueError, RecursionError):
        return None
