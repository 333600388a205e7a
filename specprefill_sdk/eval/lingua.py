"""The real ``llmlingua`` package (LLMLingua-1) as a comparison method, on the same draft model folder.

``llmlingua`` 0.2.2 cannot run offline with transformers 5 as it ships; two shims make it run, and
nothing else of it is changed:

1. ``PromptCompressor.__init__`` calls ``tiktoken.encoding_for_model("gpt-3.5-turbo")``, which
   downloads the ``cl100k_base`` table (no network: ``ConnectionError``). It only counts tokens for
   its budget, so while the compressor is built that call returns the draft's own tokenizer: budgets
   are then counted in draft tokens, like every other method's keep rate.
2. Its iterative token filter unpacks ``past_key_values`` as a list of ``(key, value)`` tuples and
   slices them; transformers 5 returns a ``DynamicCache`` (``ValueError: too many values to
   unpack``). The model is wrapped so that it takes and returns the legacy tuples.

LLMLingua's own filter (``iterative_compress_prompt``, what ``compress_prompt`` runs for one context)
returns the kept token ids, a subsequence of its tokenization of the context; matching them in order
gives their characters, and the prompt tokens there are kept. They are prefilled at their original
positions like every other method's, so only the choice of tokens differs.

Example::

    lingua = LLMLinguaSelector(draft)            # a LoadedModel whose ``source`` is a model folder
    selection = lingua.select(prompt, context=(0, 5000), rate=0.1, forced=mask)
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ModelLoadError
from ..models import LoadedModel, cache_argument
from ..types import Prompt, Selection

__all__ = ["LLMLinguaSelector"]

logger = logging.getLogger(__name__)

_patch_lock = threading.Lock()


class _DraftTokenCounter:
    """Stands in for the tiktoken encoding LLMLingua counts tokens with."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, **_: Any) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return str(self.tokenizer.decode(list(ids)))


class _LegacyCacheModel:
    """Wraps a causal LM so that ``past_key_values`` goes in and out as ``[(key, value), ...]``."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._cache_kw = cache_argument(model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> Any:
        from transformers import DynamicCache

        cache = None
        if past_key_values is not None:
            cache = DynamicCache(ddp_cache_data=[(k, v) for k, v in past_key_values], config=self._model.config)
        kwargs[self._cache_kw] = cache
        out = self._model(input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        if use_cache and out.past_key_values is not None:
            out.past_key_values = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out


class LLMLinguaSelector:
    """LLMLingua-1 token filtering with the draft model, as a selection of prompt tokens.

    Raises:
        ModelLoadError: ``llmlingua`` is not installed, or the draft has no model folder to give it.
    """

    name = "llmlingua"

    def __init__(self, draft: LoadedModel) -> None:
        try:
            import llmlingua
            import tiktoken
        except ImportError as exc:
            raise ModelLoadError(
                "the llmlingua method needs the packages 'llmlingua' and 'tiktoken': pip install llmlingua==0.2.2"
            ) from exc
        self.draft = draft
        self.version = getattr(llmlingua, "__version__", "?")
        device = "cuda" if draft.device.type == "cuda" else "cpu"
        with _patch_lock:
            original = tiktoken.encoding_for_model
            tiktoken.encoding_for_model = lambda _name: _DraftTokenCounter(draft.tokenizer)  # type: ignore[assignment,return-value]
            try:
                self.compressor = llmlingua.PromptCompressor(
                    model_name=draft.source,
                    device_map=device,
                    model_config={"torch_dtype": draft.dtype, "local_files_only": True, "trust_remote_code": False},
                )
            except OSError as exc:
                raise ModelLoadError(f"llmlingua could not load the draft folder {draft.source}: {exc}") from exc
            finally:
                tiktoken.encoding_for_model = original
        self.compressor.model = _LegacyCacheModel(self.compressor.model)
        self.last_match = 1.0
        # The draft runs one call at a time: concurrent selections take turns.
        self._lock = threading.Lock()

    def _kept_characters(self, text: str, budget: int, spans: Sequence[tuple[int, int]], shift: int) -> list[bool]:
        """Run LLMLingua's token filter on ``text``; flag the ``spans`` (shifted by ``shift``) it keeps.

        The filter's kept token ids are a subsequence of its own tokenization of ``text``; matching ids
        in order recovers their character spans exactly (text matching cannot: a kept piece of a
        multi-byte character decodes to a replacement character, and short pieces match too early).
        """
        pc = self.compressor
        kept_ids, _ = pc.iterative_compress_prompt(
            [text],
            budget,
            iterative_size=200,
            keep_split=False,
            start=0,
            dynamic_ratio=[0.0],
            condition_compare=False,
            segments_info=[],
        )
        enc = pc.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        original = [int(t) for t in enc["input_ids"]]
        offsets = [(int(x), int(y)) for x, y in enc["offset_mapping"]]
        kept_chars: list[tuple[int, int]] = []
        cursor = 0
        matched = 0
        wanted = [int(t) for t in kept_ids[0].tolist()]
        for token in wanted:
            while cursor < len(original) and original[cursor] != token:
                cursor += 1
            if cursor == len(original):
                break
            kept_chars.append(offsets[cursor])
            matched += 1
            cursor += 1
        self.last_match = matched / len(wanted) if wanted else 1.0
        if self.last_match < 0.99:
            logger.warning("only %.0f%% of LLMLingua's kept tokens were found in order", 100 * self.last_match)
        flags = []
        j = 0
        for start, end in spans:
            start, end = start - shift, end - shift
            while j < len(kept_chars) and kept_chars[j][1] <= start:
                j += 1
            flags.append(j < len(kept_chars) and kept_chars[j][0] < end and start < kept_chars[j][1])
        return flags

    def select(self, prompt: Prompt, *, context: tuple[int, int], rate: float, forced: np.ndarray) -> Selection:
        """Keep ``forced`` plus what LLMLingua keeps of the ``context`` characters of ``prompt.text``.

        LLMLingua's token budget is what the keep rate leaves after the forced tokens.
        """
        n = prompt.n
        forced = np.array(forced, dtype=bool)
        budget = max(0, math.ceil(rate * n) - int(forced.sum()))
        a, b = context
        # Every token of the context takes part in the alignment (forced ones too: LLMLingua sees them as
        # text and may keep them); only the budget leaves room for the forced tokens.
        members = [i for i, (s, e) in enumerate(prompt.offsets) if e > s and s >= a and e <= b]
        keep = forced.copy()
        if budget > 0 and members:
            with self._lock:
                flags = self._kept_characters(prompt.text[a:b], budget, [prompt.offsets[i] for i in members], a)
            for i, flag in zip(members, flags, strict=True):
                if flag:
                    keep[i] = True
        where = np.flatnonzero(keep)
        indices, protected = where.tolist(), forced[where].tolist()
        return Selection(
            indices=tuple(indices),
            n=n,
            protected=tuple(protected),
            requested_rate=rate,
            reason=f"llmlingua {self.version} token filter, budget {budget}",
        )
