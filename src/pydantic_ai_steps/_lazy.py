"""Lazy attribute loading for package `__init__` modules.

Stores with optional drivers (pymongo, asyncpg) are imported on first use, so importing the
package, or `from package import *`, works without the extras installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_loader(package: str, targets: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a module `__getattr__` resolving each name in `targets` from its submodule."""

    def __getattr__(name: str) -> Any:
        module_name = targets.get(name)
        if module_name is None:
            raise AttributeError(f'module {package!r} has no attribute {name!r}')
        module = importlib.import_module(module_name, package)
        return getattr(module, name)

    return __getattr__


def installed(distribution_module: str) -> bool:
    """Whether an optional driver can be imported (used to keep star imports working)."""
    return importlib.util.find_spec(distribution_module) is not None
