"""Read the draft's post-RoPE queries and keys from inside its attention layers.

A model that a `DraftAttentionScorer` uses is switched to the attention implementation
``specprefill_sdpa`` (or ``specprefill_eager``), registered with transformers' ``AttentionInterface``.
It calls the plain ``sdpa`` (or the model's ``eager``) function and, only while a `ScoreCollector` is
active in the current thread or task (a context variable), also turns the query/key tensors it is given
into attention score rows. Outside a scoring context the model computes exactly what it computed
before, so the same model object can serve as target and draft at once.

The score rows are reduced on the fly: each layer adds its smoothed rows to a running maximum (or,
for the mean aggregations, a running sum) of shape ``[batch, queries, prompt]``; no ``n x n`` matrix
and no ``[layers, heads, queries, n]`` tensor is ever held. `ScoreCollector.token_scores` then
combines each prompt's queries (their mean, or their maximum).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import ModelLoadError
from ...models import text_config
from ...runtime.attention import HOOKED_IMPLEMENTATIONS, HOOKED_PREFIX
from ...types import CONTENT_WINDOW, Aggregation, QueryReduction

__all__ = [
    "DraftStopped",
    "LayerStop",
    "QueryRecorder",
    "ScoreCollector",
    "content_columns",
    "content_rows",
    "install",
    "pool_rows",
    "skipped_layers",
]

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar[ScoreCollector | QueryRecorder | None] = contextvars.ContextVar(
    "specprefill_scoring", default=None
)
_install_lock = threading.Lock()
#: `QueryRecorder.attend` splits its product with the values into blocks of this many cache slots
_SPLIT = 1024
_registered = False


def pool_rows(rows: torch.Tensor, valid: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average-pool ``rows`` (``[B, C, L]``) along ``L`` over the ``valid`` columns only (``[B, 1, L]``).

    Each output column is the mean of the valid columns inside its window of ``kernel`` columns
    (centred; for an even kernel the extra column is on the left), so edges and padding are not
    averaged in as zeros. With every column valid this is ``avg_pool1d(..., count_include_pad=False)``.
    """
    if kernel <= 1:
        return rows
    length = rows.shape[-1]
    pad = kernel // 2
    sums = F.avg_pool1d(rows, kernel, stride=1, padding=pad, count_include_pad=True)[..., :length]
    counts = F.avg_pool1d(valid.to(rows.dtype), kernel, stride=1, padding=pad, count_include_pad=True)[..., :length]
    return sums.div_(counts.clamp_min(1.0 / kernel))


def skipped_layers(config: Any) -> frozenset[int]:
    """Layers whose attention does not count: sliding-window layers when the model also has global ones.

    A sliding-window layer cannot see most of a long prompt, so its (renormalised) attention would
    favour recent tokens for no reason but its window. When every layer is windowed (e.g. Mistral),
    all layers count and each one's attention is restricted to its own window, as the draft computes it.
    """
    layer_types = getattr(text_config(config), "layer_types", None)
    if not layer_types or "full_attention" not in layer_types:
        return frozenset()
    return frozenset(i for i, kind in enumerate(layer_types) if kind != "full_attention")


class DraftStopped(Exception):
    """Raised by the hooked attention of layer `_Observer.stop_after` once observed: the forward pass ends there."""


class _Observer:
    """Something the hooked attention reports to while it is active in the current thread or task."""

    #: when set, the forward pass stops (`DraftStopped`) right after this layer's attention inputs are
    #: observed: neither this layer's attention nor any later layer runs
    stop_after: int | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make this object receive the attention calls of the current thread or task."""
        token = _ACTIVE.set(self)  # type: ignore[arg-type]
        try:
            yield None
        finally:
            _ACTIVE.reset(token)


class LayerStop(_Observer):
    """Records nothing; only ends the forward pass after layer ``stop_after``'s attention inputs."""

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after

    def observe(self, module: Any, *args: Any) -> None:
        return None


