"""`python -m pydantic_ai_steps ...` is the `pydantic-ai-steps` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
