"""Marking answers: matchers for generated text, the greedy-word mark, the log-likelihood pick.

Pure functions of text and tensors, so each is checked by hand in tests/gates/test_tasks.py.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Callable, Sequence

import torch

from ..registry import Registry

Matcher = Callable[[str, str, float], bool]  # (response, answer, tolerance) -> right
MATCHERS: Registry[Matcher] = Registry("match")
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def normalise(text: str) -> str:
    """Case-folded, NFKC, whitespace collapsed, surrounding punctuation and quotes stripped.

    >>> normalise("  The  Answer: PARIS. "), normalise("“Ok!”")
    ('the answer: paris', 'ok')
    """
    t = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return t.strip(" .,;:!?\"'“”‘’`()[]")


def first_line(text: str) -> str:
    """The first non-empty line: a model that answers and then goes on is judged on its answer."""
    return next((ln for ln in text.splitlines() if ln.strip()), "")


@MATCHERS.register("exact")
def exact(response: str, answer: str, tolerance: float = 0.0) -> bool:
    """The first line of the response, normalised, equals the answer, normalised.

    >>> exact(" Paris.\\nIt is the capital.", "paris"), exact("Paris, France", "Paris")
    (True, False)
    """
    return normalise(first_line(response)) == normalise(answer)


@MATCHERS.register("contains")
def contains(response: str, answer: str, tolerance: float = 0.0) -> bool:
    """The normalised answer appears in the normalised response, on word boundaries.

    >>> contains("I think it is Paris, France.", "paris"), contains("Parisian", "paris")
    (True, False)
    """
    a = normalise(answer)
    return bool(a) and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", normalise(response)) is not None


@MATCHERS.register("regex")
def regex(response: str, answer: str, tolerance: float = 0.0) -> bool:
    """The answer is a regular expression searched for in the response (as written, not normalised).

    >>> regex("The year was 1969.", r"\\b19[6-7]\\d\\b"), regex("in 1980", r"\\b19[6-7]\\d\\b")
    (True, False)
    """
    return re.search(answer, response) is not None


def first_number(text: str) -> float | None:
    """The first number written in `text` (thousands commas allowed), or None.

    >>> first_number("It is 1,234.5 metres"), first_number("minus -3"), first_number("none")
    (1234.5, -3.0, None)
    """
    for m in NUMBER.finditer(text):
        try:
            return float(m.group().replace(",", "").rstrip("."))
        except ValueError:
            continue
    return None


@MATCHERS.register("numeric")
def numeric(response: str, answer: str, tolerance: float = 0.0) -> bool:
    """The first number in the response is within `tolerance` (absolute) of the answer's number.

    >>> numeric("= 42", "42"), numeric("3.14159", "3.14", 0.01), numeric("3.2", "3.14", 0.01), numeric("no", "1")
    (True, True, False, False)
    """
    got, want = first_number(response), first_number(answer)
    return got is not None and want is not None and math.isfinite(got) and abs(got - want) <= tolerance + 1e-12 * abs(want)


def continues_word(piece: str) -> bool:
    """Whether a token's text glues onto the word before it (no leading space, a letter or digit).

    >>> continues_word("ing"), continues_word(" the"), continues_word("."), continues_word("'s")
    (True, False, False, False)
    """
    return piece[:1].isalnum()


def word_mark(logits: torch.Tensor, target: Sequence[int], decode: Callable[[int], str]) -> tuple[bool, list[int]]:
    """Greedy exact match of a word from teacher-forced logits ([len(target) + 1, V]: row j
    predicts target token j, the last row the token after the word): right when every token of
    the word is the argmax and the token after it does not continue the word. Returns (right,
    the argmax tokens up to and including the first wrong one)."""
    top = logits.argmax(dim=-1).tolist()
    for j, t in enumerate(target):
        if top[j] != t:
            return False, top[: j + 1]
    if continues_word(decode(top[len(target)])):
        return False, top[: len(target) + 1]
    return True, list(target)


def continuation_logprob(logits: torch.Tensor, target: Sequence[int]) -> float:
    """Sum of log p(target_j) over a continuation ([len(target), V] logits, row j predicts target j):
    lm-eval's log-likelihood of a choice (its `acc`, unnormalised by length)."""
    if not isinstance(logits, torch.Tensor):  # a compact reference (the snapshot): its stored log-probabilities
        from ..metrics.compact import nll

        return float((-nll(logits, torch.tensor(list(target)))).to(torch.float32).sum())
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(logp[torch.arange(len(target)), torch.tensor(list(target))].sum())


def pick(scores: Sequence[float]) -> int:
    """The index of the highest score; the first on a tie (a NaN never wins).

    >>> pick([-3.0, -1.5, -1.5]), pick([float("nan"), -9.0])
    (1, 1)
    """
    best, at = -math.inf, 0
    for i, s in enumerate(scores):
        if s > best:
            best, at = s, i
    return at
