"""`FileStepStore`: one directory per run, append-only JSON lines, snapshots as small files.

Layout under the store directory (SPEC section 4, plus the files that make it cheap and safe):

```
<dir>/_index/runs.jsonl           one line per registered (or deleted) run: the index list_runs reads
<dir>/_index/trash/               a deleted run's folder, moved here in one rename, then removed
<dir>/<run>/run.json              the RunRecord (written once, exclusively)
<dir>/<run>/status.json           how the run ended (written by its closing event)
<dir>/<run>/events.jsonl          one StepEvent per line
<dir>/<run>/tool_effects.jsonl    one ToolEffectRecord per line; the last line of a call wins
<dir>/<run>/messages.jsonl        the run's message log: {"i": log index, "p": position, "m": message}
<dir>/<run>/snapshots/<seq>.json  one snapshot: its fields plus {"message_count", "log_size"}
<dir>/<run>/snapshot-keys.jsonl   one line per saved snapshot: {"seq", "state", "key"}
<dir>/media/                      the default DiskMediaStore
```

`<run>` is the run id when it is a plain file name on every system (`[A-Za-z0-9_.-]`, no `..`, no
trailing `.`, not a Windows device name such as `CON`), else `~` and the id's SHA-256 (ids like
`job:123`). A message-once snapshot file holds two numbers instead of its
history (see `store.history`), so a boundary costs the same at step 500 as at step 5.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Literal

from ...._errors import check_bool
from ...._files import store_path
from ....media._protocol import MediaStore
from ...base import StepStoreBase
from ._backend import FileBackend
from ._paths import MEDIA_DIR

__all__ = ['FileStepStore']


class FileStepStore(StepStoreBase):
    """A `StepStore` in a directory tree of JSON files, safe for several processes at once.

    ```python
    from pydantic_ai_steps.step_persistence import FileStepStore

    store = FileStepStore('runs', max_snapshots_per_run=8)
    ```

    `max_snapshots_per_run` bounds the snapshots kept per run (the N newest plus the newest
    `complete` one). Payloads of `media_threshold_bytes` or more go to `media_store` (default a
    `DiskMediaStore` in `<directory>/media`; `None` keeps them inline). Files are created readable
    by their owner only, and the store never follows a link planted in its directory: an entry
    that is a link or another user's is refused by writes and skipped, with a warning, by reads.

    What survives what:

    - *A process crash* (exception, `SIGKILL`, OOM kill) loses nothing a store call had returned
      from: every write is in the operating system's cache the moment the call returns. A call cut
      short leaves at most a torn last line or a stray temporary file, which readers skip;
      `prune` and `collect_garbage` remove such a file once it is an hour old.
    - *Power loss or a kernel crash* with `durable=False` (the default) can lose the writes of
      the last few seconds, and the file system may keep some of them but not others. Readers still
      never raise: a snapshot whose messages did not all reach the disk is skipped for an older
      complete one. A run folder whose index line was lost is found again by a scan.
    - With `durable=True` every call `fsync`s the files it wrote, and the directory when it
      created an entry, before returning, so a returned call survives power loss too (on a disk
      that honours flushes). This costs a disk flush per call: milliseconds, not microseconds.

    Several processes may share one directory. Appends and snapshot writes to the same run are
    serialized with `flock` (POSIX only: on Windows, keep each run to one process).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        durable: bool = False,
        max_run_age: timedelta | None = None,
    ) -> None:
        check_bool(durable, 'durable')
        root = Path(store_path(directory, 'FileStepStore', directory=True))
        owned = media_store == 'auto'
        if media_store == 'auto':
            from ....media.stores.disk import DiskMediaStore

            media_store = DiskMediaStore(root / MEDIA_DIR, durable=durable)
        super().__init__(
            FileBackend(root, durable=durable),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            max_run_age=max_run_age,
            owns_media_store=owned,
        )
        self.durable = durable
        self._root = root

    @property
    def directory(self) -> Path:
        """The directory this store writes under."""
        return self._root

    def __repr__(self) -> str:
        return (
            f'FileStepStore({str(self._root)!r}, max_snapshots_per_run={self.max_snapshots_per_run}, '
            f'media_store={self.media_store!r}, durable={self.durable})'
        )
