"""Gate 4's typed details: per suite, the paired marks' figures — right/wrong marks (`NonInferiority`, the
same figures as a retrieval length's) or a per-document score (`ScoreDrop`: a mean score's or a perplexity's
paired drop) — the items the two models mark differently, and, for an lm-eval suite, lm-eval's own figures
and how it ran the task."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Tag, model_validator

from ...results.base import Block, Details, Num
from ..retrieval.result import Counts, NonInferiority


class Item(Block):
    """One item as report.md lists it: a flipped item of a right/wrong suite (its marks) or one of a scored
    suite's largest drops (its scores, `item_drop`). The scorer decides which fields it has: a choice item
    both models' picks and log-probabilities, an lm-eval document its score or log-likelihood and weight."""

    suite: str
    id: str
    excerpt: str | None = None
    expected: str | None = None
    ref_right: bool | None = None
    cand_right: bool | None = None
    ref_answer: str | None = None
    cand_answer: str | None = None
    ref_pick: int | None = None
    cand_pick: int | None = None
    ref_logprobs: list[Num] | None = None
    cand_logprobs: list[Num] | None = None
    ref_score: Num | None = None
    cand_score: Num | None = None
    ref_ll: Num | None = None
    cand_ll: Num | None = None
    weight: Num | None = None
    item_drop: Num | None = None


class ScoreDrop(Block):
    """`metrics.paired.mean_noninferiority` (a mean score: `ref_mean` …) or `loglik_noninferiority` (a
    perplexity: `ref_ppl` …): the paired drop with its normal interval against the margin, the drop
    detectable with power 1 − β, and each model's figure in the suite's unit (`ref_value`, `cand_value`)."""

    drop: Num
    lo: Num
    hi: Num
    upper: Num
    stderr: Num
    margin: Num
    passed: bool
    detectable_drop: Num
    n: int
    ref_value: Num
    cand_value: Num
    unit: str
    # a mean score
    ref_mean: Num | None = None
    cand_mean: Num | None = None
    ref_stderr: Num | None = None
    cand_stderr: Num | None = None
    ref_interval: list[Num] | None = None
    cand_interval: list[Num] | None = None
    higher_is_better: bool | None = None
    # a perplexity
    ref_ppl: Num | None = None
    cand_ppl: Num | None = None
    ref_bpb: Num | None = None
    cand_bpb: Num | None = None
    weight: Num | None = None


class LmEval(Block):
    """How lm-eval ran an lm-eval suite's task (`suites.lmeval.pick_metric` and the task's settings), lm-eval's
    own figure for each model (`reference`, `candidate`) and qval's from the paired documents."""

    metric: str
    filter: str
    key: str
    aggregation: str | None = None
    family: str
    higher_is_better: bool
    task: str
    output_type: str
    lm_eval_version: str | None = None
    task_version: Num | str | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    include_path: str | None = None
    max_length: int
    reference: Num | None = None
    candidate: Num | None = None
    qval_reference: Num | None = None
    qval_candidate: Num | None = None


def _drop_shape(v: Any) -> str:
    """Which drop a suite's `drop` is, by its own keys: only a score drop has a standard error."""
    if isinstance(v, Block):
        return "score" if isinstance(v, ScoreDrop) else "marks"
    return "score" if isinstance(v, dict) and "stderr" in v else "marks"


#: a suite's drop: right/wrong marks' figures or a score's, told apart by their own keys so that a mismatch
#: is named inside the shape it belongs to (the suite's `kind` must agree: Suite's validator)
Drop = Annotated[Union[Annotated[NonInferiority, Tag("marks")], Annotated[ScoreDrop, Tag("score")]], Discriminator(_drop_shape)]


class Suite(Block):
    """One suite: where its items came from, how it was marked (`kind`: right/wrong — a built-in or golden
    suite has no `kind` — a mean score or a perplexity), the paired figures and the items that show the
    difference."""

    suite: str
    source: str
    kinds: list[str]
    kind: Literal["binary", "mean", "loglik"] | None = None
    output_type: str | None = None
    default_chance: Num
    lmeval: LmEval | None = None
    shortfall: str | None = None
    seconds: Num
    chance: Num | None = None
    n: int
    counts: Counts | None = None
    drop: Drop
    flipped: list[Item]
    largest_drops: list[Item] | None = None
    alpha: Num
    interval: str

    @property
    def scored(self) -> bool:
        """Marked by a per-document score (a mean or a perplexity) rather than right or wrong."""
        return self.kind in ("mean", "loglik")

    @property
    def marks(self) -> tuple[NonInferiority, Counts]:
        """A right/wrong suite's figures: Newcombe's drop and flips, and the paired table."""
        if not isinstance(self.drop, NonInferiority) or self.counts is None:
            raise TypeError(f"suite {self.suite!r} is scored per document, not marked right or wrong")
        return self.drop, self.counts

    @property
    def score(self) -> ScoreDrop:
        """A scored suite's figures: the paired drop of its mean score or perplexity."""
        if not isinstance(self.drop, ScoreDrop):
            raise TypeError(f"suite {self.suite!r} is marked right or wrong, not scored per document")
        return self.drop

    @model_validator(mode="after")
    def _shape(self) -> "Suite":
        """A right/wrong suite has its paired table and Newcombe's figures; a scored one its score drop."""
        if self.scored != isinstance(self.drop, ScoreDrop) or (not self.scored and self.counts is None):
            raise ValueError(f"suite {self.suite!r} of kind {self.kind or 'binary'} does not carry that kind's figures")
        return self


class TasksDetails(Details):
    """Gate 4: every suite's figures; `shortfall` joins the suites' notes on documents a task did not have."""

    suites: list[Suite]
    shortfall: str | None = None

    def split(self) -> tuple[list[Suite], list[Suite]]:
        """The suites as (marked right or wrong, scored per document)."""
        return [s for s in self.suites if not s.scored], [s for s in self.suites if s.scored]


#: the gate's details type (`qval.results.TYPES`)
DETAILS = TasksDetails
