"""Forward passes written directly against a Llama-style model's weights (the scorer's and the backend's).

transformers' decoder layer is a stack of modules, each a Python call and a handful of kernels. On a
GPU, a look-ahead decode step of a small draft, or the prefill of a few hundred kept tokens, costs
what the host takes to issue those calls and what launching each kernel costs, more than what the
arithmetic costs. `LeanModel` computes the same layers as plain functions of their weights:

- eagerly, with the same operations in the same order as transformers' Llama, Qwen2 and Mistral
  layers (the same numbers, bit for bit, on CPU), minus the modules, hooks and per-layer cache logic;
- or, with ``compiled=True`` (CUDA only), with each layer's element-wise chains (norm, rotary
  embedding, the gated activation, the residual additions) fused by `torch.compile`. The matrix
  products and the attention stay what they were; element-wise chains are rounded once instead of
  after every operation, so results differ in the last bits, as between two attention kernels.

`LeanModel.forward` hands each layer's queries, keys and values to a callback: the scorer's
fixed-buffer path (`FixedBufferLookAhead`) writes them straight into its buffers, the backend into its KV
cache. Only models whose every layer is of the supported kind are accepted (`LeanModel.build` returns
None otherwise, and callers run transformers' own forward).
"""

from __future__ import annotations

import functools
import logging
import threading
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..models import text_config
from .attention import base_implementation
from .norms import fused_rms_norm

__all__ = ["LeanModel"]

logger = logging.getLogger(__name__)

#: ``config.model_type`` values whose decoder layers `LeanModel` computes
_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
_compile_lock = threading.Lock()
#: a prefill whose hidden states (tokens x hidden size) have fewer elements runs its compiled functions
#: no faster than the plain ones: their own host work per call outweighs what they save. The threshold
#: comes from the lean benchmarks of small and large targets and drafts (docs/benchmarks.md, "Lean
#: passes, and compiled ones").
COMPILE_MIN_ELEMENTS = 1 << 22


#: whether `F.scaled_dot_product_attention` takes ``enable_gqa`` (torch 2.5 and later)
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


class _Layer(NamedTuple):
    """One decoder layer's weights; with packed weights (`pack_rows`) also the buffers that hold them."""

    attention: Any  # the attention module (handed to the attention function, as transformers does)
    norm_in: torch.Tensor
    eps_in: float
    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    norm_post: torch.Tensor
    eps_post: float
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    scaling: float
    wqkv: torch.Tensor | None = None  # the query, key and value rows in one buffer
    bqkv: torch.Tensor | None = None  # their biases
    w_gate_up: torch.Tensor | None = None  # the gate and up rows in one buffer


def _rows_of_one_buffer(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The one buffer whose consecutive rows ``tensors`` are (a view of it), or None when they are not."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        if (
            not t.is_contiguous()
            or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or t.storage_offset() != offset
            or t.shape[1:] != first.shape[1:]
        ):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return torch.as_strided(first.detach(), (rows, *first.shape[1:]), first.stride())


def pack_rows(modules: list[torch.nn.Module], name: str) -> torch.Tensor:
    """Store the modules' parameters ``name`` (stacked along dim 0) in one buffer, in place; return it.

    Each module's parameter becomes a view of its rows of the buffer: the same values, and, once the
    old tensors are freed, the same memory. One matrix product with the buffer then computes what the
    modules' products computed one by one. Parameters already laid out so are left as they are.
    """
    params = [getattr(m, name) for m in modules]
    buffer = _rows_of_one_buffer(params)
    if buffer is not None:
        return buffer
    with torch.no_grad():
        buffer = torch.cat([p.detach() for p in params])
    start = 0
    for module, param in zip(modules, params, strict=True):
        rows = param.shape[0]
        setattr(module, name, torch.nn.Parameter(buffer[start : start + rows], requires_grad=param.requires_grad))
        start += rows
    return buffer


def _packed_modules(layer: Any) -> list[torch.nn.Module]:
    """A decoder layer's projections whose weights `LeanModel` packs: q, k, v, gate, up."""
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj]


