"""The keep-set rule for `max_snapshots_per_run`, written once for every store.

Keep the N newest snapshots, plus the newest `complete` one. The extra keeps the default read
(`latest_snapshot()`, complete only) correct when the N newest are all `interrupted`, so the
kept set can hold N + 1 snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._records import SnapshotState


def snapshots_to_keep(entries: Iterable[tuple[int, SnapshotState]], limit: int | None) -> set[int] | None:
    """Return the seqs to keep from `(seq, state)` pairs, or `None` when nothing is pruned."""
    if limit is None:
        return None
    ordered = sorted(entries, key=lambda entry: entry[0], reverse=True)
    if len(ordered) <= limit:
        return None
    keep = {seq for seq, _ in ordered[:limit]}
    newest_complete = next((seq for seq, state in ordered if state == 'complete'), None)
    if newest_complete is not None:
        keep.add(newest_complete)
    return keep
