from __future__ import annotations

from pathlib import Path

import pytest

from pydantic_ai_steps.step_persistence import FileStepStore
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory


class TestFileStepStore(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', **options)


class TestFileStepStoreInlineMedia(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', media_store=None, **options)


class TestFileStepStoreDurable(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', durable=True, **options)
