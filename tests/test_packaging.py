"""What a PyPI user gets: the sdist and the wheel as built from this tree, the wheel installed into a
fresh venv, and the install hint of a hub model that is not downloaded."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from specprefill_sdk.errors import ModelLoadError
from specprefill_sdk.models import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]


def test_a_hub_id_not_in_the_cache_says_how_to_download_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache, whatever this machine has
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"hf download HuggingFaceTB/SmolLM2-360M-Instruct$"):
        resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct")


def test_a_missing_path_gets_no_download_hint(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model") as info:
        resolve_model_path(str(tmp_path / "no-such-folder"))
    assert "hf download" not in str(info.value)


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{cmd[:4]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel, built by hatchling's PEP 517 hooks (what `python -m build` calls)."""
    out = tmp_path_factory.mktemp("dist")
    code = (
        "import sys\n"
        "try:\n    import hatchling.build as b\n"
        "except ImportError:\n    sys.exit('hatchling is not installed: run `make install` (the dev group)')\n"
        f"print(b.build_sdist({str(out)!r})); print(b.build_wheel({str(out)!r}))\n"
    )
    sdist, wheel = _run([sys.executable, "-c", code], cwd=ROOT).split()
    return out / sdist, out / wheel


@pytest.mark.slow
def test_sdist_ships_the_license_and_not_the_benchmark_results(dists):
    with tarfile.open(dists[0]) as sdist:
        names = sdist.getnames()
    top = names[0].split("/")[0]
    assert f"{top}/LICENSE" in names
    assert f"{top}/pyproject.toml" in names and f"{top}/specprefill_sdk/py.typed" in names
    assert f"{top}/benchmarks/_common.py" in names  # the benchmark scripts ship ...
    # ... their results do not, neither directly nor through the docs' link to them
    assert not [n for n in names if n.startswith((f"{top}/benchmarks/results", f"{top}/docs/results"))]


@pytest.mark.slow
def test_wheel_ships_license_py_typed_and_policies(dists):
    with zipfile.ZipFile(dists[1]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    for package in ("specprefill_sdk", "specprefill_langchain", "specprefill_llamaindex", "specprefill_litellm"):
        assert f"{package}/py.typed" in names
    shipped = {Path(n).name for n in names if n.startswith("specprefill_sdk/_policies/")}
    assert shipped == {p.name for p in (ROOT / "policies").glob("*.toml")}
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    assert "License-Expression: Apache-2.0" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "Provides-Extra: dev" not in metadata  # no test tools published, in any extra
    assert requires and not [line for line in requires if any(t in line for t in ("pytest", "ruff", "mypy", "mkdocs"))]


@pytest.mark.slow
def test_wheel_installed_into_a_fresh_venv_imports_and_runs(dists, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    # The dependencies come from the environment running the tests, as --system-site-packages would give
    # them if that environment were not itself a venv. A plain path entry: the .pth files there (the
    # editable install of this tree among them) are not processed, so only the wheel provides the SDK.
    fresh_site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp_path)
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(fresh_site.strip()) / "outer-env.pth").write_text("\n".join(outer) + "\n")
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(dists[1])],
        cwd=tmp_path,
    )

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    code = (
        "import importlib.metadata, specprefill_sdk, specprefill_sdk.policies as p; "
        "print(specprefill_sdk.__file__); print(importlib.metadata.version('specprefill-sdk')); "
        "print(','.join(sorted(p.list_policies())))"
    )
    where, version, policies = _run([str(python), "-c", code], cwd=tmp_path, env=env).split()
    assert Path(where).is_relative_to(venv), where
    assert version == dists[1].name.split("-")[1]
    assert set(policies.split(",")) >= {p.stem for p in (ROOT / "policies").glob("*.toml")}
    help_text = _run([str(venv / "bin" / "specprefill"), "--help"], cwd=tmp_path, env=env)
    assert "serve" in help_text and "run" in help_text