def content_columns(pad: torch.Tensor, prompt_len: int, window: int = CONTENT_WINDOW) -> torch.Tensor:
    """``[B, 1, P]``: the columns ``"content-mean"`` keeps in each attention row of a left-padded batch.

    Row ``b``'s real tokens are ``[pad[b], P)``; its first one (the attention sink) and its last
    ``min(window, (n_b - 1) // 2)`` (the local window, at most half of the rest) are left out.
    """
    columns = torch.arange(prompt_len, device=pad.device)
    n = prompt_len - pad
    local = torch.clamp((n - 1) // 2, max=window)
    keep = (columns[None, :] > pad[:, None]) & (columns[None, :] < (prompt_len - local)[:, None])
    return keep[:, None, :]


def content_rows(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``probs`` (attention rows over the prompt's columns) restricted to ``keep`` and renormalised to sum to one.

    A row with no attention on the kept columns stays zero.
    """
    kept = probs * keep
    return kept.div_(kept.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny))


class ScoreCollector(_Observer):
    """Accumulates, per query j and key i, the pooled attention over layers and heads, reduced by ``aggregation``.

    ``"max"``: ``best[b, j, i] = max over layers and heads``; ``"mean"``: their sum, divided by the
    number of (layer, head) rows in `reduced`; ``"content-mean"``: the same mean over rows first
    restricted to `content_columns` and renormalised (`content_rows`); ``"last-layer"``: the mean
    over the heads of layer ``last_layer`` alone (the other layers are seen but do not vote).
    ``queries`` is how `token_scores` combines the queries: their mean or their maximum.

    The scorer drives it: `begin_step` before every forward pass of the draft (step 0 is the prompt
    prefill, step j the j-th look-ahead token), then reads `reduced`. Sequence indices are those of the
    left-padded batch: the prompt occupies ``[0, prompt_len)``, row ``b``'s real tokens start at
    ``pad[b]``.
    """

    #: `observe_stacked` reduces layers in groups of at most this many fp32 elements (score rows and
    #: keys together, about 64 MiB each), so the reduction's transient memory stays small.
    group_elements: int = 1 << 24

    def __init__(
        self,
        *,
        pad: torch.Tensor,
        prompt_len: int,
        num_queries: int,
        pool_kernel: int,
        skip: frozenset[int],
        device: torch.device,
        padded: bool | None = None,
        aggregation: Aggregation = "max",
        last_layer: int | None = None,
        queries: QueryReduction = "mean",
    ) -> None:
        if (aggregation == "last-layer") != (last_layer is not None):
            raise ValueError("last_layer is given exactly when the aggregation is 'last-layer'")
        batch = int(pad.shape[0])
        self.aggregation = aggregation
        #: ``"last-layer"``: the one layer whose rows count, else None (every layer not in ``skip``)
        self.last_layer = last_layer
        #: how `token_scores` combines the queries
        self.queries: QueryReduction = queries
        self.prompt_len = prompt_len
        self.pool_kernel = pool_kernel
        self.skip = skip
        self.pad = pad.to(device)
        self.best = torch.zeros(batch, num_queries, prompt_len, dtype=torch.float32, device=device)
        columns = torch.arange(prompt_len, device=device)
        self.columns = columns
        self.valid = (columns[None, :] >= self.pad[:, None])[:, None, :]  # [B, 1, P]
        #: the columns each row keeps for ``"content-mean"``, else None
        self.content = content_columns(self.pad, prompt_len) if aggregation == "content-mean" else None
        #: for the mean aggregations, the number of (layer, head) rows summed into each query's `best`
        self.votes = torch.zeros(num_queries, dtype=torch.float32, device=device)
        #: whether any row is left-padded (`observe_stacked` skips masking when none is)
        self.padded = bool(padded) if padded is not None else bool((self.pad > 0).any())
        self.step = 0
        self.seq_len = prompt_len
        self.layers_seen: set[int] = set()

    @property
    def reduced(self) -> torch.Tensor:
        """``[B, queries, P]``: the aggregated score of every query and key so far."""
        if self.aggregation == "max":
            return self.best
        return self.best / self.votes.clamp_min(1.0)[None, :, None]

    def token_scores(self, row: int, used: int) -> torch.Tensor:
        """``[n]``: row ``row``'s scores over its real prompt tokens from its first ``used`` queries.

        The mean of the queries' `reduced` rows, or (``queries="max"``) their maximum.
        """
        rows = self.reduced[row, :used, int(self.pad[row]) :]
        return rows.amax(dim=0) if self.queries == "max" else rows.mean(dim=0)

    def _votes(self, layer: int | None) -> bool:
        """Whether layer ``layer``'s rows count (``"last-layer"`` counts one layer only)."""
        return self.last_layer is None or layer == self.last_layer

    def _add(self, pooled: torch.Tensor) -> None:
        """Fold ``pooled`` (``[layers, B, heads, count, P]``) into queries ``:count``."""
        layers, _, heads, count, _ = pooled.shape
        target = self.best[:, :count]
        if self.aggregation == "max":
            torch.maximum(target, pooled.amax(dim=(0, 2)), out=target)
        else:
            target.add_(pooled.sum(dim=(0, 2)))
            self.votes[:count] += layers * heads

    def begin_step(self, step: int) -> None:
        """Prepare for the forward pass whose last query is query ``step`` (0: the last prompt token)."""
        self.step = step
        self.seq_len = self.prompt_len + step

    def observe(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        sliding_window: int | None,
        softcap: float | None,
    ) -> None:
        """Add one layer's contribution for the current query (the last query row of this call)."""
        layer = getattr(module, "layer_idx", None)
        if layer in self.skip:
            return
        if layer is not None:
            self.layers_seen.add(int(layer))
        if not self._votes(None if layer is None else int(layer)):
            return
        kv_len = key.shape[2]
        first = self.seq_len - kv_len  # sequence index of key[..., 0, :] (a sliding cache drops the oldest)
        visible = self.prompt_len - first
        if visible <= 0:
            return
        q = query[:, :, -1, :].float()  # [B, H, d]
        k = key[:, :, :visible, :].float()  # [B, KVH, C, d]: prompt keys only
        batch, heads, dim = q.shape
        kv_heads = k.shape[1]
        groups = heads // kv_heads
        scale = scaling if scaling is not None else dim**-0.5
        # GQA: query head h reads kv head h // groups, as repeat_kv lays them out.
        logits = torch.matmul(q.view(batch, kv_heads, groups, dim), k.transpose(-1, -2)).view(batch, heads, visible)
        logits = logits * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        seq_idx = self.columns[first : self.prompt_len]
        allowed = seq_idx[None, :] >= self.pad[:, None]  # [B, C]
        if sliding_window is not None:
            allowed = allowed & ((self.seq_len - 1 - seq_idx) < sliding_window)[None, :]
        logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row with no visible key gives zeros
        if first > 0:
            rows = probs.new_zeros(batch, heads, self.prompt_len)
            rows[..., first:] = probs
        else:
            rows = probs
        if self.content is not None:
            rows = content_rows(rows, self.content)
        pooled = pool_rows(rows, self.valid, self.pool_kernel)  # [B, H, P]
        step = self.step
        if self.aggregation == "max":
            target = self.best[:, step]
            torch.maximum(target, pooled.amax(dim=1), out=target)
        else:
            self.best[:, step].add_(pooled.sum(dim=1))
            self.votes[step] += heads

    def observe_stacked(self, queries: torch.Tensor, keys: torch.Tensor, scalings: Sequence[float]) -> None:
        """Add every layer's contribution for several queries at once.

        ``queries`` (``[L, B, H, J, d]``, post-RoPE) are queries ``0 .. J - 1`` of every layer; ``keys``
        (``[L, B, KVH, >= prompt_len, d]``) hold each layer's prompt keys in their first ``prompt_len``
        slots; ``scalings[l]`` is layer ``l``'s softmax scaling. Only for models whose every layer
        attends globally without a logit soft-cap (what `FixedBufferLookAhead` accepts): the result is the
        one `observe` gives layer by layer and query by query, in fp32 (when every layer has the same
        scaling, the product applies it before its one rounding instead of after it).

        Layers are reduced in groups sized so that a group's fp32 score rows and keys stay within
        ``group_elements`` elements; with short prompts one group holds every layer, so the reduction
        costs a few kernel launches in all instead of a few per layer.
        """
        layers = [i for i in range(queries.shape[0]) if i not in self.skip]
        self.layers_seen.update(layers)
        layers = [i for i in layers if self._votes(i)]
        if not layers:
            return
        _, batch, heads, count, dim = queries.shape
        kv_heads, width = keys.shape[2], self.prompt_len
        per_layer = batch * (heads * count + kv_heads * dim) * width
        size = max(1, min(len(layers), self.group_elements // per_layer))
        hidden = ~self.valid[None, :, :, None, :]  # [1, B, 1, 1, P]: padding
        for start in range(0, len(layers), size):
            group = layers[start : start + size]
            if group == list(range(group[0], group[-1] + 1)):
                q, k = queries[group[0] : group[-1] + 1], keys[group[0] : group[-1] + 1]
            else:
                pick = torch.tensor(group, device=queries.device)
                q, k = queries.index_select(0, pick), keys.index_select(0, pick)
            g = len(group)
            q = q.float().reshape(g, batch, kv_heads, heads // kv_heads * count, dim)
            k = k[:, :, :, :width, :].float()
            factors = [float(scalings[i]) for i in group]
            if len(set(factors)) == 1:  # the scaling applied by the product itself (one rounding fewer)
                q3, k3 = q.reshape(-1, q.shape[-2], dim), k.reshape(-1, width, dim).transpose(1, 2)
                logits = torch.baddbmm(q3.new_zeros(()), q3, k3, beta=0.0, alpha=factors[0])
                logits = logits.view(g, batch, heads, count, width)
            else:
                logits = torch.matmul(q, k.transpose(-1, -2)).view(g, batch, heads, count, width)
                logits.mul_(torch.tensor(factors, dtype=logits.dtype, device=logits.device).view(g, 1, 1, 1, 1))
            del k
            if self.padded:
                logits.masked_fill_(hidden, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            del logits
            if self.content is not None:
                probs = content_rows(probs, self.content[None, :, :, None, :])
            rows = probs.view(g * batch, heads * count, width)
            mask = self.valid.expand(g, batch, 1, width).reshape(g * batch, 1, width)
            pooled = pool_rows(rows, mask, self.pool_kernel).view(g, batch, heads, count, width)
            del probs, rows
            self._add(pooled)


class QueryRecorder(_Observer):
    """Stores each layer's last post-RoPE query row into a fixed buffer, at the slot ``index`` holds.

    `FixedBufferLookAhead` makes it active for the prompt's prefill (``index`` 0; ``sink`` then also
    receives every layer's keys and values, to copy into fixed buffers) and for each look-ahead decode
    step, including the one a CUDA graph captures: a step only issues in-place device copies indexed by
    a device tensor, so every replay of the graph writes the query of its own step.
    """

    def __init__(self, queries: dict[int, torch.Tensor], index: torch.Tensor) -> None:
        self.queries = queries  # layer -> [B, H, J, d]
        self.index = index  # [1] long: the query being recorded
        self.scaling: dict[int, float] = {}
        #: while set, called with ``(layer, key, value)`` for every layer (the prompt's prefill)
        self.sink: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None

    def observe(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        sliding_window: int | None,
        softcap: float | None,
    ) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer is None or int(layer) not in self.queries:
            return
        store = self.queries[int(layer)]
        self.scaling[int(layer)] = scaling if scaling is not None else query.shape[-1] ** -0.5
        store.index_copy_(2, self.index, query[:, :, -1:, :].to(store.dtype))
        if self.sink is not None:
            self.sink(int(layer), key, value)

    @staticmethod
    def attend(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float | None
    ) -> torch.Tensor:
        """One-query attention over a fixed buffer (``mask``: additive, ``[B, 1, 1, S]``); ``[B, 1, H, d]``.

        Two batched matrix products and a softmax in fp32, in as few kernels as possible (a decode
        step of a small draft costs what launching its kernels costs): the scaling and the mask are
        applied by the first product, the softmax reads its bf16 output into fp32. For a single query
        over a long masked buffer this reads the keys and values once with all of the GPU busy, where
        SDPA's masked kernels give each head one thread block that walks the whole buffer. The product
        with the values is split along the buffer into blocks of `_SPLIT` slots (summed with fp32
        accumulation) when the buffer is long: as one product it would have only ``B x KVH`` small
        output tiles, each reducing over every slot in turn.
        """
        batch, heads, _, dim = query.shape
        kv_heads, slots = key.shape[1], key.shape[2]
        groups = heads // kv_heads
        scale = scaling if scaling is not None else dim**-0.5
        rows = batch * kv_heads
        q = query.reshape(rows, groups, dim)
        k = key.reshape(rows, slots, dim).transpose(1, 2)
        bias = (
            mask.to(query.dtype).reshape(batch, 1, 1, slots).expand(batch, kv_heads, 1, slots).reshape(rows, 1, slots)
        )
        probs = torch.softmax(torch.baddbmm(bias, q, k, alpha=scale), dim=-1, dtype=torch.float32)  # [B*KVH, G, S]
        if slots >= 4 * _SPLIT and slots % _SPLIT == 0:
            blocks = slots // _SPLIT
            split = probs.new_empty((rows, blocks, groups, _SPLIT), dtype=value.dtype)
            split.copy_(probs.view(rows, groups, blocks, _SPLIT).transpose(1, 2))
            parts = torch.matmul(split, value.reshape(rows, blocks, _SPLIT, dim))  # [B*KVH, C, G, d]
            out = parts.sum(dim=1)
        else:
            out = torch.bmm(probs.to(value.dtype), value.reshape(rows, slots, dim))  # [B*KVH, G, d]
        return out.reshape(batch, heads, 1, dim).transpose(1, 2)


def _eager_function(module: Any) -> Callable[..., Any]:
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise ModelLoadError(f"{type(module).__name__} has no eager_attention_forward to delegate to")
    return fn


def _make_wrapper(base: str) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        collector = _ACTIVE.get()
        if collector is not None:
            scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
            window = kwargs.get("sliding_window")
            collector.observe(module, query, key, value, scaling, window, kwargs.get("softcap"))
            if collector.stop_after is not None and getattr(module, "layer_idx", None) == collector.stop_after:
                raise DraftStopped
            if isinstance(collector, QueryRecorder) and attention_mask is not None and query.shape[2] == 1:
                return collector.attend(query, key, value, attention_mask, scaling), None
        fn = ALL_ATTENTION_FUNCTIONS[base] if base != "eager" else _eager_function(module)
        return fn(module, query, key, value, attention_mask, *args, **kwargs)

    attention.__name__ = f"{HOOKED_PREFIX}{base}_attention_forward"
    return attention


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    for base, name in HOOKED_IMPLEMENTATIONS.items():
        AttentionInterface.register(name, _make_wrapper(base))
        # Masks must be built exactly as for the wrapped implementation.
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    _registered = True


def install(model: Any) -> None:
    """Switch ``model`` to the hooked twin of its attention implementation (idempotent).

    Raises:
        ModelLoadError: the model uses an attention implementation other than ``sdpa`` or ``eager``.
    """
    with _install_lock:
        _register()
        current = model.config._attn_implementation
        if current in HOOKED_IMPLEMENTATIONS.values():
            return
        if current not in HOOKED_IMPLEMENTATIONS:
            raise ModelLoadError(
                f"the draft model uses attn_implementation={current!r}; draft-attention scoring needs 'sdpa' or "
                "'eager' (load it with attn_implementation='sdpa')"
            )
        model.set_attn_implementation(HOOKED_IMPLEMENTATIONS[current])
        if model.config._attn_implementation != HOOKED_IMPLEMENTATIONS[current]:
            raise ModelLoadError(f"{type(model).__name__} does not allow switching its attention implementation")
        logger.debug("draft attention hooked: %s -> %s", current, HOOKED_IMPLEMENTATIONS[current])
