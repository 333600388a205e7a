"""LangChain's own standard test suites (`langchain-tests`) for `ChatSpecPrefill` on SmolLM2."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_tests")

from adapter_helpers import MODEL_SETTINGS
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from specprefill_langchain import ChatSpecPrefill

#: The default policy, as users get it: it prefills these short test prompts whole (no draft run),
#: which keeps the suite fast on CPU; compression itself is asserted in test_adapter_langchain.py.
PARAMS: dict[str, Any] = dict(MODEL_SETTINGS)


class TestChatSpecPrefillUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatSpecPrefill]:
        return ChatSpecPrefill

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(PARAMS)

    @property
    def supports_model_override(self) -> bool:
        return False


@pytest.mark.slow
class TestChatSpecPrefillIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatSpecPrefill]:
        return ChatSpecPrefill

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {"max_tokens": 4}  # few tokens keep the suite fast on CPU

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(PARAMS)

    @property
    def supports_model_override(self) -> bool:
        return False
