"""`python -m pydantic_ai_steps.cli`: the console script without relying on it being on PATH."""

from __future__ import annotations

import sys

from ._app import main

if __name__ == '__main__':
    sys.exit(main())
