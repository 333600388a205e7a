"""The prompt prefill and look-ahead decoding of `DraftAttentionScorer` over fixed buffers.

For a draft whose every layer attends globally, scoring needs only each layer's keys of the prompt and
the post-RoPE queries of the last prompt token and of the look-ahead tokens. `FixedBufferLookAhead` holds
them in stacked fixed buffers so that:

- the prefill keeps no cache: each layer's keys (and values, when there are decode steps) go into
  the buffers and the last prompt token's query is recorded, with no scoring work inside the pass.
  For Llama-style drafts a `LeanModel` (`specprefill_sdk.runtime.lean`) computes the prefill of an
  unpadded batch and every decode step from the weights and writes them there itself; otherwise
  the model's forward runs and a `QueryRecorder` in its attention hook copies them;
- every decode step is identical in shape and reads and writes only device tensors (the input token,
  its position, its cache slot, a 4-D additive mask whose slot is unmasked in place, the step index),
  so that on CUDA it is captured once as a graph and replayed. Run eagerly, each step of a small model
  costs far more in Python and kernel launches than in arithmetic;
- Llama-style RMSNorm layers run as one fused kernel plus the weight (`specprefill_sdk.runtime.norms`), when asked;
- with a compiled `LeanModel`, each decode step runs one `torch.compile`d function per layer;
- all queries of all layers are scored together at the end (`ScoreCollector.observe_stacked`), with
  the same arithmetic as one at a time;
- with ``layers`` set (no decode steps), the prefill stops once the last of those layers has handed
  over its keys and query: the later layers, the final norm and the output head never run.

On CPU (or with graphs turned off) the same steps run eagerly. A graph is kept for the last batch
size and capacity and reused while prompts fit (capacities are rounded up to 1024 slots); its
buffers stay allocated until `release` or until a larger prompt needs a larger graph.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...models import cache_argument, forward_parameters, text_config
from ...runtime.lean import LeanModel
from ...runtime.norms import fused_norms
from .hook import DraftStopped, QueryRecorder

__all__ = ["FixedBufferLookAhead", "supports_fixed_buffers"]

logger = logging.getLogger(__name__)

_ROUND = 1024


def supports_fixed_buffers(model: Any) -> bool:
    """True when every attention layer of ``model`` attends globally and without a logit soft-cap."""
    config = text_config(model.config)
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    if types is None and getattr(config, "sliding_window", None):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


class _FixedBufferCache:
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


class FixedBufferLookAhead:
    """Fixed buffers (and, on CUDA, one captured graph) for the prefill and ``steps`` greedy decode steps.

    Use: `prefill`, then `run` (when ``steps`` > 0), then score `query_stack` against `key_stack`.
    One scoring call at a time: `DraftAttentionScorer` holds its own lock around all three.
    """

    def __init__(
        self,
        model: Any,
        batch: int,
        capacity: int,
        steps: int,
        *,
        cuda_graph: bool,
        fused_norms: bool = False,
        layers: int | None = None,
        lean: LeanModel | None = None,
    ) -> None:
        self.model = model
        #: the draft's passes computed from its weights (`LeanModel`), or None: transformers' forward
        self.lean = lean
        #: run the norms `install_fused_norms` converted as fused kernels in the prefill and the steps
        self.fused_norms = fused_norms
        self.batch, self.capacity, self.steps = batch, capacity, steps
        device = next(model.parameters()).device
        dtype = model.dtype
        config = text_config(model.config)
        depth = int(config.num_hidden_layers)
        if layers is not None and not (1 <= layers <= depth and (layers == depth or steps == 0)):
            raise ValueError(f"layers={layers} needs 1 <= layers <= {depth}, and no decode steps below {depth}")
        #: the prefill's last layer (the forward pass stops after its attention inputs), or None: all of them
        self.stop_after = layers - 1 if layers is not None and layers < depth else None
        layers = depth if layers is None else layers
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        shape = (layers, batch, kv_heads, capacity, head_dim)
        #: ``[L, B, KVH, capacity, d]``; values only when there are decode steps to attend with them
        # Slots past the prompt are attended to (masked) by the decode steps: they must hold finite
        # values, so buffers with steps start zeroed; without steps the prefill writes every slot.
        alloc = torch.zeros if steps else torch.empty
        self.key_stack = alloc(shape, dtype=dtype, device=device)
        self.value_stack = alloc(shape, dtype=dtype, device=device) if steps else None
        #: ``[L, B, H, 1 + steps, d]``: query 0 is the last prompt token's, query j the j-th step's (in the
        #: model's dtype, as the attention received them: the reduction reads them into fp32 exactly)
        self.query_stack = torch.zeros(layers, batch, heads, 1 + steps, head_dim, dtype=dtype, device=device)
        self.keys = list(self.key_stack.unbind(0))
        self.values = list(self.value_stack.unbind(0)) if self.value_stack is not None else []
        self.mask = torch.zeros(batch, 1, 1, capacity, dtype=dtype, device=device)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.index = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, 1 + steps, dtype=torch.long, device=device)  # column j: step j's output
        self.query_list = list(self.query_stack.unbind(0))
        self.recorder = QueryRecorder(dict(enumerate(self.query_list)), self.index)
        self.cache = _FixedBufferCache(self.keys, self.values, self.slot)
        self._kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1, cache_argument(model): self.cache}
        if "cache_position" in forward_parameters(model.__class__):
            self._kwargs["cache_position"] = self.slot
        self.use_graph = cuda_graph and device.type == "cuda" and steps > 0
        self.graph: Any = None
        self.device = device
        self.written: set[int] = set()

    @staticmethod
    def capacity_for(width: int, steps: int) -> int:
        need = width + steps
        return -(-need // _ROUND) * _ROUND

    def fits(self, batch: int, width: int, steps: int) -> bool:
        """Whether these buffers serve a batch of ``batch`` prompts ``width`` wide with ``steps`` steps."""
        need = width + steps
        return batch == self.batch and steps == self.steps and need <= self.capacity <= max(2 * need, need + _ROUND)

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Run the draft over the (left-padded) prompt, filling the buffers; return its next tokens ([B]).

        Afterwards `written` holds the layers whose attention the hook saw. When the pass stops early
        (``layers`` below the model's depth) there are no next tokens and the result is None.
        """
        width = input_ids.shape[1]
        self.written = set()
        if self.lean is not None and attention_mask is None and position_ids is None:
            count = len(self.keys) if self.stop_after is None else self.stop_after + 1
            with torch.inference_mode():
                first = self.lean.prefill(
                    input_ids, self.keys, self.values, self.query_list, self.recorder.scaling, self.stop_after
                )
            self.written = set(range(count))
            return first

        def sink(layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
            self.written.add(layer)
            self.keys[layer][:, :, :width].copy_(key)
            if self.values:
                self.values[layer][:, :, :width].copy_(value)

        self.index.zero_()
        self.recorder.sink = sink
        self.recorder.stop_after = self.stop_after
        try:
            with torch.inference_mode(), self.recorder.active(), fused_norms(self.fused_norms):
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                    logits_to_keep=1,
                )
        except DraftStopped:
            return None
        finally:
            self.recorder.sink = None
            self.recorder.stop_after = None
        return out.logits[:, -1].argmax(-1)

    def scalings(self) -> list[float]:
        """Each layer's softmax scaling, as the prefill's attention calls reported it."""
        return [self.recorder.scaling[layer] for layer in range(len(self.keys))]

    def _step(self) -> None:
        self.mask.index_fill_(3, self.slot, 0.0)
        if self.lean is not None:
            nxt = self.lean.step(
                self.token,
                self.position,
                self.slot,
                self.index,
                self.mask,
                self.keys,
                self.values,
                self.query_list,
                QueryRecorder.attend,
            )
        else:
            out = self.model(input_ids=self.token, position_ids=self.position, attention_mask=self.mask, **self._kwargs)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        self.tokens.index_copy_(1, self.index, nxt)
        self.token.copy_(nxt)
        self.position.add_(1)
        self.slot.add_(1)
        self.index.add_(1)

    def run(self, first_token: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor, width: int) -> torch.Tensor:
        """Decode ``steps`` tokens after ``first_token`` ([B]); return them ([B, steps]).

        `prefill` must have filled the buffers. Afterwards `query_stack` holds every layer's queries
        0 .. steps.
        """
        with torch.inference_mode(), self.recorder.active(), fused_norms(self.fused_norms):
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
        return self.tokens[:, 1:]

    def _reset(self, first_token: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor, width: int) -> None:
        columns = torch.arange(self.capacity, device=self.device)
        visible = (columns[None, :] >= pad[:, None]) & (columns[None, :] < width)
        self.mask.copy_(
            torch.zeros_like(self.mask).masked_fill(~visible[:, None, None, :], torch.finfo(self.mask.dtype).min)
        )
        self.token.copy_(first_token[:, None])
        self.position.copy_(lengths[:, None])
        self.slot.fill_(width)
        self.index.fill_(1)  # query 0 is the prefill's

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
