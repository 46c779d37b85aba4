"""Lazy attribute loading for package `__init__` modules.

Stores with optional drivers (pymongo, asyncpg) are imported on first use, so importing the
package, or `from package import *`, works without the extras installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

EXTRAS = {'pymongo': 'mongodb', 'asyncpg': 'postgres'}
"""Driver module -> the extra that installs it, for error messages."""


def lazy_loader(package: str, targets: Mapping[str, tuple[str, str | None]]) -> Callable[[str], Any]:
    """Return a module `__getattr__` resolving each name from `(submodule, driver or None)`."""

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f'module {package!r} has no attribute {name!r}')
        module_name, driver = target
        if importlib.util.find_spec(module_name, package) is None:
            raise ImportError(f'{name} is not part of this version of pydantic-ai-steps')
        if driver is not None and not installed(driver):
            raise ImportError(
                f'{name} needs the {driver!r} driver: pip install "pydantic-ai-steps[{EXTRAS.get(driver, driver)}]"'
            )
        module = importlib.import_module(module_name, package)
        return getattr(module, name)

    return __getattr__


def star_exports(package: str, targets: Mapping[str, tuple[str, str | None]]) -> list[str]:
    """The lazy names a star import can load here: shipped, and with their driver installed."""
    return [
        name
        for name, (module_name, driver) in targets.items()
        if importlib.util.find_spec(module_name, package) is not None and (driver is None or installed(driver))
    ]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
