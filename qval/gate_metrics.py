"""Gate metrics: one table per gate, one row per figure a gate is judged on.

A row names the figure (its key in `GateResult.measurements`), the config field that limits it,
the direction, the words a report prints beside it, which kinds of limit it takes (absolute, or
sized from the reference's noise), the bounds a limit must lie in, the end of the figure's
interval that meets an absolute limit, and whether a sweep shows it as a column. The config's
validators, each gate's `thresholds()` and `inputs()` (its cache key) and the sweep's columns
are read from here, so adding a metric is one row plus its computation.

Torch-free and pydantic-free: `qval.config` imports it.

>>> AGREEMENT.fields
('min_top1', 'max_mean_kld', 'max_p99_kld')
>>> DEPTH.by_field("max_mean_kld").describe(where="at context depths 0–512")
'mean KLD(ref‖cand) at context depths 0–512, nats'
>>> sorted(RETRIEVAL.cache_exclude())
['enabled', 'margin', 'margin_overall', 'max_answer_kld', 'min_reference_accuracy']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

ABSOLUTE = ("absolute",)
EITHER = ("absolute", "sized")  # a number, or {sized: true, alpha, beta}
MEDIAN_SPREAD = math.sqrt(math.pi / 2)  # the spread of a median of n normal values / of their mean, n → ∞


@dataclass(frozen=True)
class Spread:
    """Sized from the reference's own per-prompt spread of the figure (`sizing[source]`), in the
    figure's unit: nothing the candidate does can widen the limit. A figure that is a median over
    prompts (`median=True`) is sized with that spread × √(π/2), a median's spread relative to a
    mean's for normal values at large n; at small n it is less (1.16 at 8 prompts, by simulation),
    so the stated size is an upper bound there and the stated detectable effect a lower bound on power.

    >>> round(Spread("s", median=True).sigma({"s": 1.0}) / Spread("s").sigma({"s": 1.0}), 4)
    1.2533
    """

    source: str
    median: bool = False
    scale_by_n: ClassVar[bool] = False

    def sigma(self, sizing: dict[str, Any]) -> float:
        return sizing[self.source] * (MEDIAN_SPREAD if self.median else 1.0)

    @property
    def basis(self) -> str:
        """What the limit is sized from, in the report's words."""
        return "the reference's own spread" + (" × √(π/2), a median's" if self.median else "")

    @property
    def statistic(self) -> str:
        """How the figure is taken over prompts: "median" or "mean" (gate 3's cache key and the error-rate rows name it)."""
        return "median" if self.median else "mean"


@dataclass(frozen=True)
class Rate:
    """A count of prompts, sized from σ of the reference's 0/1 outcome at its rate
    (`sizing[source]`), the limit scaled from a rate to a count (× prompts).

    >>> Rate("r").sigma({"r": 0.25}) == math.sqrt(0.25 * 0.75)
    True
    """

    source: str
    scale_by_n: ClassVar[bool] = True
    basis: ClassVar[str] = "the reference's own spread"

    def sigma(self, sizing: dict[str, Any]) -> float:
        rate = sizing[self.source]
        return math.sqrt(max(rate * (1 - rate), 0.0))


@dataclass(frozen=True)
class Metric:
    """One figure of one gate and the config field that limits it."""

    key: str  # in GateResult.measurements; per-bucket, -language, -length, -suite keys are built on it
    field: str  # the config field that sets the limit
    op: Literal["min", "max"]
    label: str  # Threshold.description; a {name} in it is filled by the gate (a depth, a language, a suite)
    kinds: tuple[str, ...] = ABSOLUTE  # or EITHER
    lo: float = 0.0  # a limit must lie in [lo, hi] (`config_gates._limit`, or the field's pydantic bounds)
    hi: float | None = None
    integer: bool = False  # the limit counts prompts
    on: Literal["value", "lo", "hi"] = "value"  # the end of the figure's interval an absolute limit is met by
    sweep: str | None = None  # the header of its column in `qval sweep`'s table (the whole-run figure `key`); None: none
    #: how a sized limit is sized (gate 3); None where the gate sizes it itself (gate 2: paired log PPL,
    #: BLEU/chrF per language) or takes absolute limits only
    sizing: Spread | Rate | None = None
    #: the row sets a check only when this holds of the gate's config section
    applies: Callable[[Any], bool] | None = None

    def describe(self, **where: str) -> str:
        return self.label.format(**where)


@dataclass(frozen=True)
class GateMetrics:
    """The rows of one gate, in the order its checks are listed."""

    gate: str
    metrics: tuple[Metric, ...]
    #: settings read only when deciding (whether a check is informative), never when measuring
    verdict_only: tuple[str, ...] = ()
    #: the list field whose items hold the rows' fields (gate 4: one limit per suite), or None
    per: str | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(m.field for m in self.metrics)

    def by_field(self, field: str) -> Metric:
        return next(m for m in self.metrics if m.field == field)

    def cache_exclude(self) -> dict[str, Any]:
        """`model_dump(exclude=…)` of the gate's section for its cache key: the limits and what
        only the verdict reads, so changing a limit re-decides from the stored result."""
        verdict = {f: True for f in (*self.fields, *self.verdict_only)}
        return {"enabled": True, **({self.per: {"__all__": verdict}} if self.per else verdict)}


