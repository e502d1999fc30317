"""Built-in suites, generated deterministically (seeded) from the shipped held-out prose.

- cloze: LAMBADA's construction. A passage ends just before a word the context predicts (a
  content word of four letters or more that already appeared earlier in the passage); the model
  must produce that word greedily and then end it.
- choice: which sentence continues this passage: the true next sentence against three sentences
  of similar length from other documents, picked by summed log-probability (lm-eval's `acc`).
- recall: key–value recall in a short context (six named codes, one asked for), answered
  greedily and marked by the first number of the answer.
All three read raw text (no chat template): they test the language model, not the chat format.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from ..data import load_dataset
from ..errors import DataError
from .base import SUITES, Item, excerpt

WORD = re.compile(r"[A-Za-z]+")
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“])")
STOP = frozenset("""about above after again against also because been before being below between both could does doing
down during each from further have having here into itself just more most other once only over same should some such
than that their them then there these they this those through under until very were what when where which while will
with would your yours""".split())
CONTEXT_WORDS = 60  # words of passage before a cloze target (≈ 80 tokens)
CHOICES = 4
CONTEXT_SENTENCES = 2  # sentences of passage before the choices
PAIRS = 6  # name–code pairs a recall item lists
SHADES = ("red", "blue", "green", "black", "white", "brown", "grey", "pink")
BIRDS = ("owl", "hawk", "swan", "duck", "crow", "dove", "lark", "kite")


def _ids(tokenizer: Any, text: str, special: bool = True) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def english_prose(spec: str, resolve: Callable[[str], Any]) -> list[tuple[str, str]]:
    """(id, text) of the English prose and dialogue records of a held-out file."""
    ds = load_dataset(spec, resolve(spec))
    docs = [(str(r.get("id", i)), r["text"]) for i, r in enumerate(ds.records)
            if r.get("lang", "en") == "en" and r.get("category", "prose") in ("prose", "dialogue") and isinstance(r.get("text"), str)]
    if not docs:
        raise DataError(f"{spec}: no English prose records (lang: en, category prose or dialogue) to build the suite from.")
    return docs


def split_continuation(tokenizer: Any, context: str, continuation: str, special: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of the context and of the continuation as they fall in the whole text (lm-eval
    encodes the whole and splits at the context's length); when the tokenizer merges across the
    boundary, the two are encoded apart. `special`: add the tokenizer's special tokens (raw text;
    a chat-rendered text has them already)."""
    ctx, whole = _ids(tokenizer, context, special), _ids(tokenizer, context + continuation, special)
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return ctx, whole[len(ctx) :]
    return ctx, list(tokenizer(continuation, add_special_tokens=False)["input_ids"])


def cloze_candidates(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of words LAMBADA-style targets could be: alphabetic, at least
    four letters, not a function word, and seen in the CONTEXT_WORDS words before it (the context
    the prompt keeps), so the context predicts it.

    >>> t = "Otter " + "the " * 60 + "otter swam. The otter"
    >>> [t[a:b] for a, b in cloze_candidates(t)]
    ['otter']
    """
    words = list(WORD.finditer(text))
    lower = [m.group().lower() for m in words]
    out = []
    for i, w in enumerate(lower):
        if i >= CONTEXT_WORDS and len(w) >= 4 and w not in STOP and w in lower[i - CONTEXT_WORDS : i]:
            out.append((words[i].start(), words[i].end()))
    return out


def _spread(rng: random.Random, per_doc: list[list[Any]], size: int) -> list[Any]:
    """Up to `size` entries drawn round-robin over documents (each document's own order shuffled)."""
    pools = [rng.sample(p, len(p)) for p in per_doc if p]
    rng.shuffle(pools)
    out: list[Any] = []
    while len(out) < size and any(pools):
        for p in pools:
            if p and len(out) < size:
                out.append(p.pop())
    return out


@SUITES.register("cloze")
def cloze(suite: Any, tokenizer: Any, resolve: Callable[[str], Any], seed: int) -> list[Item]:
    rng = random.Random(f"qval-tasks-cloze-{seed}")
    docs = english_prose(suite.dataset, resolve)
    per_doc = [[(doc_id, text, span) for span in cloze_candidates(text)] for doc_id, text in docs]
    items = []
    for doc_id, text, (a, b) in _spread(rng, per_doc, suite.size):
        before = list(WORD.finditer(text[:a]))
        start = before[-CONTEXT_WORDS].start()
        context, word = text[start:a].rstrip(), text[a:b]
        prompt, target = split_continuation(tokenizer, context, " " + word)
        items.append(Item(id=f"{doc_id}@{a}", kind="word", prompt=prompt, excerpt=excerpt(context), target=target, word=word))
    return items


def sentences(text: str) -> list[str]:
    """Sentences of prose (split after . ! ? before a capital or a quote), paragraphs flattened.

    >>> sentences("One day. Two days!\\n\\nThree? four.")
    ['One day.', 'Two days!', 'Three? four.']
    """
    return [s.strip() for s in SENTENCE.split(" ".join(text.split())) if s.strip()]


@SUITES.register("choice")
def choice(suite: Any, tokenizer: Any, resolve: Callable[[str], Any], seed: int) -> list[Item]:
    rng = random.Random(f"qval-tasks-choice-{seed}")
    docs = [(doc_id, sentences(text)) for doc_id, text in english_prose(suite.dataset, resolve)]
    pool = [(doc_id, s) for doc_id, ss in docs for s in ss if 6 <= len(s.split()) <= 40]
    per_doc = [[(doc_id, ss, j) for j in range(CONTEXT_SENTENCES, len(ss)) if 6 <= len(ss[j].split()) <= 40] for doc_id, ss in docs]
    items = []
    for doc_id, ss, j in _spread(rng, per_doc, suite.size):
        true = ss[j]
        n = len(true.split())
        near = [s for d, s in pool if d != doc_id and 0.75 <= len(s.split()) / n <= 1.33] or [s for d, s in pool if d != doc_id]
        options = rng.sample(near, CHOICES - 1) + [true]
        rng.shuffle(options)
        context = " ".join(ss[j - CONTEXT_SENTENCES : j])
        prompt, conts = [], []
        for o in options:
            prompt, cont = split_continuation(tokenizer, context, " " + o)
            conts.append(cont)
        items.append(Item(id=f"{doc_id}#{j}", kind="choice", prompt=prompt, excerpt=excerpt(context), choices=conts,
                          choice_texts=options, label=options.index(true)))
    return items


@SUITES.register("recall")
def recall(suite: Any, tokenizer: Any, resolve: Callable[[str], Any], seed: int) -> list[Item]:
    """Key–value recall in a short context: six named three-digit codes, then one name's code is
    asked for; the answer is generated greedily and marked by its first number."""
    rng = random.Random(f"qval-tasks-recall-{seed}")
    names = [f"{c} {a}" for c in SHADES for a in BIRDS]
    items = []
    for i in range(suite.size):
        keys = rng.sample(names, PAIRS)
        codes = rng.sample(range(100, 1000), PAIRS)
        asked = rng.randrange(PAIRS)
        table = "".join(f"The {k} code is {v}.\n" for k, v in zip(keys, codes))
        text = f"{table}\nQuestion: what is the {keys[asked]} code?\nAnswer: The {keys[asked]} code is"
        items.append(Item(id=f"r{i}", kind="generate", prompt=_ids(tokenizer, text), excerpt=excerpt(text, 120),
                          answer=str(codes[asked]), match="numeric"))
    return items
