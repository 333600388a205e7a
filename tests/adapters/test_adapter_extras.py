"""A framework adapter imported without its framework says which extra to install (a real import failure:
a subprocess whose meta-path finder refuses the framework's modules)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_BLOCKED = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {blocked!r} or name.startswith({blocked!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
try:
    {statement}
except ModuleNotFoundError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize(
    ("blocked", "statement", "extra"),
    [
        ("langchain_core", "from specprefill_langchain import ChatSpecPrefill", "langchain"),
        ("langchain_core", "import specprefill_langchain.chat_models", "langchain"),
        ("langchain", "from specprefill_langchain import SpecPrefillMiddleware", "langchain"),
        ("llama_index", "from specprefill_llamaindex import SpecPrefillLLM", "llamaindex"),
        ("litellm", "from specprefill_litellm import SpecPrefillCallback", "litellm"),
    ],
)
def test_a_missing_extra_names_the_install_command(blocked: str, statement: str, extra: str) -> None:
    code = textwrap.dedent(_BLOCKED).format(blocked=blocked, statement=statement)
    env = {"PYTHONPATH": f"{ROOT / 'adapters'}:{ROOT}", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"pip install 'specprefill-sdk[{extra}]'" in done.stdout
