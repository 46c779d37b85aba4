"""The example backend of `docs/backends.md`, run as written against both conformance suites."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

PAGE = Path(__file__).parent.parent / 'docs' / 'backends.md'
BACKEND_SOURCE, TESTS_SOURCE = re.findall(r'```python\n(.*?)```', PAGE.read_text(), flags=re.DOTALL)

shelf_backend = types.ModuleType('shelf_backend')
sys.modules['shelf_backend'] = shelf_backend
exec(compile(BACKEND_SOURCE, f'{PAGE}:backend', 'exec'), shelf_backend.__dict__)
_tests: dict[str, object] = dict(shelf_backend.__dict__)
exec(compile(TESTS_SOURCE, f'{PAGE}:tests', 'exec'), _tests)
TestShelfBackend = _tests['TestShelfBackend']
TestShelfStepStore = _tests['TestShelfStepStore']


def test_the_example_backend_is_at_most_200_lines() -> None:
    assert len(BACKEND_SOURCE.splitlines()) <= 200
