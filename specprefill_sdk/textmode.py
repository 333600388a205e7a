"""Text mode: shorten text for endpoints that only accept text, keeping the characters of the kept tokens.

A pipeline scores and selects tokens; in text mode the kept tokens are rendered back to the text
they came from instead of being prefilled at their positions. Two uses:

- `compress_messages`: a chat conversation; every message keeps the characters of its kept tokens
  (the pipeline's selector decides, so its protections, e.g. the last user turn, hold).
- `compress_documents`: documents compressed against a query, as retrieval-augmented prompts need.
  Each document is scored inside a chat prompt whose user message holds the document followed by
  the query, so the draft reads the document in the light of the question; the selector then runs
  over the document's tokens only, so a keep rate or token budget applies to the documents, and
  each document comes back on its own (boundaries never mix). With ``shared_budget=True`` all
  documents are scored in one prompt and share one budget: the draft spends it where the answer is.

Example::

    docs = compress_documents(pipeline, [doc_a, doc_b], "Who founded the company?")
    docs[0].text, docs[0].keep_ratio
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ContextTooLongError, InvalidRequestError
from .prompt import normalize_messages
from .rendering import content_tokens, render_kept, render_tokens
from .types import CompressedPrompt, Message, Prompt, TokenScores
from .validation import check_int

if TYPE_CHECKING:
    from .interfaces import Selector
    from .pipeline import Pipeline

__all__ = [
    "DEFAULT_WHOLE_BELOW",
    "CompressedMessages",
    "CompressedText",
    "compress_documents",
    "compress_messages",
    "render_kept",
]

logger = logging.getLogger(__name__)

#: Put between the documents (shared budget) and between the last document and the query.
DOCUMENT_SEPARATOR = "\n\n"
#: The framework components' ``whole_below_tokens``: under 128 tokens a selector's 32-token chunk is
#: a quarter of the text, too coarse to keep an answer reliably, and compressing saves little.
DEFAULT_WHOLE_BELOW = 128


@dataclass(frozen=True)
class CompressedText:
    """One text after compression: the kept characters, and how many of its tokens were kept.

    ``spans`` are the kept character ranges of ``original``; ``text`` joins them with the gap.
    """

    text: str
    original: str
    tokens: int
    kept_tokens: int
    spans: tuple[tuple[int, int], ...]
    fallback: str | None = None

    @property
    def keep_ratio(self) -> float:
        """kept_tokens / tokens (1.0 for a text without tokens)."""
        return self.kept_tokens / self.tokens if self.tokens else 1.0

    @property
    def dropped(self) -> bool:
        """True when some of the text was removed."""
        return self.kept_tokens < self.tokens

    @classmethod
    def unchanged(cls, text: str, tokens: int = 0, *, fallback: str | None = None) -> CompressedText:
        return cls(
            text=text,
            original=text,
            tokens=tokens,
            kept_tokens=tokens,
            spans=((0, len(text)),) if text else (),
            fallback=fallback,
        )


@dataclass(frozen=True)
class CompressedMessages:
    """A conversation after compression: the shortened messages and the token counts of the prompt."""

    messages: tuple[Message, ...]
    #: per input message: its `CompressedText`, or None when it had no content tokens
    parts: tuple[CompressedText | None, ...]
    prompt_tokens: int
    kept_tokens: int
    compressed: CompressedPrompt

    @property
    def keep_ratio(self) -> float:
        return self.kept_tokens / self.prompt_tokens if self.prompt_tokens else 1.0

    @property
    def content_tokens(self) -> int:
        """Tokens of message contents (template glue excluded)."""
        return sum(p.tokens for p in self.parts if p is not None)

    @property
    def kept_content_tokens(self) -> int:
        return sum(p.kept_tokens for p in self.parts if p is not None)

    def to_dicts(self) -> list[dict[str, str]]:
        return [m.to_dict() for m in self.messages]


# ----------------------------------------------------------------------------- messages
def compress_messages(
    pipeline: Pipeline,
    messages: Sequence[Message | Mapping[str, Any]],
    *,
    keep_whole: Sequence[int] = (),
    gap: str = " ",
) -> CompressedMessages:
    """Compress a conversation with ``pipeline`` and render each message's kept tokens back to text.

    Args:
        pipeline: scores and selects (its backend's tokenizer and chat template build the prompt).
        messages: `Message` objects or ``{"role", "content"}`` mappings.
        keep_whole: indices of messages that must stay whole (e.g. ones with non-text parts).
        gap: put where text was dropped (see `render_kept`).

    Raises:
        InvalidRequestError: empty or malformed messages.
        ContextTooLongError: the conversation does not fit the model's context.
    """
    msgs = normalize_messages(messages)
    for i in keep_whole:
        if not 0 <= i < len(msgs):
            raise InvalidRequestError(f"keep_whole index {i} is outside the {len(msgs)} messages")
    prompt = pipeline.prompt(list(msgs))
    if keep_whole:
        whole = set(keep_whole)
        prompt = prompt.with_protected([i in whole for i in prompt.message_index])
    compressed = pipeline.compress(prompt)
    selection = compressed.selection
    kept = selection.mask().tolist() if selection is not None else [True] * prompt.n
    out: list[Message] = []
    parts: list[CompressedText | None] = []
    for i, message in enumerate(msgs):
        idx = content_tokens(prompt, i)
        if not idx:
            out.append(message)
            parts.append(None)
            continue
        start, end = prompt.offsets[idx[0]][0], max(prompt.offsets[t][1] for t in idx)
        keep = [kept[t] for t in idx]
        if all(keep):
            out.append(message)
            parts.append(CompressedText.unchanged(message.content, len(idx)))
            continue
        text, runs = render_tokens(prompt, idx, keep, gap, region=(start, end))
        out.append(Message(role=message.role, content=text))
        parts.append(
            CompressedText(
                text=text,
                original=prompt.text[start:end],
                tokens=len(idx),
                kept_tokens=sum(keep),
                spans=tuple((a - start, b - start) for a, b in runs),
            )
        )
    return CompressedMessages(
        messages=tuple(out),
        parts=tuple(parts),
        prompt_tokens=prompt.n,
        kept_tokens=compressed.kept,
        compressed=compressed,
    )


# ----------------------------------------------------------------------------- documents
@dataclass(frozen=True)
class _Located:
    prompt: Prompt
    #: per document: (start, end) in prompt.text and its token indices in the prompt
    regions: list[tuple[int, int, list[int]]]


def _locate(pipeline: Pipeline, documents: Sequence[str], query: str) -> _Located:
    body = DOCUMENT_SEPARATOR.join(documents)
    content = body + (DOCUMENT_SEPARATOR + query if query.strip() else "")
    prompt = pipeline.prompt([Message("user", content)])
    user = [t for t in range(prompt.n) if prompt.message_index[t] == 0]
    cursor = prompt.offsets[user[0]][0] if user else 0
    regions: list[tuple[int, int, list[int]]] = []
    taken: set[int] = set()  # a token that straddles two documents belongs to the first
    for doc in documents:
        at = prompt.text.find(doc, cursor)
        if at < 0:  # a template that rewrites content (e.g. strips it): fall back to the stripped text
            at = prompt.text.find(doc.strip(), cursor)
            doc = doc.strip()
        if at < 0:
            raise InvalidRequestError("the chat template changed the document text; cannot locate it in the prompt")
        end = at + len(doc)
        idx = [
            t
            for t in range(prompt.n)
            if t not in taken and not prompt.special[t] and prompt.offsets[t][0] < end and prompt.offsets[t][1] > at
        ]
        taken.update(idx)
        regions.append((at, end, idx))
        cursor = end
    return _Located(prompt, regions)


def _render_document(
    prompt: Prompt, doc: str, region: tuple[int, int, list[int]], kept: Sequence[bool], gap: str, fallback: str | None
) -> CompressedText:
    start, end, idx = region
    if all(kept):
        return CompressedText.unchanged(doc, len(idx), fallback=fallback)
    text, runs = render_tokens(prompt, idx, kept, gap, region=(start, end))
    return CompressedText(
        text=text,
        original=doc,
        tokens=len(idx),
        kept_tokens=sum(kept),
        spans=tuple((a - start, b - start) for a, b in runs),
        fallback=fallback,
    )


def compress_documents(
    pipeline: Pipeline,
    documents: Sequence[str],
    query: str = "",
    *,
    shared_budget: bool = False,
    selector: Selector | None = None,
    whole_below_tokens: int = 0,
    gap: str = " ",
) -> list[CompressedText]:
    """Compress each document against ``query``; one `CompressedText` per document, in order.

    Args:
        pipeline: its scorer reads the prompts, its selector (or ``selector``) keeps tokens.
        documents: the texts; empty ones come back unchanged.
        query: the question the documents should answer; empty: compress without a question.
        shared_budget: score all documents in one prompt and select across them under one budget
            (the prompt must fit the model's context); otherwise each document on its own.
        selector: overrides the pipeline's selector (e.g. ``TokenBudget(300)`` for a fixed budget).
        whole_below_tokens: a document with fewer tokens than this is kept whole (with
            ``shared_budget``: all of them, when together they have fewer); 0: none is.
        gap: put where text was dropped (see `render_kept`).

    Raises:
        InvalidRequestError: ``documents`` is not a list of strings.
        ContextTooLongError: a prompt (a document, or all of them with ``shared_budget``) does not fit.

    Example::

        out = compress_documents(pipe, ["Paris is ...", "Berlin is ..."], "Where is the Louvre?",
                                 shared_budget=True)
        [d.keep_ratio for d in out]
    """
    if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
        raise InvalidRequestError("documents must be a list of strings", param="documents")
    if not isinstance(query, str):
        raise InvalidRequestError("the query must be a string", param="query")
    check_int(whole_below_tokens, "whole_below_tokens", param="whole_below_tokens", minimum=0)
    select_with = selector if selector is not None else pipeline.selector
    todo = [i for i, d in enumerate(documents) if d.strip()]
    results: list[CompressedText] = [CompressedText.unchanged(d) for d in documents]
    if not todo:
        return results
    limit = pipeline.backend.max_context
    groups = [todo] if shared_budget else [[i] for i in todo]
    located = [_locate(pipeline, [documents[i] for i in g], query) for g in groups]
    for loc in located:
        if loc.prompt.n >= limit:
            hint = " (compress the documents one by one instead of under a shared budget)" if shared_budget else ""
            raise ContextTooLongError(
                f"the prompt has {loc.prompt.n} tokens, over the model's context of {limit}{hint}", param="documents"
            )
    # What the selector sees of each prompt: its documents' tokens only, as plain text.
    regions = [[t for _, _, idx in loc.regions for t in idx] for loc in located]
    short = [k for k, tokens in enumerate(regions) if len(tokens) < whole_below_tokens]
    for k in short:
        for i, (_, _, idx) in zip(groups[k], located[k].regions, strict=True):
            results[i] = CompressedText.unchanged(documents[i], len(idx))
    if short:
        rest = [k for k in range(len(groups)) if k not in set(short)]
        groups, located, regions = [groups[k] for k in rest], [located[k] for k in rest], [regions[k] for k in rest]
        if not groups:
            return results
    subs = [loc.prompt.take(tokens, as_text=True) for loc, tokens in zip(located, regions, strict=True)]
    scorer = pipeline.scorer

    def score(need: list[int]) -> list[TokenScores]:
        # The draft reads each whole prompt (documents and query); the selector gets the documents' scores.
        scored = scorer.score_batch([located[k].prompt for k in need])
        return [TokenScores(s.values[regions[k]], scorer=scorer.name) for k, s in zip(need, scored, strict=True)]

    with pipeline.telemetry.span(
        "specprefill.pipeline", {"specprefill.operation": "compress", "specprefill.batch_size": len(subs)}
    ):
        comps = pipeline.compress_step(subs, selector=select_with, batch=True, score=score)
    for g, loc, comp in zip(groups, located, comps, strict=True):
        selection = comp.selection
        mask = selection.mask().tolist()
        offset = 0
        for i, region in zip(g, loc.regions, strict=True):
            m = len(region[2])
            kept = mask[offset : offset + m]
            offset += m
            results[i] = _render_document(loc.prompt, documents[i], region, kept, gap, comp.fallback)
        logger.debug("compressed %d document(s): %d of %d tokens kept", len(g), selection.kept, selection.n)
    return results