def _eos_allowed(section: Any) -> bool:
    return not section.suppress_eos


AGREEMENT = GateMetrics("agreement", (
    Metric("top1", "min_top1", "min", "top-1 agreement with the reference (teacher-forced)", hi=1.0, sweep="top-1"),
    Metric("mean_kld", "max_mean_kld", "max", "mean KLD(ref‖cand) per scored token, nats", sweep="mean KLD"),
    Metric("p99_kld", "max_p99_kld", "max", "99th percentile of per-token KLD, nats", sweep="p99 KLD"),
))

QUALITY = GateMetrics("quality", (
    # a ratio limit below 1 would demand a candidate better than the reference
    Metric("ppl_ratio", "max_ppl_ratio", "max", "PPL_cand / PPL_ref over the scored positions", EITHER, lo=1.0, sweep="PPL ratio"),
    # per language: {per} is " on the <lang> prompts, points"
    Metric("bleu_drop", "max_bleu_drop", "max", "reference BLEU − candidate BLEU{per}", EITHER, hi=100.0),
    Metric("chrf_drop", "max_chrf_drop", "max", "reference chrF − candidate chrF{per}", EITHER, hi=100.0),
))

# The first three compare the candidate with the reference (or with its own early positions): the
# only spread to size them from is the candidate's own, so a noisier candidate would get a looser
# limit. They take absolute limits, met by the 95% interval's bound, so noise makes them stricter.
LONGGEN = GateMetrics("longgen", (
    Metric("late_top1", "min_late_top1", "min",
           "top-1 agreement on the reference's continuation, last `edge` positions", hi=1.0, on="lo"),
    Metric("late_kld", "max_late_kld", "max",
           "mean KLD(ref‖cand) on the reference's continuation, last `edge` positions, nats", on="hi", sweep="late KLD"),
    Metric("late_drift", "max_late_drift", "max",
           "late mean KLD − early mean KLD, nats (error that accumulates with context)", on="hi"),
    Metric("seq_rep4_excess", "max_seq_rep4_excess", "max",
           "candidate late seq-rep-4 − reference late seq-rep-4 (mean over prompts)", EITHER, hi=1.0,
           sizing=Spread("ref_late_seq_rep4_sigma")),
    # the median over prompts: a candidate whose greedy path falls into another loop where the reference's
    # own text loops is scored against a loop's near-zero NLL, a heavy per-prompt tail that carried the mean
    # (benchmarks/RESULTS.md §12, "Judge NLL"); damage that moves most prompts moves the median
    Metric("judge_nll_excess", "max_judge_nll_excess", "max",
           "reference NLL of the candidate's late text − of its own late text, nats/token, median over prompts",
           EITHER, sizing=Spread("ref_late_nll_sigma", median=True)),
    Metric("loops_excess", "max_loops_excess", "max",
           "prompts whose continuation ends in a loop: candidate − reference", EITHER, integer=True,
           sizing=Rate("ref_loop_rate")),
    Metric("premature_eos_excess", "max_premature_eos_excess", "max",
           "prompts stopped by EOS before new_tokens: candidate − reference", EITHER, integer=True,
           sizing=Rate("ref_eos_rate"), applies=_eos_allowed),
))

DEPTH = GateMetrics("depth", (  # every limit applies to every depth bucket: `{metric}@{bucket}`
    Metric("top1", "min_top1", "min", "top-1 agreement {where} (teacher-forced)", hi=1.0),
    Metric("mean_kld", "max_mean_kld", "max", "mean KLD(ref‖cand) {where}, nats", sweep="depth mean KLD"),
    Metric("p99_kld", "max_p99_kld", "max", "99th percentile of per-token KLD {where}, nats"),
))

_NON_INFERIOR = "its one-sided {level} upper bound must stay within the margin (non-inferiority)"

RETRIEVAL = GateMetrics("retrieval", (
    Metric("drop", "margin", "max", "retrieval accuracy drop (reference − candidate) {where}; " + _NON_INFERIOR,
           hi=1.0, on="hi"),  # per context length: drop@<length>
    Metric("drop", "margin_overall", "max", "retrieval accuracy drop (reference − candidate) {where}; " + _NON_INFERIOR,
           hi=1.0, on="hi", sweep="retrieval drop"),
    Metric("answer_kld", "max_answer_kld", "max",
           "mean KLD(ref‖cand) on the pass-code tokens (teacher-forced on the true code), nats", on="hi"),
), verdict_only=("min_reference_accuracy",))

TASKS = GateMetrics("tasks", (  # per suite: drop@<suite>, flip_rate@<suite>
    Metric("drop", "margin", "max", "{what} on suite {suite}; " + _NON_INFERIOR, on="hi"),
    Metric("flip_rate", "max_flip_rate", "max", "share of items of suite {suite} the two models mark differently; "
           "its exact 95% upper bound must stay within the limit", hi=1.0, on="hi"),
), verdict_only=("chance",), per="suites")

#: in the order of the config's gate sections
TABLES: tuple[GateMetrics, ...] = (AGREEMENT, QUALITY, LONGGEN, DEPTH, RETRIEVAL, TASKS)

#: (gate, measurement, column header) of every sweep column, in table order
SWEEP_FIGURES: tuple[tuple[str, str, str], ...] = tuple((t.gate, m.key, m.sweep) for t in TABLES for m in t.metrics if m.sweep)
