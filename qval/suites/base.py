"""Gate 4's items: what an `Item` is, the `SUITES` registry, and the helpers every suite shares.

Suites register by name in `SUITES` (`builtin.py`: cloze, choice, recall; `golden.py`: golden);
the `qval.suites` package imports both, so `SUITES` is full whenever `qval.suites` is imported.
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


#: the default "chance" of an open answer: below it a reference cannot show a loss
OPEN_CHANCE = 0.05

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
