"""The retrieval matrix's typed details: every trial's marks, the paired counts and non-inferiority
figures per context length and pooled, and the right answers per cell."""

from __future__ import annotations

from ...results.base import Block, Details, EstimateDict, Num


class Counts(Block):
    """`metrics.paired.PairedCounts.to_dict()`: the paired 2×2 table."""

    both: int
    ref_only: int
    cand_only: int
    neither: int


class NonInferiority(Block):
    """`metrics.paired.noninferiority`: the drop (reference − candidate accuracy) with Newcombe's paired
    interval, its one-sided bound against the margin, the drop detectable with power 1 − β, flips."""

    drop: Num
    lo: Num
    hi: Num
    upper: Num
    margin: Num
    passed: bool
    detectable_drop: Num
    mcnemar_p: Num
    flip_rate: Num
    flip_interval: list[Num]
    net_loss: int
    net_loss_interval: list[Num]
    ref_accuracy: Num
    ref_interval: list[Num]
    cand_accuracy: Num
    cand_interval: list[Num]
    n: int


class Row(Block):
    """One trial: where its needle is, both models' marks and figures on the answer; `ref_answer` /
    `cand_answer` (greedy) only where the two marks differ."""

    length: int
    depth: Num
    trial: int
    key: str
    name: str | None = None  # absent in reports written before it was recorded
    prompt_tokens: int
    needle_at: int | None = None
    offset: int | None = None
    ref_right: bool
    cand_right: bool
    ref_first_wrong: int | None = None
    cand_first_wrong: int | None = None
    answer_kld: Num
    answer_top1: Num
    finite_ref: bool | None = None
    finite_cand: bool | None = None
    ref_answer: str | None = None
    cand_answer: str | None = None


class Length(Block):
    """One context length: counts, each model's accuracy (Wilson), the drop."""

    length: int
    counts: Counts
    n: int
    ref: EstimateDict
    cand: EstimateDict
    drop: NonInferiority
    mean_prompt_tokens: Num


class Pooled(Block):
    counts: Counts
    drop: NonInferiority


class Cell(Block):
    """Right answers of one (length, depth) cell."""

    length: int
    depth: Num
    n: int
    ref_right: int
    cand_right: int


class RetrievalDetails(Details):
    """The retrieval matrix: lengths × depths × trials per cell over the haystack."""

    haystack: str
    haystack_tokens: int | None = None  # absent in reports written before it was recorded
    lengths: list[int]
    depths: list[Num]
    trials_per_cell: int
    trials: int
    rendering: str
    per_length: list[Length]
    cells: list[Cell]
    overall: Pooled
    flipped: list[Row]
    rows: list[Row]
    alpha: Num
    beta: Num
    interval: str

    def at_length(self, length: int | None) -> Length | Pooled:
        """The figures of one context length, or the pooled matrix's (`length` None)."""
        return self.overall if length is None else next(x for x in self.per_length if x.length == length)


#: the gate's details type (`qval.results.TYPES`)
DETAILS = RetrievalDetails
