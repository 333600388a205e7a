"""`TransformersBackend`: the in-process target model (Hugging Face transformers, CPU or CUDA).

It prefills the kept tokens of a `CompressedPrompt` at their *original* position ids into a compact
KV cache (one slot per kept token), then decodes at positions ``n, n+1, ...``. Every forward pass
gets explicit ``position_ids`` (for RoPE). Slot ``j`` is visible to a query at position ``p`` when
``position[j] <= p``: where slot order is position order (one row, no padding, global attention: a
fresh prefill and its decode steps) that is transformers' own causal mask, so none is passed and
SDPA keeps its fused causal kernels; otherwise the pass gets an explicit 4-D mask built from
positions. A cache is always passed, so transformers never reads gaps in the position ids as
packed sequences.

Example::

    backend = TransformersBackend("smollm2-135m", device="cpu")
    prompt = CompressedPrompt(token_ids=(1, 504, 2143), position_ids=(0, 7, 9), n=10)
    print(backend.generate(prompt, SamplingParams(max_tokens=16)).text)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._cancel import check_cancelled
from .._timing import elapsed_ms as _ms
from ..cost import CostCurve, WarmUpReport, warm_up, warmup_lengths, warmup_token_ids
from ..errors import ContextTooLongError, InvalidRequestError
from ..interfaces import BackendCapabilities
from ..models import LoadedModel, cache_argument, forward_parameters, load_model, text_config
from ..runtime.lean import LeanModel
from ..runtime.norms import fused_norms, install_fused_norms
from ..runtime.settings import ExecutionSettings
from ..types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    FinishReason,
    Prompt,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
    int64_tensor,
)
from ._detok import TextAssembler
from ._sampling import TokenSampler, token_logprob
from .base import BackendBase

__all__ = ["KVState", "TransformersBackend"]

logger = logging.getLogger(__name__)

#: Kept tokens per forward pass of a prefill that needs an explicit (quadratic) position mask.
DEFAULT_PREFILL_CHUNK = 4096
#: Kept tokens per forward pass of a prefill in position order (no mask: activations only).
DEFAULT_UNMASKED_CHUNK = 32768
#: Prompts per padded batch in `TransformersBackend.generate_batch`.
DEFAULT_MAX_BATCH = 16


@dataclass
class KVState:
    """A compact target KV cache: slot ``j`` holds token ``token_ids[b, j]`` at original position ``positions[b, j]``.

    ``valid`` marks real slots (left padding of a batch is not valid). ``next_positions[b]`` is the
    position the next fed token gets; ``logits[b]`` (float32) predicts the token at that position.
    Slots need not be sorted by position: attention is masked by position, not by slot order.
    """

    cache: Any
    positions: torch.Tensor  # [B, S] int64, CPU
    valid: torch.Tensor  # [B, S] bool, CPU
    token_ids: torch.Tensor  # [B, S] int64, CPU
    next_positions: list[int] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [B, V] float32, on the model's device
    #: tokens the last `TransformersBackend.prefill` ran through the model (per row)
    last_prefilled: int = 0

    @property
    def batch_size(self) -> int:
        return int(self.positions.shape[0])

    @property
    def slots(self) -> int:
        """Cache slots per row (padding included)."""
        return int(self.positions.shape[1])

    @property
    def next_position(self) -> int:
        """The next position of a single-row state."""
        self._single()
        return self.next_positions[0]

    def cached_positions(self) -> list[int]:
        """Original positions held by a single-row state, in slot order."""
        self._single()
        return [int(p) for p, v in zip(self.positions[0].tolist(), self.valid[0].tolist(), strict=True) if v]

    def cached_tokens(self) -> dict[int, int]:
        """``{position: token id}`` of a single-row state."""
        self._single()
        return {
            int(p): int(t)
            for p, t, v in zip(
                self.positions[0].tolist(), self.token_ids[0].tolist(), self.valid[0].tolist(), strict=True
            )
            if v
        }

    def _single(self) -> None:
        if self.batch_size != 1:
            raise ValueError(f"this operation needs a single-row KVState, got {self.batch_size} rows")


def _mask_style(net: Any) -> str | None:
    """``sdpa`` or ``eager`` (the mask each wants), also through a wrapper such as ``specprefill_sdpa``.

    A draft scorer sharing the model registers a wrapper named ``<prefix>_<base>`` that delegates to the
    base implementation; its masks are the base's, so the backend leaves it in place.
    """
    impl = str(getattr(net.config, "_attn_implementation", None) or "")
    for base in ("sdpa", "eager"):
        if impl == base or impl.endswith("_" + base):
            return base
    return None


def _cache_layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers DynamicCache")
    return [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0]


class TransformersBackend(BackendBase):
    """Exact speculative prefill on a Hugging Face causal LM: kept tokens at original positions.

    Args:
        model: a model spec for `load_model` (bundled name, folder, ``.gguf``, cached hub id) or a
            `LoadedModel` (shared, e.g. with a draft scorer).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ... (only when loading by name).
        dtype: ``"auto"`` (bf16), ``"float32"``, ... (only when loading by name).
        prefill_chunk: kept tokens per forward pass of a prefill that needs an explicit position mask
            (its memory grows with the square of the chunk).
        unmasked_chunk: kept tokens per forward pass of a prefill whose tokens come in position order
            after everything cached (one row, global attention): no mask is built, so the pass is
            bounded by activation memory only.
        max_batch_size: prompts per padded batch in `generate_batch`.
        execution: how the forward passes run (`ExecutionSettings`); the backend reads its
            ``fused_norms`` (the norms inside this backend's passes, where short prompts on a GPU
            are bound by the host's kernel launches), ``lean`` (a prefill into an empty cache, one
            row in position order, computed from the weights) and ``compile`` (that prefill's
            element-wise work fused by `torch.compile`, weights packed in place as for the scorer;
            by default on for a CUDA device, `ExecutionSettings.compile`). Any other field set away
            from its default is refused. None: the defaults. `warmup` compiles and measures.

    Example::

        backend = TransformersBackend("smollm2-135m")
        completion = backend.generate(CompressedPrompt.dense(prompt), SamplingParams(max_tokens=32))
    """

    provider_name = "transformers"

    def __init__(
        self,
        model: str | LoadedModel = "smollm2-135m",
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        unmasked_chunk: int = DEFAULT_UNMASKED_CHUNK,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        execution: ExecutionSettings | None = None,
    ) -> None:
        #: how the forward passes run
        self.execution = run = ExecutionSettings.of(execution)
        run.refuse_unused({"fused_norms", "lean", "compile"}, "TransformersBackend")
        if isinstance(model, LoadedModel):
            if device != "auto" and torch.device(device) != model.device:
                raise InvalidRequestError(
                    f"device={device!r} differs from the loaded model's {model.device}; "
                    "device and dtype apply only when loading a model by name"
                )
            self.loaded = model
        else:
            self.loaded = load_model(model, device=device, dtype=dtype)
        if prefill_chunk < 1 or unmasked_chunk < 1 or max_batch_size < 1:
            raise InvalidRequestError("prefill_chunk, unmasked_chunk and max_batch_size must be >= 1")
        self.prefill_chunk = prefill_chunk
        self.unmasked_chunk = unmasked_chunk
        self.max_batch_size = max_batch_size
        if run.fused_norms:
            install_fused_norms(self.loaded.model)
        self.capabilities = BackendCapabilities(
            supports_position_ids=True, supports_sessions=True, supports_streaming=True
        )
        net = self.loaded.model
        self._ensure_mask_attention(net)
        params = forward_parameters(net.__class__)
        self._cache_kw = cache_argument(net)
        self._pass_cache_position = "cache_position" in params
        self._logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.vocab_size = int(net.get_input_embeddings().num_embeddings)
        self._eos = frozenset(self.loaded.eos_token_ids)
        self._mask_kinds, self._sliding_window = self._layer_kinds(net.config)
        compiled = run.compiles(self.device)
        if run.compile is True and not compiled:
            logger.info("compile=True has no effect on %s: the backend's passes run uncompiled", self.device)
        self._lean = (
            LeanModel.build(net, fused=run.fused_norms, compiled=compiled, packed=compiled)
            if run.lean and not self._pass_cache_position
            else None
        )
        #: the dense prefill's measured cost on this hardware (`warmup`), or None: not measured
        self.cost: CostCurve | None = None
        #: what `warmup` did, or None: it has not run
        self.warmed_up: WarmUpReport | None = None

    # ----------------------------------------------------------------- properties
    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def max_context(self) -> int:
        return self.loaded.max_context

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    @property
    def compiled(self) -> bool:
        """Whether the backend's long prefills run compiled (`ExecutionSettings.compile`, resolved for its device)."""
        return self._lean is not None and self._lean.compiled

    def warmup(self, lengths: Sequence[int] | None = None) -> WarmUpReport:
        """Prefill dense prompts of a few lengths: compile what compiles now, and measure what a prefill costs.

        ``lengths``: the prompt lengths (default: 1024, 4096 and 16384 tokens on CUDA, 128, 512 and
        1024 elsewhere; capped at the context). On CUDA each length runs once untimed (compiling
        there, when the passes compile) and twice timed. The fitted `CostCurve` becomes `cost`, the
        report `warmed_up`; both are logged. `Pipeline.warmup` calls it.

        Raises:
            InvalidRequestError: a length that is not an integer >= 1.
        """
        sizes = warmup_lengths(self.device, self.max_context - 2, lengths)
        ids = warmup_token_ids(self.tokenizer, max(sizes))

        def run(n: int) -> None:
            self.generate(CompressedPrompt.dense(Prompt.from_token_ids(ids[:n])), SamplingParams(max_tokens=1))

        self.warmed_up = warm_up(self, run, sizes, self.device, compiled=self.compiled, what="dense prefill")
        self.cost = self.warmed_up.cost
        return self.warmed_up

    def __repr__(self) -> str:
        return f"TransformersBackend({self.model_name!r}, device={str(self.device)!r}, dtype={self.loaded.dtype})"

    # ----------------------------------------------------------------- model set-up
    @staticmethod
    def _ensure_mask_attention(net: Any) -> None:
        if _mask_style(net) is not None:
            return
        impl = getattr(net.config, "_attn_implementation", None)
        # Flash-attention paths ignore a 4-D mask and derive sequence boundaries from position ids.
        logger.warning("attention implementation %r cannot take an explicit position mask; switching to sdpa", impl)
        net.set_attn_implementation("sdpa")

    @staticmethod
    def _layer_kinds(config: Any) -> tuple[tuple[str, ...], int | None]:
        cfg = text_config(config)
        window = getattr(cfg, "sliding_window", None)
        types = getattr(cfg, "layer_types", None)
        if types is None:
            # Mistral-style configs: one window for every layer when it is set.
            return (("sliding_attention",) if window else ("full_attention",)), window
        kinds = tuple(dict.fromkeys(types))
        unknown = set(kinds) - {"full_attention", "sliding_attention"}
        if unknown:
            raise InvalidRequestError(f"layer types {sorted(unknown)} are not supported by TransformersBackend")
        if "sliding_attention" in kinds and not window:
            raise InvalidRequestError("the config has sliding-attention layers but no sliding_window")
        return kinds, window

    # ----------------------------------------------------------------- validation
    def check(self, prompt: CompressedPrompt, params: SamplingParams | None = None) -> None:
        """Raise for ids outside the vocabulary or a prompt that does not fit the context.

        Raises:
            InvalidRequestError: a token id outside ``[0, vocab_size)``.
            ContextTooLongError: ``n`` (plus ``max_tokens``) exceeds `max_context`.
        """
        if not isinstance(prompt, CompressedPrompt):
            raise InvalidRequestError(f"expected a CompressedPrompt, got {type(prompt).__name__}")
        bad = [t for t in prompt.token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})", param="prompt_token_ids"
            )
        limit = self.max_context
        need = prompt.n + (params.max_tokens if params is not None else 0)
        if prompt.n >= limit or need > limit:
            raise ContextTooLongError(
                f"the prompt spans {prompt.n} positions"
                + (f" and asks for {params.max_tokens} more" if params is not None else "")
                + f": that exceeds the model's context of {limit} tokens",
                param="messages",
            )

    # ----------------------------------------------------------------- KV state
    def new_state(self, batch_size: int = 1) -> KVState:
        """An empty KV state (its cache holds a full, unbounded layer per model layer)."""
        from transformers import DynamicCache

        # No config: every layer keeps all its slots. Sliding windows are applied by the position mask,
        # which a window-truncating cache layer would contradict.
        empty = torch.zeros(batch_size, 0, dtype=torch.long)
        return KVState(
            cache=DynamicCache(),
            positions=empty,
            valid=empty.bool(),
            token_ids=empty.clone(),
            next_positions=[0] * batch_size,
        )

    def _masks(self, qpos: torch.Tensor, qvalid: torch.Tensor, kpos: torch.Tensor, kvalid: torch.Tensor) -> Any:
        """The 4-D masks for queries at ``qpos`` over keys ``kpos`` (cached slots then the new tokens)."""
        dev = self.device
        qpos_d, kpos_d = qpos.to(dev), kpos.to(dev)
        allowed = kvalid.to(dev)[:, None, :] & (kpos_d[:, None, :] <= qpos_d[:, :, None])  # [B, q, kv]
        q = qpos.shape[1]
        if not bool(qvalid.all()):
            # Padding queries attend to themselves only: no row is fully masked, so no NaN reaches the cache.
            cols = torch.arange(q, device=dev) + (kpos.shape[1] - q)
            pad = ~qvalid.to(dev)
            allowed[:, torch.arange(q, device=dev), cols] |= pad
        masks: dict[str, torch.Tensor] = {}
        for kind in self._mask_kinds:
            m = allowed
            if kind == "sliding_attention":
                assert self._sliding_window is not None
                m = m & ((qpos_d[:, :, None] - kpos_d[:, None, :]) < self._sliding_window)
                if not bool(qvalid.all()):
                    m = m | (allowed & ~qvalid.to(dev)[:, :, None])
            masks[kind] = self._as_attention_mask(m[:, None, :, :])
        if len(masks) == 1:
            return next(iter(masks.values()))
        return masks

    def _slot_order(self, kpos: torch.Tensor, kvalid: torch.Tensor) -> bool:
        """True when the model's own causal mask (by slot) equals the position mask.

        That holds for one row with no padding whose cached and new tokens are in increasing position
        order and every layer attends globally: a fresh compressed prefill, its decode steps and
        in-order conversation turns. transformers then needs no explicit mask and SDPA may pick its
        fused causal kernels, which an explicit mask rules out.
        """
        if kpos.shape[0] != 1 or self._mask_kinds != ("full_attention",) or not bool(kvalid.all()):
            return False
        return kpos.shape[1] < 2 or bool((kpos[0, 1:] > kpos[0, :-1]).all())

    def _as_attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        if _mask_style(self.loaded.model) == "eager":
            dtype = self.loaded.model.dtype
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return allowed

    @torch.inference_mode()
    def _forward(self, state: KVState, ids: torch.Tensor, qpos: torch.Tensor, qvalid: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` ([B, q]) at positions ``qpos`` against ``state``; append them; return last logits [B, V]."""
        kpos = torch.cat([state.positions, qpos], dim=1)
        kvalid = torch.cat([state.valid, qvalid], dim=1)
        dev = self.device
        in_order = self._slot_order(kpos, kvalid)
        if self._lean is not None and state.slots == 0 and in_order:
            cache = state.cache

            def store(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
                cache.update(key, value, layer)
                return False

            last = self._lean.forward(ids.to(dev), qpos.to(dev), store)
            assert last is not None
        else:
            kwargs: dict[str, Any] = {
                "input_ids": ids.to(dev),
                "position_ids": qpos.to(dev),
                "attention_mask": None if in_order else self._masks(qpos, qvalid, kpos, kvalid),
                self._cache_kw: state.cache,
                "use_cache": True,
            }
            if self._pass_cache_position:  # older transformers: the compact slot index of each new token
                kwargs["cache_position"] = torch.arange(state.slots, state.slots + ids.shape[1], device=dev)
            if self._logits_kw is not None:
                kwargs[self._logits_kw] = 1
            with fused_norms(self.execution.fused_norms):
                last = self.loaded.model(**kwargs).logits[:, -1, :]
        state.positions, state.valid = kpos, kvalid
        state.token_ids = torch.cat([state.token_ids, ids.cpu()], dim=1)
        return last.float()

    def prefill(self, prompt: CompressedPrompt, state: KVState | None = None) -> KVState:
        """Bring ``state`` (or a new one) up to ``prompt``: kept tokens not yet cached are prefilled.

        Each new token attends to every cached or new token of smaller position, so a cache extended
        turn by turn (or with earlier positions filled in) reads as one prompt. Tokens already cached
        stay; the logits for position ``prompt.n`` are computed by the kept token of largest position
        (recomputed if it was cached). Returns the state, now at ``next_position == prompt.n``.

        Raises:
            InvalidRequestError: ids outside the vocabulary, or a cache that disagrees with ``prompt``.
            ContextTooLongError: ``prompt.n`` does not fit the context.
        """
        self.check(prompt)
        if state is None:
            state = self.new_state()
        cached = state.cached_tokens()
        if cached:  # a fresh state has nothing to disagree with
            for pos, tok in zip(prompt.position_ids, prompt.token_ids, strict=True):
                if pos in cached and cached[pos] != tok:
                    raise InvalidRequestError(
                        f"the cache holds token {cached[pos]} at position {pos}, the prompt {tok}"
                    )
        last = prompt.position_ids[-1]
        if cached and max(cached) > last:
            raise InvalidRequestError(
                f"the cache holds position {max(cached)}, beyond the prompt's last kept token at {last}; evict it first"
            )
        if last in cached:
            self.evict_positions(state, [last])
            cached.pop(last)
        if cached:
            new = [(p, t) for p, t in zip(prompt.position_ids, prompt.token_ids, strict=True) if p not in cached]
            new_pos, new_ids = int64_tensor([p for p, _ in new]), int64_tensor([t for _, t in new])
        else:  # a fresh state: every kept token is new
            new_pos, new_ids = int64_tensor(prompt.position_ids), int64_tensor(prompt.token_ids)
        count = int(new_pos.shape[0])
        state.last_prefilled = count
        logits: torch.Tensor | None = None
        kpos = torch.cat([state.positions, new_pos[None]], dim=1)
        kvalid = torch.cat([state.valid, torch.ones(1, count, dtype=torch.bool)], dim=1)
        chunk = self.unmasked_chunk if self._slot_order(kpos, kvalid) else self.prefill_chunk
        for start in range(0, count, chunk):
            ids = new_ids[None, start : start + chunk]
            qpos = new_pos[None, start : start + chunk]
            logits = self._forward(state, ids, qpos, torch.ones_like(qpos, dtype=torch.bool))
        state.logits = logits
        state.next_positions = [prompt.n]
        return state

    def _prefill_padded(self, prompts: Sequence[CompressedPrompt]) -> KVState:
        """Prefill several prompts into one left-padded batch state."""
        width = max(p.kept for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        pos = torch.zeros(len(prompts), width, dtype=torch.long)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - p.kept :] = int64_tensor(p.token_ids)
            pos[b, width - p.kept :] = int64_tensor(p.position_ids)
            valid[b, width - p.kept :] = True
        state = self.new_state(len(prompts))
        logits: torch.Tensor | None = None
        for start in range(0, width, self.prefill_chunk):
            end = start + self.prefill_chunk
            logits = self._forward(state, ids[:, start:end], pos[:, start:end], valid[:, start:end])
        state.logits = logits
        state.next_positions = [p.n for p in prompts]
        return state

    @torch.inference_mode()
    def evict(self, state: KVState, keep_slots: Sequence[int]) -> None:
        """Keep only the slots ``keep_slots`` (indices into the slot axis) of every row of ``state``."""
        index = torch.tensor(sorted(set(keep_slots)), dtype=torch.long)
        if index.numel() and (int(index[0]) < 0 or int(index[-1]) >= state.slots):
            raise IndexError(f"slot indices must lie in [0, {state.slots})")
        for layer in _cache_layers(state.cache):
            dev_index = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, dev_index)
            layer.values = layer.values.index_select(-2, dev_index)
        state.positions = state.positions.index_select(1, index)
        state.valid = state.valid.index_select(1, index)
        state.token_ids = state.token_ids.index_select(1, index)
        state.logits = None

    def evict_positions(self, state: KVState, positions: Sequence[int]) -> int:
        """Drop the slots of a single-row state that hold these original positions; return how many."""
        drop = {int(p) for p in positions}
        pos = state.positions[0].tolist()
        valid = state.valid[0].tolist()
        keep = [j for j, (p, v) in enumerate(zip(pos, valid, strict=True)) if v and p not in drop]
        removed = state.slots - len(keep)
        if removed:
            self.evict(state, keep)
        return removed

    @torch.inference_mode()
    def _select_rows(self, state: KVState, rows: Sequence[int]) -> None:
        index = torch.tensor(list(rows), dtype=torch.long)
        for layer in _cache_layers(state.cache):
            dev_index = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, dev_index)
            layer.values = layer.values.index_select(0, dev_index)
        state.positions = state.positions.index_select(0, index)
        state.valid = state.valid.index_select(0, index)
        state.token_ids = state.token_ids.index_select(0, index)
        state.next_positions = [state.next_positions[r] for r in rows]
        if state.logits is not None:
            state.logits = state.logits.index_select(0, index.to(state.logits.device))

    def feed(self, state: KVState, tokens: Sequence[int]) -> None:
        """Append one token per row at each row's next position; update ``state.logits``."""
        if len(tokens) != state.batch_size:
            raise ValueError(f"{len(tokens)} tokens for {state.batch_size} rows")
        if max(state.next_positions) >= self.max_context:
            raise ContextTooLongError(
                f"position {max(state.next_positions)} is beyond the model's context of {self.max_context} tokens"
            )
        ids = torch.tensor([[int(t)] for t in tokens], dtype=torch.long)
        qpos = torch.tensor([[p] for p in state.next_positions], dtype=torch.long)
        state.logits = self._forward(state, ids, qpos, torch.ones_like(qpos, dtype=torch.bool))
        state.next_positions = [p + 1 for p in state.next_positions]

    def decode(self, state: KVState, params: SamplingParams) -> Iterator[int]:
        """Sample up to ``params.max_tokens`` tokens from a single-row state, feeding each back.

        A token is fed only when the next one is asked for, so the caller that stops (EOS, a stop
        string) leaves the state holding the prompt and every generated token but the last.
        """
        if state.logits is None:
            raise InvalidRequestError("the state has no logits to decode from: prefill it first")
        sampler = TokenSampler(params)
        token: int | None = None
        for _ in range(params.max_tokens):
            if token is not None:
                self.feed(state, [token])
            assert state.logits is not None
            token = sampler.choose(state.logits[0])
            yield token

    # ----------------------------------------------------------------- generation
    def _completion(self, prompt: CompressedPrompt, run: _Run, timings: Timings) -> Completion:
        return Completion(
            text=run.assembler.text,
            token_ids=tuple(run.tokens),
            finish_reason=run.finish_reason or "length",
            usage=Usage(prompt_tokens=prompt.n, kept_tokens=prompt.kept, completion_tokens=len(run.tokens)),
            timings=timings,
            model=self.model_name,
            selection=prompt.selection,
            logprobs=None if run.logprobs is None else tuple(run.logprobs),
        )

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        """Prefill ``prompt`` at its positions, decode from ``prompt.n``, yield one chunk per token.

        Text deltas hold back incomplete characters and any tail that could begin a stop string; the
        last chunk has ``finish_reason`` and the whole `Completion`.
        """
        self.check(prompt, params)
        return self._stream(prompt, params, None)

    def stream_from(
        self, state: KVState, prompt: CompressedPrompt, params: SamplingParams
    ) -> Iterator[CompletionChunk]:
        """Like `stream`, but extends ``state`` (see `prefill`) instead of starting from an empty cache.

        Afterwards ``state`` holds the prompt and every generated token except the last one.
        """
        self.check(prompt, params)
        return self._stream(prompt, params, state)

    def _stream(
        self, prompt: CompressedPrompt, params: SamplingParams, state: KVState | None
    ) -> Iterator[CompletionChunk]:
        t0 = time.perf_counter()
        state = self.prefill(prompt, state)
        prefill_ms = _ms(t0)
        run = _Run(self.tokenizer, self._eos, params)
        ttft = 0.0
        for token in self.decode(state, params):
            if not run.tokens:
                ttft = _ms(t0)
            assert state.logits is not None  # until the next token is asked for, the logits it was chosen from
            entry = run.logprob(state.logits[0], token)
            delta = run.push(token, entry)
            logprobs = () if entry is None else (entry,)
            if run.finish_reason is None:
                yield CompletionChunk(text=delta, token_ids=(token,), logprobs=logprobs)
                continue
            timings = Timings(prefill=prefill_ms, ttft=ttft, total=_ms(t0))
            completion = self._completion(prompt, run, timings)
            yield CompletionChunk(
                text=delta,
                token_ids=(token,),
                logprobs=logprobs,
                finish_reason=run.finish_reason,
                completion=completion,
            )
            return

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Prefill ``prompt`` at its position ids, decode from position ``prompt.n``.

        Raises:
            InvalidRequestError: ids outside the vocabulary.
            ContextTooLongError: ``n + max_tokens`` exceeds `max_context`.
            GenerationStopped: the current request's cancel event (`REQUEST_CANCEL`) was set; the
                generation stopped at the next token.
        """
        last: CompletionChunk | None = None
        generated = 0
        for last in self.stream(prompt, params):
            if last.completion is None:
                generated += 1
                # A server's request whose client went away: nobody reads the rest (a stream is closed instead).
                check_cancelled(generated, params.max_tokens)
        assert last is not None and last.completion is not None
        return last.completion

    def generate_batch(self, prompts: Sequence[CompressedPrompt], params: SamplingParams) -> list[Completion]:
        """Generate for several prompts in left-padded batches: each row keeps its own positions.

        Each row sees exactly the keys a single call would (padding is masked out) and samples with
        its own generator seeded like a single call, so the results equal
        ``[generate(p, params) for p in prompts]`` up to floating-point summation order.
        """
        if isinstance(prompts, CompressedPrompt):
            raise InvalidRequestError("generate_batch takes a list of prompts; use generate for one prompt")
        prompts = list(prompts)
        for p in prompts:
            self.check(p, params)
        results: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            group = prompts[start : start + self.max_batch_size]
            if len(group) == 1:
                results.append(self.generate(group[0], params))
            else:
                results.extend(self._generate_padded(group, params))
        return results

    def _generate_padded(self, prompts: list[CompressedPrompt], params: SamplingParams) -> list[Completion]:
        t0 = time.perf_counter()
        state = self._prefill_padded(prompts)
        prefill_ms = _ms(t0)
        runs = [_Run(self.tokenizer, self._eos, params) for _ in prompts]
        samplers = [TokenSampler(params) for _ in prompts]
        done: dict[int, Completion] = {}
        active = list(range(len(prompts)))  # prompt index of each state row
        ttft = 0.0
        while True:
            assert state.logits is not None
            tokens = [samplers[i].choose(state.logits[row]) for row, i in enumerate(active)]
            if not ttft:
                ttft = _ms(t0)
            for row, (i, token) in enumerate(zip(active, tokens, strict=True)):
                runs[i].push(token, runs[i].logprob(state.logits[row], token))
            keep = [row for row, i in enumerate(active) if runs[i].finish_reason is None]
            for i in active:
                if runs[i].finish_reason is not None:
                    done[i] = self._completion(
                        prompts[i], runs[i], Timings(prefill=prefill_ms, ttft=ttft, total=_ms(t0))
                    )
            if not keep:
                break
            if len(keep) < len(active):
                self._select_rows(state, keep)
                tokens = [tokens[row] for row in keep]
                active = [active[row] for row in keep]
            self.feed(state, tokens)
        return [done[i] for i in range(len(prompts))]


class _Run:
    """One sequence's generated tokens, text and finish reason."""

    def __init__(self, tokenizer: Any, eos: frozenset[int], params: SamplingParams) -> None:
        self.assembler = TextAssembler(tokenizer, params.stop)
        self.eos = frozenset() if params.ignore_eos else eos
        self.max_tokens = params.max_tokens
        self.top_logprobs = params.logprobs
        self.tokens: list[int] = []
        #: one entry per token when the parameters ask for log-probabilities, else None
        self.logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
        self.finish_reason: FinishReason | None = None

    def logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob | None:
        """``token``'s log-probability under ``logits`` when they were asked for (else None, at no cost)."""
        if self.top_logprobs is None:
            return None
        return token_logprob(logits, token, self.top_logprobs)

    def push(self, token: int, logprob: TokenLogprob | None = None) -> str:
        """Record one token (and its log-probability); return the text delta it releases."""
        self.tokens.append(token)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        if token in self.eos:
            self.finish_reason = "stop"
            return self.assembler.finish()
        delta = self.assembler.add(token)
        if self.assembler.stopped:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"
            delta += self.assembler.finish()
        return delta
