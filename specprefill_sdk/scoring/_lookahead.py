"""Look-ahead decoding for `DraftAttentionScorer` over fixed buffers, replayed as a CUDA graph on GPUs.

The look-ahead tokens are greedy decode steps of the draft. Run eagerly, each step of a small model
costs far more in Python and kernel launches than in arithmetic (11-17 ms for a 1B draft on an H200,
against well under a millisecond of memory traffic). `StaticLookAhead` makes every step identical in
shape so that it can be captured once and replayed:

- the prompt's keys and values go straight from the prefill into per-layer buffers of a fixed
  capacity (the prefill itself keeps no cache);
- a step reads and writes only device tensors: the input token, its position, its cache slot, a
  4-D additive mask whose slot is unmasked in place, and the step index;
- the attention hook records each layer's post-RoPE query into a buffer (`QueryRecorder`) instead of
  scoring it; all look-ahead queries are scored together after the last step
  (`ScoreCollector.observe_queries`), with the same arithmetic as one at a time.

On CPU (or with graphs turned off) the same steps run eagerly. A graph is kept for the last batch
size and capacity and reused while prompts fit (capacities are rounded up to 1024 slots); its
buffers stay allocated until `release` or until a larger prompt needs a larger graph.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from ._attention_hook import QueryRecorder

__all__ = ["StaticLookAhead", "supports_static_look_ahead"]

logger = logging.getLogger(__name__)

_ROUND = 1024


def supports_static_look_ahead(model: Any) -> bool:
    """True when every attention layer of ``model`` attends globally and without a logit soft-cap."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    if types is None and getattr(config, "sliding_window", None):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


class _StaticCache:
    """Just enough of transformers' cache protocol for decode steps over fixed buffers."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slot: torch.Tensor) -> None:
        self.keys, self.values, self.slot = keys, values, slot

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.slot, key_states)
        v.index_copy_(2, self.slot, value_states)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.keys[layer_idx].shape[2])


class StaticLookAhead:
    """Fixed buffers (and, on CUDA, one captured graph) for ``steps`` greedy decode steps of ``model``.

    Use: `write_prompt_kv` during the prefill (as the `ScoreCollector`'s ``kv_sink``), then `run`.
    One scoring call at a time: `DraftAttentionScorer` holds its own lock around both.
    """

    def __init__(self, model: Any, batch: int, capacity: int, steps: int, *, cuda_graph: bool) -> None:
        self.model = model
        self.batch, self.capacity, self.steps = batch, capacity, steps
        device = next(model.parameters()).device
        dtype = model.dtype
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.queries = {
            i: torch.zeros(batch, heads, steps, head_dim, dtype=torch.float32, device=device) for i in range(layers)
        }
        self.mask = torch.zeros(batch, 1, 1, capacity, dtype=dtype, device=device)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.index = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, steps, dtype=torch.long, device=device)
        self.recorder = QueryRecorder(self.queries, self.index)
        self.cache = _StaticCache(self.keys, self.values, self.slot)
        params = inspect.signature(model.forward).parameters
        self._kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1}
        self._kwargs["cache" if "cache" in params else "past_key_values"] = self.cache
        if "cache_position" in params:
            self._kwargs["cache_position"] = self.slot
        self.use_graph = cuda_graph and device.type == "cuda"
        self.graph: Any = None
        self.device = device

    @staticmethod
    def capacity_for(width: int, steps: int) -> int:
        need = width + steps
        return -(-need // _ROUND) * _ROUND

    def fits(self, batch: int, width: int, steps: int) -> bool:
        """Whether these buffers serve a batch of ``batch`` prompts ``width`` wide with ``steps`` steps."""
        need = width + steps
        return batch == self.batch and steps == self.steps and need <= self.capacity <= max(2 * need, need + _ROUND)

    def write_prompt_kv(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Copy the prompt prefill's keys and values of ``layer`` into the first slots."""
        width = key.shape[2]
        self.keys[layer][:, :, :width].copy_(key)
        self.values[layer][:, :, :width].copy_(value)

    def _step(self) -> None:
        self.mask.index_fill_(3, self.slot, 0.0)
        out = self.model(input_ids=self.token, position_ids=self.position, attention_mask=self.mask, **self._kwargs)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        self.tokens.index_copy_(1, self.index, nxt)
        self.token.copy_(nxt)
        self.position.add_(1)
        self.slot.add_(1)
        self.index.add_(1)

    def run(self, first_token: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor, width: int) -> torch.Tensor:
        """Decode ``steps`` tokens after ``first_token`` ([B]); return them ([B, steps]).

        The prompt (left-padded to ``width``) must already be in the buffers. Afterwards `queries`
        holds each layer's look-ahead queries 1..steps.
        """
        with torch.inference_mode(), self.recorder.active():
            if self.use_graph and self.graph is None:
                self._reset(first_token, lengths, pad, width)
                self._step()  # warms every kernel up before capture; its writes are reset below
                self.graph = self._capture()
            self._reset(first_token, lengths, pad, width)
            for _ in range(self.steps):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._step()
        return self.tokens

    def _reset(self, first_token: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor, width: int) -> None:
        columns = torch.arange(self.capacity, device=self.device)
        visible = (columns[None, :] >= pad[:, None]) & (columns[None, :] < width)
        self.mask.copy_(
            torch.zeros_like(self.mask).masked_fill(~visible[:, None, None, :], torch.finfo(self.mask.dtype).min)
        )
        self.token.copy_(first_token[:, None])
        self.position.copy_(lengths[:, None])
        self.slot.fill_(width)
        self.index.zero_()

    def _capture(self) -> Any:
        """Capture one step (recorded, not run); on failure turn graphs off for these buffers and return None."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step()
        except Exception:  # a model whose step cannot be captured still scores, eagerly
            self.use_graph = False
            logger.warning(
                "the draft's look-ahead step cannot be captured as a CUDA graph; it runs eagerly", exc_info=True
            )
            return None
        return graph
