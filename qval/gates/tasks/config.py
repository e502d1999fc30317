"""Gate 4's config section (`gates.tasks`): its suites (`TaskSuite`, each gated on its own with the rows of
`TASKS`) and how items are run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ...config_base import Strict


class TaskSuite(Strict):
    """One suite of gate 4: built in (generated deterministically from shipped prose), the user's
    golden JSONL, or an lm-evaluation-harness task by name (lm-eval's prompts, few-shot selection,
    filters and metrics, run on both models). Each suite is gated on its own: non-inferiority of
    the drop (accuracy, or the task's per-document score)."""

    builtin: Literal["cloze", "choice", "recall"] | None = None  # a built-in suite, generated from seed and size
    golden: str | None = None  # JSONL of {"id","prompt","answer","match","tolerance"} or {"id","prompt","choices","label"}
    lm_eval: str | None = Field(None, min_length=1)  # an lm-eval task name (the installed lm-eval's, or one under include_path)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # default: the builtin's or task's name, or the file's stem
    size: int = Field(40, gt=0)  # items a built-in suite generates (a golden suite keeps all of its file)
    dataset: str = "calib_data/heldout_eval.jsonl"  # prose the cloze/choice items are cut from (English records)
    max_new_tokens: int = Field(8, gt=0)  # tokens of a generated answer (recall, golden exact-answer items)
    # --- lm_eval suites only
    include_path: str | None = None  # a folder of the user's task YAMLs (relative: to the config file, as data paths)
    num_fewshot: int | None = Field(None, ge=0)  # None: the task's own (0 if it sets none), as lm-eval does
    limit: int | None = Field(None, gt=0)  # the task's first N documents (None: all)
    #: the per-document metric that marks an item, "acc" or "acc,none" (lm-eval's "metric,filter");
    #: None: acc if the task reports it, else exact_match, else its first metric; its first filter
    metric: str | None = Field(None, min_length=1)
    max_length: int | None = Field(None, ge=8)  # tokens of context (None: the model's positions, as lm-eval's HFLM)
    #: the task's prompts as a user turn of the tokenizer's chat template (lm-eval's --apply_chat_template, few-shot
    #: examples as turns, its default); None/false: lm-eval's default, raw prompts
    chat_template: bool | None = None
    #: non-inferiority margin on the drop (reference − candidate: a fraction of items for a right/wrong
    #: suite, the metric's own unit otherwise): its one-sided (1 − α) upper bound must not exceed it
    margin: float = Field(gt=0)
    max_flip_rate: Annotated[float, Field(gt=0, le=1)] | None = None  # met by the exact upper bound of the flip rate
    alpha: float = Field(0.05, gt=0, lt=0.5)  # one-sided level of the drop's upper bound
    beta: float = Field(0.2, gt=0, lt=0.5)  # for the smallest detectable drop printed beside the check
    #: accuracy of guessing; None: 1/choices for multiple choice, 0.05 for open answers. A suite whose
    #: reference is not clearly above it (Wilson lower bound) is uninformative
    chance: Annotated[float, Field(ge=0, lt=1)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "TaskSuite":
        given = [k for k in ("builtin", "golden", "lm_eval") if getattr(self, k) is not None]
        if len(given) != 1:
            also = f"; this suite gives {' and '.join(given)}" if given else ""
            raise ValueError("give exactly one of builtin (cloze, choice, recall), golden (a JSONL file) or lm_eval "
                             f"(an lm-evaluation-harness task name){also}")
        only_lm = sorted(k for k in ("include_path", "num_fewshot", "limit", "metric", "max_length", "chat_template")
                         if getattr(self, k) is not None)
        if self.lm_eval is None and only_lm:
            raise ValueError(f"{', '.join(only_lm)} apply to lm_eval suites only")
        not_lm = sorted(k for k in ("size", "dataset", "max_new_tokens") if k in self.model_fields_set)
        if self.lm_eval is not None and not_lm:
            raise ValueError(f"{', '.join(not_lm)} do not apply to an lm_eval suite: the task's own documents and "
                             "generation settings are used (limit: N takes its first N documents)")
        if self.builtin is not None or self.golden is not None:
            if self.margin > 1:
                raise ValueError(f"margin {self.margin} is an accuracy drop, a fraction: it must be at most 1")
        return self

    @property
    def label(self) -> str:
        return self.name or self.builtin or self.lm_eval or Path(str(self.golden)).stem


class TasksGate(Strict):
    """Gate 4: both models answer the same items, each marked right or wrong; per suite, paired
    non-inferiority of the accuracy drop, McNemar's exact p, flips with exact intervals."""

    enabled: bool = True  # gate 4: answers, item by item
    suites: list[TaskSuite] = Field(default_factory=list)  # each gated on its own
    piece: int = Field(1024, gt=0)  # teacher-forced items go through the KV cache this many tokens at a time
    batch_size: int = Field(8, gt=0)  # generated answers

    @model_validator(mode="after")
    def _suites(self) -> "TasksGate":
        labels = [s.label for s in self.suites]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"suite names must be distinct; {', '.join(dup)} appears twice (set name: on one)")
        if self.enabled and not self.suites:
            raise ValueError("gate is enabled but has no suites, so it could never fail; add suites "
                             "(e.g. - {builtin: choice, margin: 0.1}) or enabled: false")
        return self
