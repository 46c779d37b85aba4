from __future__ import annotations

from pathlib import Path

import pytest

from pydantic_ai_steps.step_persistence import FileStepStore
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory

from ._round_trip import round_trip_property


class TestFileStepStore(StepStoreConformance):
    persistent = True
    test_arbitrary_histories_round_trip_exactly = round_trip_property()

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', **options)


class TestFileStepStoreInlineMedia(StepStoreConformance):
    persistent = True
    test_arbitrary_histories_round_trip_exactly = round_trip_property()

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', media_store=None, **options)


class TestFileStepStoreDurable(StepStoreConformance):
    persistent = True
    test_arbitrary_histories_round_trip_exactly = round_trip_property()

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: FileStepStore(tmp_path / 'steps', durable=True, **options)
