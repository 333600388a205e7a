"""`DraftAttentionScorer`: token importance from a small draft model's attention (the SpecPrefill method).

The draft reads the whole prompt (n tokens), then greedily decodes up to ``look_ahead - 1`` more tokens.
The post-RoPE queries of the last prompt token and of each look-ahead token attend, in every layer and
head, to the draft's keys of the prompt only::

    a[l, h, j, :] = softmax(q_j . K_prompt^T * scaling)            (fp32, over the n prompt keys)
    s_i = mean_j  max_{l, h}  avg_pool(a[l, h, j, :], kernel)[i]     (edges not damped)

``aggregation`` replaces the max over layers and heads: ``"mean"`` takes their mean,
``"content-mean"`` the mean of rows that first leave out the attention sink and the local window and
are renormalised over the rest, and ``"last-layer"`` the mean over the heads of the deepest scored
layer alone (see `Aggregation`). ``queries="max"`` replaces the mean over the queries j by their max.

Example::

    scorer = DraftAttentionScorer("smollm2-135m", look_ahead=8)
    scores = scorer.score(build_prompt(scorer.loaded.tokenizer, "...long text... Question: ..."))
    scores.values.topk(10)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, get_args

import torch

from ...cost import CostCurve, WarmUpReport, warm_up, warmup_lengths, warmup_token_ids
from ...errors import InvalidRequestError, SpecPrefillError
from ...models import DEFAULT_MODEL, LoadedModel, cache_argument, load_model, model_lock, text_config
from ...runtime.attention import sdpa_context
from ...runtime.lean import LeanModel
from ...runtime.norms import install_fused_norms
from ...runtime.settings import ExecutionSettings
from ...types import Aggregation, Prompt, QueryReduction, TokenScores, int64_tensor
from ...validation import check_choice, check_int
from .._alignment import DraftTokens, check_prompt, project_scores, same_vocabulary, to_draft_tokens
from .hook import DraftStopped, ScoreCollector, install, skipped_layers
from .lookahead import FixedBufferLookAhead, supports_fixed_buffers

if TYPE_CHECKING:
    from .incremental import DraftSession

__all__ = ["AGGREGATIONS", "QUERY_REDUCTIONS", "DraftAttentionScorer", "check_aggregation", "check_queries"]

#: Every `Aggregation`, the paper's first.
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)
#: Every `QueryReduction`, the paper's first.
QUERY_REDUCTIONS: tuple[QueryReduction, ...] = get_args(QueryReduction)


def check_aggregation(value: Any) -> Aggregation:
    """``value`` when it names an `Aggregation`; raises `InvalidRequestError` (param ``aggregation``) otherwise."""
    return cast("Aggregation", check_choice(value, AGGREGATIONS, "aggregation"))


def check_queries(value: Any) -> QueryReduction:
    """``value`` when it names a `QueryReduction`; raises `InvalidRequestError` (param ``queries``) otherwise."""
    return cast("QueryReduction", check_choice(value, QUERY_REDUCTIONS, "queries"))


logger = logging.getLogger(__name__)


class DraftAttentionScorer:
    """Scores prompt tokens by the attention a draft model pays them while it starts to answer.

    Args:
        draft: a model spec for `load_model` or an already loaded `LoadedModel` (it may be the
            target's own: scoring never changes what the model computes outside a scoring call).
        look_ahead: N, the number of queries: the last prompt token plus up to N-1 greedily decoded
            tokens (fewer when the draft emits an end-of-sequence id). 1 = last prompt token only.
        pool_kernel: width of the average pool that smooths each attention row (1 = none).
        device, dtype: where and how to load ``draft`` when it is a spec (ignored for a `LoadedModel`).
        target_tokenizer: the target's tokenizer, when known; the draft then reads the prompt's ids
            directly if both vocabularies are equal and re-tokenizes the prompt's text otherwise.
            Without it each prompt is checked: ids the draft tokenizer reproduces from the text are read
            directly, others are re-tokenized.
        layers: score with the draft's first ``layers`` decoder layers only, and run only those: the
            prefill stops after that layer's attention inputs (no later layer, final norm or output
            head runs), so scoring costs about ``layers / depth`` of a full draft prefill. Needs
            ``look_ahead=1`` (look-ahead tokens come from the whole model). ``None``: every layer.
            See docs/scoring.md for what it does to evidence recall.
        layer_share: the same as ``layers``, given as a share of the draft's depth in (0, 1]: the
            first ``round(layer_share * depth)`` layers (at least one), so one setting reads the same
            relative depth of any draft. Not with ``layers``; needs ``look_ahead=1`` below 1.
        aggregation: how each query's attention rows are reduced over layers and heads (`Aggregation`):
            ``"max"`` (the SpecPrefill paper's), ``"mean"``, ``"content-mean"``: the mean of rows
            without the attention sink (the first token) and the local window (the prompt's last
            `CONTENT_WINDOW` tokens, at most half of it), each renormalised over the rest, or
            ``"last-layer"``: the mean over the heads of the deepest scored layer only (layer
            ``layers - 1`` with ``layers``; GemFilter's reading of one layer). Tokens of
            ``"content-mean"``'s left-out columns score zero: they are kept only when protected or
            when the budget reaches them. ``"content-mean"`` is what keeps a shallow draft
            (``layers``) near the full draft's evidence recall; see docs/benchmarks.md.
        queries: how the queries' per-token scores are combined (`QueryReduction`): ``"mean"``
            (the paper's) or ``"max"``, which keeps what each query needs most: a token one
            look-ahead query attends to strongly is not averaged away by the others (coverage of
            several pieces of evidence). With ``look_ahead=1`` both are the same.
        execution: how the draft's passes run (`ExecutionSettings`: fused norms, lean and compiled
            passes, the CUDA graph, the attention kernels, batch size); None: the defaults (compiled
            on a CUDA device, `ExecutionSettings.compile`). `warmup` compiles and measures.

    For a model whose every layer attends globally (Llama, Qwen2, SmolLM2, ...) the look-ahead runs
    over fixed buffers and all look-ahead queries are scored at once after the last step; other
    models decode step by step over a growing cache. Both give the same scores.

    The draft runs one scoring call at a time: every scorer on one draft model (`with_options`
    variants included) and every `DraftSession` of them share one re-entrant lock, `lock`, so
    callers in several threads need none of their own.

    Sliding-window layers (Gemma 2/3, Qwen2 with ``use_sliding_window``) do not count when the model
    also has full-attention layers; when every layer is windowed (Mistral), each layer counts with its
    attention restricted to its window, exactly as the draft computes it.

    Example::

        scorer = DraftAttentionScorer("smollm2-135m")
        cheaper = scorer.with_options(look_ahead=1)   # shares the loaded model
    """

    name = "draft-attention"

    def __init__(
        self,
        draft: str | LoadedModel = DEFAULT_MODEL,
        *,
        look_ahead: int = 8,
        pool_kernel: int = 13,
        device: str | torch.device | None = "auto",
        dtype: str | torch.dtype | None = "auto",
        target_tokenizer: Any = None,
        layers: int | None = None,
        aggregation: Aggregation = "max",
        execution: ExecutionSettings | None = None,
        queries: QueryReduction = "mean",
        layer_share: float | None = None,
    ) -> None:
        self.look_ahead = check_int(look_ahead, "look_ahead", param="look_ahead", minimum=1)
        #: how attention rows are reduced over layers and heads (`Aggregation`)
        self.aggregation: Aggregation = check_aggregation(aggregation)
        #: how the queries' per-token scores are combined (`QueryReduction`)
        self.queries: QueryReduction = check_queries(queries)
        self.pool_kernel = check_int(pool_kernel, "pool_kernel", param="pool_kernel", minimum=1)
        #: how the draft's passes run
        self.execution = ExecutionSettings.of(execution)
        run = self.execution
        if isinstance(draft, LoadedModel):
            self.loaded = draft
        else:
            self.loaded = load_model(draft, device=device, dtype=dtype)
        model = self.loaded.model
        install(model)
        self._skip = skipped_layers(model.config)
        if layer_share is not None and layers is not None:
            raise InvalidRequestError("give layers or layer_share, not both", param="layer_share")
        self.layers = self._check_layers(self._layers_of_share(layer_share) if layer_share is not None else layers)
        #: ``"last-layer"``: the deepest layer that counts (the only one that votes), else None
        self.last_layer: int | None = (
            max(i for i in range(self.layers or self.depth) if i not in self._skip)
            if self.aggregation == "last-layer"
            else None
        )
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._cache_arg = cache_argument(model)
        self._eos = torch.tensor(sorted(self.loaded.eos_token_ids), dtype=torch.long, device=self.loaded.device)
        self._fixed_buffers = supports_fixed_buffers(model)
        if self._fixed_buffers and run.fused_norms:
            install_fused_norms(model)
        compiled = run.compiles(self.loaded.device)
        if run.compile is True and not compiled:
            logger.info("compile=True has no effect on %s: the draft's passes run uncompiled", self.loaded.device)
        self._lean = (
            LeanModel.build(
                model,
                fused=run.fused_norms,
                compiled=compiled,
                packed=compiled,
                bucket=run.prompt_bucket(self.loaded.device),
            )
            if self._fixed_buffers and run.lean
            else None
        )
        self._runner: FixedBufferLookAhead | None = None
        #: held while the draft runs: every scorer and session on this draft model shares it
        self.lock = model_lock(model)
        self.target_tokenizer = target_tokenizer
        self._same_vocab: bool | None = (
            None if target_tokenizer is None else same_vocabulary(self.loaded.tokenizer, target_tokenizer)
        )
        #: the scoring pass's measured cost on this hardware (`warmup`), or None: not measured
        self.cost: CostCurve | None = None
        #: what `warmup` did, or None: it has not run
        self.warmed_up: WarmUpReport | None = None

    @property
    def compiled(self) -> bool:
        """Whether the draft's passes run compiled (`ExecutionSettings.compile`, resolved for its device)."""
        return self._lean is not None and self._lean.compiled

    def warmup(self, lengths: Sequence[int] | None = None) -> WarmUpReport:
        """Score prompts of a few lengths: compile and capture what does so now, and measure what scoring costs.

        ``lengths``: the prompt lengths in draft tokens (default: 1024, 4096 and 16384 on CUDA, 128,
        512 and 1024 elsewhere; capped at the draft's context). On CUDA each length runs once
        untimed (compiling the passes, capturing the look-ahead's CUDA graph for that buffer size)
        and twice timed. The fitted `CostCurve` (look-ahead steps included) becomes `cost`, the
        report `warmed_up`; both are logged. `Pipeline.warmup` calls it.

        Raises:
            InvalidRequestError: a length that is not an integer >= 1.
        """
        device = self.loaded.device
        sizes = warmup_lengths(device, self.loaded.max_context - self.look_ahead, lengths)
        ids = tuple(warmup_token_ids(self.loaded.tokenizer, max(sizes)))

        def run(n: int) -> None:
            with self.lock:
                self._score_ids([ids[:n]])

        self.warmed_up = warm_up(self, run, sizes, device, compiled=self.compiled, what="scoring")
        self.cost = self.warmed_up.cost
        return self.warmed_up

    @property
    def depth(self) -> int:
        """The draft's number of decoder layers."""
        return int(text_config(self.loaded.model.config).num_hidden_layers)

    @property
    def model_name(self) -> str:
        """The draft's name (as given to `load_model`)."""
        return self.loaded.name

    def layers_of_share(self, share: float) -> int:
        """How many layers ``layer_share=share`` scores with on this draft: ``round(share * depth)``, at least 1."""
        return max(1, round(share * self.depth))

    def _layers_of_share(self, share: Any) -> int:
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise InvalidRequestError(f"layer_share must be a number in (0, 1], got {share!r}", param="layer_share")
        return self.layers_of_share(float(share))

    def _check_layers(self, layers: Any) -> int | None:
        if layers is None:
            return None
        depth = self.depth
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= depth:
            raise InvalidRequestError(
                f"layers must be an integer from 1 to the draft's {depth} layers, got {layers!r}", param="layers"
            )
        if layers < depth and self.look_ahead > 1:
            raise InvalidRequestError(
                f"layers={layers} (fewer than the draft's {depth}) needs look_ahead=1: look-ahead tokens are "
                f"decoded by the whole model; got look_ahead={self.look_ahead}",
                param="layers",
            )
        if all(i in self._skip for i in range(layers)):
            raise InvalidRequestError(
                f"the draft's first {layers} layers all attend within a sliding window, and such layers do not "
                "count when the model has global ones; use more layers",
                param="layers",
            )
        return None if layers == depth else layers

    def __repr__(self) -> str:
        layers = "" if self.layers is None else f", layers={self.layers}"
        aggregation = "" if self.aggregation == "max" else f", aggregation={self.aggregation!r}"
        queries = "" if self.queries == "mean" else f", queries={self.queries!r}"
        return (
            f"DraftAttentionScorer(draft={self.model_name!r}, look_ahead={self.look_ahead}, "
            f"pool_kernel={self.pool_kernel}{layers}{aggregation}{queries})"
        )

    def new_session(self) -> DraftSession:
        """A `DraftSession`: this scorer's draft KV cache kept across conversation turns."""
        from .incremental import DraftSession

        return DraftSession(self)

    def with_options(
        self,
        look_ahead: int | None = None,
        pool_kernel: int | None = None,
        layers: int | None = None,
        execution: ExecutionSettings | None = None,
        aggregation: Aggregation | None = None,
        queries: QueryReduction | None = None,
    ) -> DraftAttentionScorer:
        """A scorer with other settings that shares this one's loaded draft model (and its lock).

        Each setting is kept unless given (``layers=scorer.depth`` asks for every layer again); a
        scorer with fewer layers than the draft's and ``look_ahead`` above 1 is refused. The measured
        `cost` is kept when the look-ahead, the layers and the execution settings are the same.
        """
        variant = DraftAttentionScorer(
            self.loaded,
            look_ahead=self.look_ahead if look_ahead is None else look_ahead,
            pool_kernel=self.pool_kernel if pool_kernel is None else pool_kernel,
            layers=self.layers if layers is None else layers,
            aggregation=self.aggregation if aggregation is None else aggregation,
            queries=self.queries if queries is None else queries,
            target_tokenizer=self.target_tokenizer,
            execution=self.execution if execution is None else execution,
        )
        # What a pass costs depends on the look-ahead, the layers and how it runs, not on the pool,
        # the aggregation or the query reduction (each a reduction of the same attention rows).
        if (variant.look_ahead, variant.layers, variant.execution) == (self.look_ahead, self.layers, self.execution):
            variant.cost = self.cost
        return variant

    def release(self) -> None:
        """Free the look-ahead buffers and CUDA graph kept between calls (they are rebuilt when needed).

        Both, like the lean passes, use the draft's parameters as they were when built: after giving
        the draft new parameter tensors (not values copied into the old ones), call this first.
        """
        with self.lock:
            self._runner = None
            if self._lean is not None:
                self._lean = LeanModel.build(
                    self.loaded.model,
                    fused=self.execution.fused_norms,
                    compiled=self._lean.compiled,
                    packed=self._lean.packed,
                    bucket=self._lean.bucket,
                )

    def score(self, prompt: Prompt) -> TokenScores:
        """One fp32 score per prompt token (larger: more important)."""
        return self.score_batch([prompt])[0]

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        """Score several prompts, batching those of similar length; equal to ``[score(p) for p in prompts]``.

        Calls from several threads take turns (`lock`): the draft model runs one scoring at a time.

        Raises:
            InvalidRequestError: an empty prompt, or token ids the draft cannot read.
            SpecPrefillError: a prompt longer than the draft's context window.
        """
        prompts = list(prompts)
        for p in prompts:
            check_prompt(p)
        inputs = [to_draft_tokens(p, self.loaded.tokenizer, self._vocab_size, self._same_vocab) for p in prompts]
        limit = self.loaded.max_context
        for d in inputs:
            if len(d.ids) > limit:
                raise SpecPrefillError(
                    f"the prompt has {len(d.ids)} draft tokens, more than the draft's context of {limit}",
                    code="draft_context_exceeded",
                )
        results: list[TokenScores | None] = [None] * len(prompts)
        for group in self._groups([len(d.ids) for d in inputs]):
            started = time.perf_counter()
            with self.lock:
                outputs = self._score_ids([inputs[i].ids for i in group])
            logger.debug(
                "scored %d prompt(s) of up to %d tokens in %.1f ms",
                len(group),
                max(len(inputs[i].ids) for i in group),
                (time.perf_counter() - started) * 1000,
            )
            for i, (values, used, continuation) in zip(group, outputs, strict=True):
                results[i] = self._finish(prompts[i], inputs[i], values, used, continuation)
        return [r for r in results if r is not None]

    def _finish(
        self, prompt: Prompt, draft: DraftTokens, values: torch.Tensor, used: int, continuation: tuple[int, ...]
    ) -> TokenScores:
        if draft.offsets is not None:
            values = project_scores(values, draft.offsets, prompt.offsets)
        info = {
            "draft": self.model_name,
            "n": prompt.n,
            "look_ahead": used,
            "look_ahead_requested": self.look_ahead,
            "look_ahead_token_ids": continuation,
            "pool_kernel": self.pool_kernel,
            "layers": self.layers,
            "aggregation": self.aggregation,
            "queries": self.queries,
            "draft_tokens": len(draft.ids),
            "projected": draft.projected,
        }
        return TokenScores(values=values, scorer=self.name, info=info)

    def _groups(self, lengths: list[int]) -> list[list[int]]:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        groups: list[list[int]] = []
        for i in order:
            if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= self.execution.max_batch_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def _padded(
        self, batch: list[tuple[int, ...]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Left-padded ids, lengths, padding, and (for a batch) the 2-D mask and positions."""
        device = self.loaded.device
        lengths = torch.tensor([len(ids) for ids in batch], dtype=torch.long, device=device)
        size, width = len(batch), int(lengths.max())
        pad = width - lengths
        if size == 1:
            input_ids = int64_tensor(batch[0]).to(device)[None]
        else:
            input_ids = torch.zeros(size, width, dtype=torch.long, device=device)
            for b, ids in enumerate(batch):
                input_ids[b, width - len(ids) :] = int64_tensor(ids).to(device)
        # One prompt needs no mask (the plain causal path); a batch is left-padded with explicit
        # positions so that every row sees exactly what it would see alone.
        attention_mask: torch.Tensor | None = None
        position_ids: torch.Tensor | None = None
        if size > 1:
            columns = torch.arange(width, device=device)
            attention_mask = (columns[None, :] >= pad[:, None]).long()
            position_ids = (columns[None, :] - pad[:, None]).clamp_min(0)
        return input_ids, lengths, pad, attention_mask, position_ids

    def _collector(self, pad: torch.Tensor, width: int, queries: int, padded: bool | None = None) -> ScoreCollector:
        return ScoreCollector(
            pad=pad,
            prompt_len=width,
            num_queries=queries,
            pool_kernel=self.pool_kernel,
            skip=self._skip,
            device=self.loaded.device,
            padded=padded,
            aggregation=self.aggregation,
            last_layer=self.last_layer,
            queries=self.queries,
        )

    def _score_ids(self, batch: list[tuple[int, ...]]) -> list[tuple[torch.Tensor, int, tuple[int, ...]]]:
        """Prefill + greedy look-ahead on a left-padded batch, collecting attention on the fly.

        Every pass runs under the scorer's attention kernels, the look-ahead steps too: a compiled step
        keeps the kernel chosen when it was traced, so a step traced under another library's process-wide
        settings (vLLM's import turns cuDNN off) would keep theirs.
        """
        with sdpa_context(self.execution.attention_backends, self.loaded.device):
            if self._fixed_buffers:
                steps = min(self.look_ahead - 1, self.loaded.max_context - min(len(ids) for ids in batch))
                return self._score_ids_fixed_buffers(batch, steps)
            return self._score_ids_stepwise(batch)

    def _score_ids_stepwise(self, batch: list[tuple[int, ...]]) -> list[tuple[torch.Tensor, int, tuple[int, ...]]]:
        """`_score_ids` for the other drafts (windowed layers): the prompt's pass, then steps over a growing cache."""
        limit = self.loaded.max_context
        model, device = self.loaded.model, self.loaded.device
        input_ids, lengths, pad, attention_mask, position_ids = self._padded(batch)
        size, width = input_ids.shape
        collector = self._collector(pad, width, self.look_ahead)
        used = torch.ones(size, dtype=torch.long, device=device)
        generated: list[torch.Tensor] = []
        from transformers import DynamicCache

        cache = {self._cache_arg: DynamicCache(config=model.config)}
        if self.layers is not None:
            collector.stop_after = self.layers - 1
        with torch.inference_mode(), collector.active():
            collector.begin_step(0)
            try:
                out = model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=True,
                    logits_to_keep=1,
                    **cache,
                )
            except DraftStopped:
                out = None
            token = out.logits[:, -1].argmax(-1) if out is not None else lengths.new_zeros(size)
            done = torch.isin(token, self._eos)
            for step in range(1, self.look_ahead):
                done |= lengths - 1 + step >= limit  # no position beyond the draft's context
                if bool(done.all()):
                    break
                used += (~done).long()
                generated.append(torch.where(done, -1, token))
                collector.begin_step(step)
                if attention_mask is not None:
                    attention_mask = torch.cat([attention_mask, attention_mask.new_ones(size, 1)], dim=1)
                out = model(
                    input_ids=token[:, None],
                    attention_mask=attention_mask,
                    position_ids=(lengths - 1 + step)[:, None],
                    use_cache=True,
                    logits_to_keep=1,
                    **cache,
                )
                token = out.logits[:, -1].argmax(-1)
                done |= torch.isin(token, self._eos)
        if not collector.layers_seen:
            raise SpecPrefillError(
                f"{type(model).__name__} did not route its attention through transformers' AttentionInterface; "
                "it cannot be used as a draft"
            )
        tokens = torch.stack(generated, dim=1).tolist() if generated else [[] for _ in range(size)]
        results = []
        for b in range(size):
            n_used = int(used[b])
            values = collector.token_scores(b, n_used)
            results.append((values.cpu(), n_used, tuple(int(t) for t in tokens[b][: n_used - 1])))
        return results

    def _runner_for(self, size: int, width: int, steps: int) -> FixedBufferLookAhead:
        """Buffers for this batch: the kept ones when they fit (CUDA graphs only), else fresh ones."""
        keep = self.execution.cuda_graph and self.loaded.device.type == "cuda" and steps > 0
        runner = self._runner
        if keep and runner is not None and runner.fits(size, width, steps):
            return runner
        if keep:
            self._runner = None  # free the old buffers before allocating new ones
        capacity = FixedBufferLookAhead.capacity_for(width, steps) if keep else width + steps
        runner = FixedBufferLookAhead(
            self.loaded.model,
            size,
            capacity,
            steps,
            cuda_graph=keep,
            fused_norms=self.execution.fused_norms,
            layers=self.layers,
            lean=self._lean,
        )
        if keep:
            self._runner = runner
        return runner

    def _score_ids_fixed_buffers(
        self, batch: list[tuple[int, ...]], steps: int
    ) -> list[tuple[torch.Tensor, int, tuple[int, ...]]]:
        """`_score_ids` for global-attention drafts: fixed buffers, every query of every layer scored at once."""
        model = self.loaded.model
        input_ids, lengths, pad, attention_mask, position_ids = self._padded(batch)
        size, width = input_ids.shape
        collector = self._collector(pad, width, 1 + steps, padded=len({len(ids) for ids in batch}) > 1)
        # the caller, `score_batch`, holds `lock`: the buffers are this draft's alone meanwhile
        runner = self._runner_for(size, width, steps)
        first = runner.prefill(input_ids, attention_mask, position_ids)
        if not runner.written:
            raise SpecPrefillError(
                f"{type(model).__name__} did not route its attention through transformers' "
                "AttentionInterface; it cannot be used as a draft"
            )
        if len(runner.written) != len(runner.keys):
            raise SpecPrefillError(
                f"{type(model).__name__} ran attention in {len(runner.written)} of {len(runner.keys)} layers; "
                "it cannot be used as a draft"
            )
        with torch.inference_mode():
            tokens = runner.run(first, lengths, pad, width) if steps > 0 and first is not None else None
            collector.observe_stacked(runner.query_stack, runner.key_stack, runner.scalings())
        if first is None:  # stopped after `layers` layers: no look-ahead (steps is 0)
            listed: list[list[int]] = [[] for _ in range(size)]
        elif tokens is None:
            listed = first[:, None].tolist()
        else:
            listed = torch.cat([first[:, None], tokens[:, : steps - 1]], dim=1).tolist()  # t_1 .. t_steps
        eos = set(self.loaded.eos_token_ids)
        limit = self.loaded.max_context
        results = []
        for b in range(size):
            allowed = min(steps, limit - int(lengths[b]))
            n_used = 1
            while n_used <= allowed and listed[b][n_used - 1] not in eos:
                n_used += 1
            values = collector.token_scores(b, n_used)
            results.append((values.cpu(), n_used, tuple(listed[b][: n_used - 1])))
        return results