def _packed_split(layers: Any) -> tuple[int, int, int] | None:
    """The query, key and value rows of the decoder ``layers``' packed matrices, or None: not packable.

    Packable: in every layer the query, key and value projections all have biases or all lack them,
    and every weight to pack is materialised on one device in one dtype.
    """
    attentions = [layer.self_attn for layer in layers]
    weights = [m.weight for layer in layers for m in _packed_modules(layer)]
    biases = ({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None} for a in attentions)
    if any(len(kinds) > 1 for kinds in biases) or len({(w.device, w.dtype) for w in weights}) > 1:
        return None
    if weights[0].is_meta:
        return None
    first = attentions[0]
    return (int(first.q_proj.weight.shape[0]), int(first.k_proj.weight.shape[0]), int(first.v_proj.weight.shape[0]))


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool) -> torch.Tensor:
    """Llama's RMSNorm: fused (`specprefill_sdk.runtime.norms`) or as transformers writes it."""
    if fused:
        return fused_rms_norm(x, weight, eps)
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_inputs(
    h: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    wq: torch.Tensor,
    bq: torch.Tensor | None,
    wk: torch.Tensor | None,
    bk: torch.Tensor | None,
    wv: torch.Tensor | None,
    bv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    fused: bool,
    split: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's post-RoPE queries and keys and its values (``[B, heads, S, d]``) from its input ``h``.

    ``split``: ``wq`` (and ``bq``) hold the query, key and value rows (that many of each) in one matrix;
    ``wk``, ``bk``, ``wv`` and ``bv`` are not used.
    """
    x = _norm(h, norm, eps, fused)
    shape = (*x.shape[:-1], -1, head_dim)
    if split is None:
        assert wk is not None and wv is not None
        q, k, v = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
    else:
        q, k, v = F.linear(x, wq, bq).split(split, dim=-1)
    q, k, v = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = (q * cos) + (_rotate_half(q) * sin)
    k = (k * cos) + (_rotate_half(k) * sin)
    return q, k, v


def layer_output(
    h: torch.Tensor,
    attended: torch.Tensor,
    wo: torch.Tensor,
    bo: torch.Tensor | None,
    norm: torch.Tensor,
    eps: float,
    w_gate: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down: torch.Tensor,
    fused: bool,
) -> torch.Tensor:
    """The layer's output from its input ``h`` and the attention's output (``[B, S, heads * d]``).

    ``w_up`` None: ``w_gate`` holds the gate rows and then the up rows (one product).
    """
    h = h + F.linear(attended, wo, bo)
    x = _norm(h, norm, eps, fused)
    if w_up is None:
        gate, up = F.linear(x, w_gate).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w_down)
    # one expression: each product is freed once used (a prefill's MLP activations are its largest tensors)
    return h + F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def decode_layer(
    h: torch.Tensor,
    layer: _Layer,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    fused: bool,
    keys: torch.Tensor,
    values: torch.Tensor,
    queries: torch.Tensor,
    slot: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor,
    attend: Callable[..., torch.Tensor],
    split: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """One layer of a one-token decode step over fixed buffers (``keys``, ``values``: ``[B, KVH, S, d]``).

    The token's key and value go to slot ``slot``, its query to query ``index`` of ``queries``
    (``[B, H, J, d]``); ``attend(query, keys, values, mask, scaling)`` is the one-query attention.
    ``split``: multiply by the layer's packed buffers (`_Layer`), with that many query, key and value rows.
    """
    p = layer
    if split is not None and p.wqkv is not None and p.w_gate_up is not None:
        q, k, v = attention_inputs(
            h, p.norm_in, p.eps_in, p.wqkv, p.bqkv, None, None, None, None, cos, sin, head_dim, fused, split
        )
        gate, up = p.w_gate_up, None
    else:
        q, k, v = attention_inputs(
            h, p.norm_in, p.eps_in, p.wq, p.bq, p.wk, p.bk, p.wv, p.bv, cos, sin, head_dim, fused
        )
        gate, up = p.w_gate, p.w_up
    keys.index_copy_(2, slot, k)
    values.index_copy_(2, slot, v)
    queries.index_copy_(2, index, q)
    attended = attend(q, keys, values, mask, p.scaling).reshape(h.shape[0], 1, -1)
    return layer_output(h, attended, p.wo, p.bo, p.norm_post, p.eps_post, gate, up, p.w_down, fused)


def sdpa_one_query(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One-query attention over fixed buffers by SDPA (``mask``: additive, ``[B, 1, 1, S]``); ``[B, 1, H, d]``.

    The compiled decode step's attention, in place of `QueryRecorder.attend`'s two products and
    softmax: with it, a compiled step's cost grows far less with the prompt's length than the steps
    that attend with `QueryRecorder.attend`, and its scores stay as close to the slow reference's
    (docs/benchmarks.md, "Packed weights and SDPA in the compiled look-ahead step").
    """
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)


