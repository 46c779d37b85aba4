from __future__ import annotations

import pytest

from pydantic_ai_steps.step_persistence import InMemoryStepStore
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory


class TestInMemoryStepStore(StepStoreConformance):
    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return lambda **options: InMemoryStepStore(**options)
