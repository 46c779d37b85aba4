"""The one error type the CLI prints as a single line instead of a traceback."""

from __future__ import annotations


class CliError(Exception):
    """A mistake the user can fix (bad URL, missing store, unknown run): shown as one line, exit 1.

    Raising this rather than printing and exiting keeps commands testable as plain functions and
    keeps the exit-code policy in one place (`_app.main`).
    """
