"""Text mode (`specprefill_sdk.textmode`), the core of every adapter: exact span mapping with a known scorer."""

from __future__ import annotations

import pytest

from specprefill_sdk.errors import ContextTooLongError, InvalidRequestError
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.scoring import RecencyScorer
from specprefill_sdk.selection import Protect, TokenBudget
from specprefill_sdk.textmode import compress_documents, compress_messages, render_kept


def test_render_kept_joins_runs_with_the_gap() -> None:
    text = "one two three four five"
    covers = [(0, 3), (3, 7), (7, 13), (13, 18), (18, 23)]
    assert render_kept(text, covers, [1, 0, 1, 0, 1], " … ") == ("one … three … five", ((0, 3), (7, 13), (18, 23)))
    assert render_kept(text, covers, [1, 0, 1, 0, 1], " ")[0] == "one three five"
    assert render_kept(text, covers, [1] * 5, " … ") == (text, ((0, 23),))
    assert render_kept("ab cd", [(0, 1), (1, 2), (2, 5)], [1, 0, 1], " ")[0] == "a cd"  # no doubled space
    assert render_kept(text, covers, [0] * 5) == ("", ())


@pytest.fixture(scope="module")
def recency(paper_pipeline) -> Pipeline:
    """Keeps the last 12 tokens of whatever the selector sees: results are known exactly."""
    return Pipeline(RecencyScorer(), TokenBudget(12), paper_pipeline.backend)


@pytest.mark.slow
def test_each_document_keeps_its_own_last_tokens(recency, documents, tokenizer) -> None:
    out = compress_documents(recency, documents, "Where is the Louvre?")
    for doc, text in zip(out, documents, strict=True):
        assert doc.original == text and doc.kept_tokens == min(12, doc.tokens)
        assert doc.tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert text.endswith(doc.text) and len(doc.text) < len(text)  # the document's own tail
        assert doc.spans == ((len(text) - len(doc.text), len(text)),)


@pytest.mark.slow
def test_a_shared_budget_is_spent_across_documents(recency, documents) -> None:
    out = compress_documents(recency, documents, "Where is the Louvre?", shared_budget=True)
    assert [d.kept_tokens for d in out] == [0, 0, 12]  # the 12 most recent tokens are all in the last one
    assert out[0].text == out[1].text == "" and documents[2].endswith(out[2].text)


@pytest.mark.slow
def test_messages_keep_their_count_roles_and_whole_ones(paper_pipeline, essay) -> None:
    # Protect honours the mask of keep_whole; the rest of 32 tokens goes to the most recent ones.
    recent = Pipeline(RecencyScorer(), Protect(TokenBudget(32), sink=0, tail=False), paper_pipeline.backend)
    text = essay[:800]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": text},
        {"role": "user", "content": "Summarize it."},
    ]
    out = compress_messages(recent, messages, keep_whole=[0])
    assert [m.role for m in out.messages] == ["system", "user", "user"]
    assert out.messages[0].content == "Be brief."  # whole, although it is the oldest
    assert out.messages[2].content == "Summarize it."  # the most recent tokens
    assert text.endswith(out.messages[1].content) and len(out.messages[1].content) < 100
    assert out.parts[1] is not None and out.parts[1].dropped and out.parts[0] is not None
    assert out.kept_tokens == 32 < out.prompt_tokens


@pytest.mark.slow
def test_bad_input_is_refused_clearly(recency, essay) -> None:
    with pytest.raises(InvalidRequestError, match="list of strings"):
        compress_documents(recency, "one document", "q")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="keep_whole"):
        compress_messages(recency, [{"role": "user", "content": "hi"}], keep_whole=[3])
    long = [essay * 3] * 3  # about 13,000 tokens together: over the model's context
    with pytest.raises(ContextTooLongError, match="one by one"):
        compress_documents(recency, long, "q", shared_budget=True)
    assert compress_documents(recency, ["", "  "], "q")[1].text == "  "


@pytest.mark.slow
def test_documents_under_the_size_rule_stay_whole(recency, documents) -> None:
    query = "Where is the Louvre?"
    plain = compress_documents(recency, documents, query)
    assert plain[1].kept_tokens == 12 < plain[1].tokens < 40  # the short document, compressed
    out = compress_documents(recency, documents, query, whole_below_tokens=40)
    assert out[1].text == documents[1] and out[1].kept_tokens == out[1].tokens == plain[1].tokens
    assert [d.text for d in out[::2]] == [d.text for d in plain[::2]]  # the long ones as before
    # a shared budget: the rule reads the documents' tokens together
    together = sum(d.tokens for d in plain)
    whole = compress_documents(recency, documents, query, shared_budget=True, whole_below_tokens=together + 1)
    assert [d.text for d in whole] == documents
    assert sum(d.kept_tokens for d in compress_documents(recency, documents, query, shared_budget=True)) == 12
    with pytest.raises(InvalidRequestError, match="whole_below_tokens"):
        compress_documents(recency, documents, query, whole_below_tokens=-1)