def greedy_token(
    h: torch.Tensor, norm: torch.Tensor, eps: float, head: torch.Tensor, head_bias: torch.Tensor | None, fused: bool
) -> torch.Tensor:
    """The greedy next tokens (``[B, 1]``) from the last layer's output ``h`` (``[B, S, D]``) at its last position.

    The final norm, the output head and the argmax, for a decode step: a compiled step runs it as one
    function, so that the norm and the argmax over the vocabulary become one fused kernel each
    (eagerly they are several kernels of their own after the layers). The prefill's logits go
    through the head module instead (`LeanModel.forward`), so that hooks on it see them.
    """
    logits = F.linear(_norm(h[:, -1:], norm, eps, fused), head, head_bias)
    return logits[:, -1].argmax(-1, keepdim=True)


def _copy(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``fn`` with a code object of its own: `torch.compile` keeps its compiled variants per code object."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return functools.wraps(fn)(copy)


#: (function name, model signature) -> that function's own copy (`_copy`), shared by its compiled variants
_copies: dict[tuple[str, tuple[Any, ...]], Callable[..., Any]] = {}


@functools.cache
def _compiled(fn: Callable[..., Any], signature: tuple[Any, ...], dynamic: bool | None) -> Callable[..., Any]:
    """``fn`` compiled for models of one ``signature`` (shapes, dtype, norm constants), once per process.

    ``dynamic``: True for any number of tokens (a prefill); None for a decode step (compiled for the
    first buffer size seen, then once more for any size). Each signature gets its own copy of ``fn``,
    so that models of several kinds in one process (a draft and its target) do not share, and
    exhaust, one function's budget of recompilations.
    """
    key = (fn.__name__, signature)
    if key not in _copies:
        _copies[key] = _copy(fn, str(len(_copies)))
    return torch.compile(_copies[key], fullgraph=True, dynamic=dynamic)


def _reason(model: Any) -> str | None:
    """Why `LeanModel` cannot compute ``model``'s layers (None: it can)."""
    config = text_config(model.config)
    if getattr(config, "model_type", None) not in _MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {sorted(_MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu" or int(getattr(config, "pretraining_tp", 1) or 1) != 1:
        return "activation or tensor-parallel layout differs from Llama's"
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "no decoder with embed_tokens, layers, norm and rotary_emb"
    if not isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        return "no linear lm_head"
    norms = [base.norm] + [m for layer in base.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
    if not all(isinstance(getattr(m, "variance_epsilon", None), float) for m in norms):
        return "a norm without variance_epsilon"
    from .norms import _fused_class

    for m in norms:
        cls = type(m) if not getattr(type(m), "_specprefill_fused", False) else type(m).__mro__[1]
        if _fused_class(cls) is None:
            return f"{cls.__name__} computes something other than Llama's RMSNorm"
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = ("q_proj", "k_proj", "v_proj", "o_proj")
        if not all(isinstance(getattr(attn, p, None), torch.nn.Linear) for p in projections):
            return "an attention layer without q/k/v/o projections"
        if any(hasattr(attn, extra) for extra in ("q_norm", "k_norm")):
            return "an attention layer that normalises its queries or keys"
        linear = ("gate_proj", "up_proj", "down_proj")
        if not all(isinstance(getattr(mlp, p, None), torch.nn.Linear) and getattr(mlp, p).bias is None for p in linear):
            return "an MLP other than a bias-free gated SiLU"
        if not isinstance(getattr(attn, "scaling", None), float):
            return "an attention layer without a scaling"
    # The prefill's attention relies on SDPA's own causal mask (no mask is built); transformers' eager
    # attention applies none without one.
    implementation = base_implementation(model)
    if implementation != "sdpa":
        return f"attention implementation {implementation!r} (the lean prefill needs 'sdpa')"
    return None


def _attention_function() -> Callable[..., Any]:
    """transformers' SDPA attention function (with no mask and several queries it attends causally)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"]


class LeanModel:
    """A Llama-style model's forward passes from its weights: the scorer's prefill and steps, the backend's prefill.

    Build with `build` (None for a model it does not compute). ``fused`` selects the fused RMSNorm
    (`specprefill_sdk.runtime.norms`); ``compiled`` runs each decode step's layers, and the layers of prefills
    of at least `COMPILE_MIN_ELEMENTS` hidden-state elements, as `torch.compile`d functions (CUDA only;
    the first call compiles, once per process and kind of model). ``packed`` stores each layer's query,
    key and value weights (and biases), and its gate and up weights, in one buffer each, in place
    (`pack_rows`: the model's parameters become views of it; no memory is added), so that a layer of a
    decode step makes two matrix products where it made five; results differ from the unpacked
    products' in the last bits at most. Prefills keep one product per projection: the output of a
    packed product stays allocated, whole, until its last part is used (at 32K tokens, 0.5 GiB more
    for Llama-3.2-1B's MLP). Models whose query, key and value projections do not all have a bias,
    or all lack one, and models whose weights are on several devices or dtypes (or not materialised),
    are not packed. A model shared by several of them is packed once: the later ones find its
    buffers.
    """

    def __init__(self, model: Any, *, fused: bool, compiled: bool, packed: bool = False, bucket: int = 1) -> None:
        base = model.model
        config = text_config(model.config)
        self.model, self.base = model, base
        self.fused = fused
        self.compiled = compiled
        #: prompt attention runs on rows padded to a multiple of this many (1: unpadded); see `attend`
        self.bucket = bucket
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.hidden = int(config.hidden_size)
        #: the query, key and value rows of the packed matrices, or None (not packed)
        self.split = _packed_split(base.layers) if packed else None
        self.layers: list[_Layer] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            wqkv = bqkv = w_gate_up = None
            if self.split is not None:  # first: the modules' parameters then are views of these buffers
                qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
                wqkv = pack_rows(qkv, "weight")
                bqkv = None if attn.q_proj.bias is None else pack_rows(qkv, "bias")
                w_gate_up = pack_rows([mlp.gate_proj, mlp.up_proj], "weight")
            self.layers.append(
                _Layer(
                    attention=attn,
                    norm_in=layer.input_layernorm.weight,
                    eps_in=float(layer.input_layernorm.variance_epsilon),
                    wq=attn.q_proj.weight,
                    bq=attn.q_proj.bias,
                    wk=attn.k_proj.weight,
                    bk=attn.k_proj.bias,
                    wv=attn.v_proj.weight,
                    bv=attn.v_proj.bias,
                    wo=attn.o_proj.weight,
                    bo=attn.o_proj.bias,
                    norm_post=layer.post_attention_layernorm.weight,
                    eps_post=float(layer.post_attention_layernorm.variance_epsilon),
                    w_gate=mlp.gate_proj.weight,
                    w_up=mlp.up_proj.weight,
                    w_down=mlp.down_proj.weight,
                    scaling=float(attn.scaling),
                    wqkv=wqkv,
                    bqkv=bqkv,
                    w_gate_up=w_gate_up,
                )
            )
        self.attend_prompt = _attention_function()
        first_layer = self.layers[0]
        #: what the compiled functions specialise on, besides tensor shapes
        self.signature = (
            str(model.dtype),
            self.head_dim,
            fused,
            tuple(sorted({(p.eps_in, p.eps_post) for p in self.layers})),
            tuple(t is None for t in (first_layer.bq, first_layer.bk, first_layer.bv, first_layer.bo)),
            tuple(first_layer.wq.shape),
            tuple(first_layer.wk.shape),
            tuple(first_layer.w_gate.shape),
            self.split,
        )

    @property
    def packed(self) -> bool:
        """Whether the layers' weights are packed (`pack_rows`)."""
        return self.split is not None

    @classmethod
    def build(
        cls, model: Any, *, fused: bool, compiled: bool, packed: bool = False, bucket: int = 1
    ) -> LeanModel | None:
        """A `LeanModel` for ``model``, or None (logged) when its layers are not of the supported kind."""
        reason = _reason(model)
        if reason is not None:
            logger.debug("%s runs through transformers' modules: %s", type(model).__name__, reason)
            return None
        return cls(model, fused=fused, compiled=compiled, packed=packed, bucket=bucket)

    def attend(self, layer: _Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of a prompt's rows (``[B, heads, S, d]``); the result is ``[B, S, heads, d]``.

        With `bucket` above 1 the rows are padded with zeros at the end to a multiple of it first and
        the padding's outputs dropped: a causal row never attends to a later one, so the prompt's
        outputs are those of the unpadded rows, while a kernel that builds something per shape (cuDNN
        builds an execution plan) builds it once per bucket instead of once per prompt length.
        """
        width = q.shape[2]
        pad = -width % self.bucket if width > 1 else 0
        if pad:
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        attended, _ = self.attend_prompt(layer.attention, q, k, v, None, dropout=0.0, scaling=layer.scaling)
        return attended[:, :width] if pad else attended

    def _functions(self, device: torch.device, tokens: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The two per-layer functions of a prefill of ``tokens`` tokens: compiled when asked for and worth it."""
        if not (self.compiled and device.type == "cuda" and tokens * self.hidden >= COMPILE_MIN_ELEMENTS):
            return attention_inputs, layer_output
        with _compile_lock:
            return (
                _compiled(attention_inputs, self.signature, True),
                _compiled(layer_output, self.signature, True),
            )

    def _step_function(self, fn: Callable[..., torch.Tensor], device: torch.device) -> Callable[..., torch.Tensor]:
        """``fn`` as a decode step runs it: compiled when asked for and on CUDA, else as it is."""
        if not (self.compiled and device.type == "cuda"):
            return fn
        with _compile_lock:
            return _compiled(fn, self.signature, None)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The logits (``[B, vocab]``) of the last layer's output ``h`` for one position (``[B, 1, D]``).

        Through the model's head module, as transformers' forward does: hooks on it see the logits.
        """
        norm = self.base.norm
        logits: torch.Tensor = self.model.lm_head(_norm(h, norm.weight, float(norm.variance_epsilon), self.fused))
        return logits[:, -1]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        store: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], bool],
    ) -> torch.Tensor | None:
        """Run a batch of token rows (``[B, S]``, attending causally, no padding) through the layers.

        ``positions`` (``[B, S]``) are the tokens' position ids. After layer ``l`` computes its
        post-RoPE queries and keys and its values (``[B, heads, S, d]``), ``store(l, q, k, v)`` is
        called; when it returns True the pass ends there (result None). Otherwise the result is the
        last position's logits (``[B, vocab]``).
        """
        batch, width = input_ids.shape
        inputs, outputs = self._functions(input_ids.device, batch * width)
        h = self.base.embed_tokens(input_ids)
        cos, sin = self.base.rotary_emb(h, position_ids=positions)
        for i, p in enumerate(self.layers):
            q, k, v = inputs(
                h, p.norm_in, p.eps_in, p.wq, p.bq, p.wk, p.bk, p.wv, p.bv, cos, sin, self.head_dim, self.fused
            )
            if store(i, q, k, v):
                return None
            attended = self.attend(p, q, k, v).reshape(batch, width, -1).contiguous()
            if i == len(self.layers) - 1:  # only the last position feeds the next token
                h, attended = h[:, -1:], attended[:, -1:]
            h = outputs(h, attended, p.wo, p.bo, p.norm_post, p.eps_post, p.w_gate, p.w_up, p.w_down, self.fused)
        return self._logits(h)

    def prefill(
        self,
        input_ids: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        queries: list[torch.Tensor],
        scalings: dict[int, float],
        stop_after: int | None,
    ) -> torch.Tensor | None:
        """Run an unpadded prompt batch (``[B, S]``) through the layers, filling the scoring buffers.

        Layer ``l``'s keys (and values, when ``values`` is not empty) go to slots ``[0, S)`` of
        ``keys[l]``, its last query to query 0 of ``queries[l]``. With ``stop_after`` set, the pass
        ends once that layer's keys and query are stored (result None); else it returns the next
        tokens (``[B]``).
        """
        batch, width = input_ids.shape

        def store(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
            keys[i][:, :, :width].copy_(k)
            if values:
                values[i][:, :, :width].copy_(v)
            queries[i][:, :, 0].copy_(q[:, :, -1])
            scalings[i] = self.layers[i].scaling
            return i == stop_after

        positions = torch.arange(width, device=input_ids.device)[None, :].expand(batch, width)
        logits = self.forward(input_ids, positions, store)
        return None if logits is None else logits.argmax(-1)

    def step(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        slot: torch.Tensor,
        index: torch.Tensor,
        mask: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        queries: list[torch.Tensor],
        attend: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """One decode step of ``token`` (``[B, 1]``) at ``position``; return the next tokens (``[B, 1]``).

        Its keys and values go to cache slot ``slot`` of every layer, its queries to query ``index``
        of ``queries``; ``attend(query, keys, values, mask, scaling)`` is the one-query attention
        (compiled steps attend with `sdpa_one_query` instead, where torch offers it).
        Every input is a device tensor, so the step can be captured as a CUDA graph and replayed.
        """
        layer = self._step_function(decode_layer, token.device)
        if layer is not decode_layer and _SDPA_GQA:
            attend = sdpa_one_query
        h = self.base.embed_tokens(token)
        cos, sin = self.base.rotary_emb(h, position_ids=position)
        for i, p in enumerate(self.layers):
            h = layer(
                h,
                p,
                cos,
                sin,
                self.head_dim,
                self.fused,
                keys[i],
                values[i],
                queries[i],
                slot,
                index,
                mask,
                attend,
                self.split,
            )
        norm, head = self.base.norm, self.model.lm_head
        greedy = self._step_function(greedy_token, token.device)
        return greedy(h, norm.weight, float(norm.variance_epsilon), head.weight, head.bias, self.fused)
