"""The retrieval matrix's trials, built deterministically from shipped prose (no hub, no model).

A trial is a haystack of `length` tokens (approximately: the prompt's whole token count) cut
from the long documents at an offset of its own, a needle sentence holding a random six-digit
pass code inserted at a fraction `depth` of the haystack (moved back to the nearest sentence end
so the text stays prose), and the question after the haystack. The assistant's answer opens with
"The pass code for the <name> locker is", so the next tokens a model emits are the code: both
models are scored on the same prompt followed by the true code, and a model is right when every
code token is its greedy choice and it then stops the number (exact match of greedy decoding).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ..errors import DataError

COLOURS = ("amber", "azure", "coral", "crimson", "golden", "indigo", "ivory", "jade", "lilac", "olive", "silver", "umber")
ANIMALS = ("badger", "crane", "falcon", "gecko", "heron", "lynx", "marten", "otter", "plover", "stoat", "tapir", "wren")
INSTRUCTION = ("Read the text below. Somewhere in it is a sentence giving a pass code. "
               "After the text comes a question about it.")
SENTENCE_ENDS = (".", "!", "?", "\n", "。", "！", "？")
SNAP = 48  # tokens the needle may move back to reach a sentence end


@dataclass
class Trial:
    length: int  # the cell's nominal context length
    depth: float  # the cell's needle depth, fraction of the haystack
    trial: int
    key: str
    name: str
    prompt: list[int]  # chat-rendered prompt, ending with the answer's opening words
    answer: list[int]  # the true answer's tokens: the code, then the token after it
    code_tokens: int  # how many of `answer` spell the code (the rest only show where it ends)
    needle_at: int  # token index in the haystack where the needle went
    offset: int  # where the haystack starts in the document stream
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.prompt)

    def describe(self) -> dict[str, Any]:
        return {"length": self.length, "depth": self.depth, "trial": self.trial, "key": self.key, "name": self.name,
                "prompt_tokens": len(self.prompt), "needle_at": self.needle_at, "offset": self.offset}


def snap_back(pieces: list[str], at: int, limit: int = SNAP) -> int:
    """The index just after the nearest sentence end at or before `at` (within `limit` tokens),
    else `at` itself: where a needle sentence can go without splitting a sentence.

    >>> snap_back(["A", " cat", ".", " The", " dog", " ran"], 5)
    3
    >>> snap_back(["a", "b", "c"], 2), snap_back(["a", "b"], 0)
    (2, 0)
    """
    for i in range(at, max(1, at - limit) - 1, -1):
        if pieces[i - 1].rstrip(" ").endswith(SENTENCE_ENDS):
            return i
    return at


def render(tokenizer: Any, body: str, question: str, opening: str) -> str:
    """The prompt text: a user turn of the chat template (when the tokenizer has one) with the
    assistant's answer opened, or plain text with an "Answer:" line."""
    user = f"{INSTRUCTION}\n\n{body}\n\n{question}"
    if getattr(tokenizer, "chat_template", None):
        head = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)
        return head + opening
    return f"{user}\nAnswer: {opening}"


def _ids(tokenizer: Any, text: str, raw: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=raw)["input_ids"])


def build_trials(tokenizer: Any, stream: list[int], lengths: list[int], depths: list[float], trials: int,
                 seed: int) -> list[Trial]:
    """Every (length, depth, trial) of the matrix, the same for the same inputs and seed.

    Keys are distinct six-digit codes and each trial names its own locker (colour + animal), so
    no trial's answer can be recalled from another's.
    """
    raw = not getattr(tokenizer, "chat_template", None)
    rng = random.Random(f"qval-retrieval-{seed}")
    cells = [(L, d, t) for L in lengths for d in depths for t in range(trials)]
    keys = rng.sample(range(100000, 1000000), len(cells))
    names = [f"{c} {a}" for c in COLOURS for a in ANIMALS]
    rng.shuffle(names)
    out = []
    for i, ((length, depth, t), key) in enumerate(zip(cells, keys)):
        name = names[i % len(names)]
        question = f"Question: What is the pass code for the {name} locker? Answer with the number only."
        opening = f"The pass code for the {name} locker is"
        needle = f"The pass code for the {name} locker is {key}."
        overhead = len(_ids(tokenizer, render(tokenizer, f" {needle} ", question, opening), raw))
        hay = length - overhead
        if hay < 16:
            raise DataError(f"gates.retrieval.lengths: {length} tokens leaves no room for a haystack (the question and "
                            f"needle take {overhead}); use lengths of at least {overhead + 64}.")
        if hay > len(stream):
            raise DataError(f"gates.retrieval.haystack: {len(stream)} tokens of text is less than a haystack of {hay} "
                            f"tokens (length {length}); give more text or shorter lengths.")
        offset = rng.randrange(0, len(stream) - hay + 1)
        seg = stream[offset : offset + hay]
        at = round(depth * hay)
        if 0 < depth < 1:  # only the tokens the needle may move back over are decoded
            lo = max(0, at - SNAP)
            at = lo + snap_back([tokenizer.decode([x]) for x in seg[lo:at]], at - lo)
        body = tokenizer.decode(seg[:at]).rstrip() + f" {needle} " + tokenizer.decode(seg[at:]).lstrip()
        prompt_text = render(tokenizer, body.strip(), question, opening)
        prompt = _ids(tokenizer, prompt_text, raw)
        full = _ids(tokenizer, prompt_text + f" {key}.", raw)
        if full[: len(prompt)] != prompt or len(full) <= len(prompt) + 1:
            raise DataError(f"the tokenizer does not keep the prompt's tokens when the answer follows it "
                            f"({tokenizer.__class__.__name__}); the retrieval gate cannot score an exact answer with it.")
        answer = full[len(prompt) :]
        out.append(Trial(length=length, depth=depth, trial=t, key=str(key), name=name, prompt=prompt, answer=answer,
                         code_tokens=len(answer) - 1, needle_at=at, offset=offset))
    return out


def starts_with_digit(tokenizer: Any, token: int) -> bool:
    """Whether a token continues a number (its text, spaces stripped, starts with a digit)."""
    return tokenizer.decode([token]).strip()[:1].isdigit()
