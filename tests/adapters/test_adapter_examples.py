"""The LangChain and LlamaIndex examples run as written (the litellm one: test_adapter_litellm.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kept(output: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"kept (\d+)/(\d+) tokens", output)]


@pytest.mark.slow
def test_langchain_example(capsys) -> None:
    pytest.importorskip("langchain_classic")
    assert _load("langchain_rag").main(["--doc-chars", "600", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    kept = _kept(out)
    assert len(kept) == 3 and any(a < b for a, b in kept)
    assert "doc-4 kb/4.txt" in out  # the harbour note is retrieved
    assert re.search(r"prefilled (\d+) of (\d+) prompt tokens", out)
    assert "Answer:" in out


@pytest.mark.slow
def test_llamaindex_example(capsys) -> None:
    pytest.importorskip("llama_index.core")
    assert _load("llamaindex_query_engine").main(["--doc-chars", "500", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    kept = _kept(out)
    assert kept and all(a <= b for a, b in kept)
    assert "kb/3.txt" in out and "Answer:" in out
