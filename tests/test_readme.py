"""Every Python example in the README runs, as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / 'README.md'
EXAMPLES = re.findall(r'```python\n(.*?)```', README.read_text(), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize('source', EXAMPLES, ids=[f'example-{i}' for i in range(len(EXAMPLES))])
def test_readme_example_runs(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(source, str(README), 'exec'), {'__name__': '__readme__'})
