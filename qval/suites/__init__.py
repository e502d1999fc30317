"""Gate 4's items: what each suite asks, built deterministically, and how an answer is marked.

An `Item` is one question in one of three forms: `word` (the model must produce a given word
greedily; marked from teacher-forced logits), `choice` (the continuation with the highest summed
log-probability is the model's pick, lm-eval's convention) and `generate` (a greedy answer,
marked by a matcher). Suites register by name in `SUITES`; the golden reader is one of them.
The definitions live in `qval.suites.base` and are re-exported here; suite modules import them from there.
"""

from __future__ import annotations

from . import builtin, golden  # noqa: F401  (register their suites in SUITES)
from .base import OPEN_CHANCE, SUITES, Item, SuiteBuilder, excerpt  # noqa: F401
