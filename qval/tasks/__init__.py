"""Gate 4's items: what each suite asks, built deterministically, and how an answer is marked.

An `Item` is one question in one of three forms: `word` (the model must produce a given word
greedily; marked from teacher-forced logits), `choice` (the continuation with the highest summed
log-probability is the model's pick, lm-eval's convention) and `generate` (a greedy answer,
marked by a matcher). Suites register by name in `SUITES`; the golden reader is one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ..registry import Registry


@dataclass
class Item:
    id: str
    kind: Literal["word", "choice", "generate"]
    prompt: list[int]  # token ids the model reads
    excerpt: str  # the end of the prompt's text, for the report
    target: list[int] = field(default_factory=list)  # word: the word's tokens
    word: str = ""  # word: its text
    choices: list[list[int]] = field(default_factory=list)  # choice: each continuation's tokens
    choice_texts: list[str] = field(default_factory=list)
    label: int = 0  # choice: the right continuation
    answer: str = ""  # generate: the expected answer
    match: str = "exact"  # generate: a MATCHERS name
    tolerance: float = 0.0  # generate, match numeric: absolute tolerance

    @property
    def expected(self) -> str:
        return {"word": self.word, "choice": self.choice_texts[self.label] if self.choice_texts else "", "generate": self.answer}[self.kind]


#: name -> builder(suite config, tokenizer, resolve(path) -> Path, seed) -> items
SuiteBuilder = Callable[[Any, Any, Callable[[str], Any], int], list[Item]]
SUITES: Registry[SuiteBuilder] = Registry("task suite")


def excerpt(text: str, chars: int = 160) -> str:
    """The last `chars` characters of a prompt, on one line, with '…' when cut.

    >>> excerpt("a\\nb c", 10), excerpt("abcdef", 3)
    ('a b c', '…def')
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else "…" + flat[-chars:]


from . import builtin  # noqa: E402,F401
from . import golden  # noqa: E402,F401
