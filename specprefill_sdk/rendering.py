"""Kept tokens rendered back to the text they came from: for endpoints that only accept text.

A selection keeps token positions; a text-only endpoint needs characters. Each token stands for the
characters from its own start to the next token's start (`token_covers`), so the kept tokens' ranges
join into the kept text (`render_kept`) with a gap where something was dropped. Text mode of
`specprefill_sdk.backends.OpenAIBackend` (`render_kept_text`, `render_kept_messages`) and
`specprefill_sdk.textmode` (per message, per document) both render through here.

Example::

    text, spans = render_tokens(prompt, range(prompt.n), selection.mask().tolist())
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from .errors import InvalidRequestError
from .types import TEMPLATE_ROLE, CompressedPrompt, Prompt

__all__ = [
    "DEFAULT_SEPARATOR",
    "content_tokens",
    "render_kept",
    "render_kept_messages",
    "render_kept_text",
    "render_tokens",
    "token_covers",
]

#: Placed between non-contiguous kept spans in the text the HTTP backend sends.
DEFAULT_SEPARATOR = " ... "


def token_covers(prompt: Prompt, indices: Sequence[int], start: int, end: int) -> list[tuple[int, int]]:
    """The character range each token stands for inside ``[start, end)``: together they tile it.

    A token covers from its own start to the next token's start, so the whitespace between tokens
    goes with the token before it, and the first token also takes any leading characters.
    """
    starts = [min(max(prompt.offsets[t][0], start), end) for t in indices]
    if starts:
        starts[0] = start
    return [(a, max(a, starts[j + 1] if j + 1 < len(starts) else end)) for j, a in enumerate(starts)]


def render_kept(
    text: str, covers: Sequence[tuple[int, int]], kept: Sequence[bool], gap: str = " "
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Join the character ranges of kept tokens, with ``gap`` where something was dropped.

    A whitespace-only ``gap`` is added only where neither side already has whitespace (words do not
    run together); any other ``gap`` (e.g. ``" … "``) marks every cut and replaces the whitespace
    around it.

    Returns:
        the rendered text and the kept character spans (merged runs), relative to ``text``.
    """
    runs: list[tuple[int, int]] = []
    for (a, b), keep in zip(covers, kept, strict=True):
        if not keep or b <= a:
            continue
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    marker = bool(gap.strip())
    pieces: list[str] = []
    for a, b in runs:  # consecutive runs always have dropped text between them
        piece = text[a:b]
        if pieces and marker:
            pieces[-1] = pieces[-1].rstrip()
            piece = piece.lstrip()
            pieces.append(gap)
        elif pieces and gap and not (pieces[-1][-1:].isspace() or piece[:1].isspace()):
            pieces.append(gap)
        pieces.append(piece)
    return "".join(pieces), tuple(runs)


def render_tokens(
    prompt: Prompt,
    indices: Sequence[int],
    kept: Sequence[bool],
    gap: str = " ",
    *,
    region: tuple[int, int] | None = None,
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The text of the tokens ``indices`` of ``prompt`` with only the ``kept`` ones (one flag per index).

    ``region`` is the character range the tokens tile (default: from the first token's start to the
    last token's end). Returns the text and the kept character spans in ``prompt.text``.
    """
    if region is None:
        region = (prompt.offsets[indices[0]][0], max(prompt.offsets[t][1] for t in indices))
    start, end = region
    return render_kept(prompt.text, token_covers(prompt, indices, start, end), kept, gap)


def content_tokens(prompt: Prompt, message: int) -> list[int]:
    """The token indices of message ``message``'s content (chat-template glue left out)."""
    return [t for t in range(prompt.n) if prompt.message_index[t] == message and prompt.roles[t] != TEMPLATE_ROLE]


def _render(prompt: Prompt, indices: Sequence[int], kept: Container[int], separator: str) -> str:
    return render_tokens(prompt, indices, [t in kept for t in indices], separator)[0]


def render_kept_text(compressed: CompressedPrompt, tokenizer: Any, separator: str = DEFAULT_SEPARATOR) -> str:
    """The kept tokens of a compressed prompt as text, with ``separator`` where tokens were dropped.

    Special tokens of a text prompt are left out (the remote adds its own). A compressed prompt
    without its `Prompt` (bare ids) is decoded run by run.
    """
    prompt = compressed.prompt
    if prompt is None or not any(b > a for a, b in prompt.offsets):
        ids = dict(zip(compressed.position_ids, compressed.token_ids, strict=True))
        runs: list[list[int]] = []
        for p in compressed.position_ids:
            if runs and p == runs[-1][-1] + 1:
                runs[-1].append(p)
            else:
                runs.append([p])
        return separator.join(str(tokenizer.decode([ids[p] for p in run], skip_special_tokens=False)) for run in runs)
    indices = (
        [t for t in range(prompt.n) if not prompt.special[t]] if prompt.messages is None else list(range(prompt.n))
    )
    if not indices:
        raise InvalidRequestError("the prompt has no text to render", param="prompt")
    return _render(prompt, indices, set(compressed.position_ids), separator)


def render_kept_messages(
    compressed: CompressedPrompt, tokenizer: Any, separator: str = DEFAULT_SEPARATOR
) -> list[dict[str, str]]:
    """Each chat message with the characters of its kept content tokens, for a remote chat template.

    Template tokens are dropped (the remote renders its own template); a message kept whole is sent
    unchanged, one with nothing kept is sent empty, so the turn order stays.

    Raises:
        InvalidRequestError: the compressed prompt carries no chat messages.
    """
    prompt = compressed.prompt
    if prompt is None or prompt.messages is None:
        raise InvalidRequestError("this compressed prompt has no chat messages to render")
    kept = set(compressed.position_ids)
    out: list[dict[str, str]] = []
    for index, message in enumerate(prompt.messages):
        content = content_tokens(prompt, index)
        if not content or all(t in kept for t in content):
            out.append(message.to_dict())
        else:
            out.append({"role": message.role, "content": _render(prompt, content, kept, separator)})
    return out
