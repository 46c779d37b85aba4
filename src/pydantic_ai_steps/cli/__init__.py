"""The `pydantic-ai-steps` command: a demo of step persistence and an inspector for its stores.

`main(argv)` returns the exit code (the console script exits with it). Stores are named by URL;
`_stores.register_backend` is where a new backend's scheme goes.
"""

from __future__ import annotations

from ._app import main

__all__ = ['main']
