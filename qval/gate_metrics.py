"""Gate metrics: what a gate's table is. A table (`GateMetrics`) has one row (`Metric`) per figure a gate is
judged on; each gate's own table is its package's `metrics.py` (`qval.gates.agreement.metrics.AGREEMENT`), and
`qval.gate_registry.TABLES` lists them in the config sections' order.

A row names the figure (its key in `GateResult.measurements`), the config field that limits it,
the direction, the words a report prints beside it, which kinds of limit it takes (absolute, or
sized from the reference's noise), the bounds a limit must lie in, the end of the figure's
interval that meets an absolute limit, and whether a sweep shows it as a column. The config's
validators, each gate's `thresholds()` and `inputs()` (its cache key) and the sweep's columns
are read from here, so adding a metric is one row plus its computation.

Torch-free and pydantic-free: `qval.config` imports it.

>>> Metric("top1", "min_top1", "min", "top-1 agreement {where}").describe(where="at depth 512")
'top-1 agreement at depth 512'
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
    lo: float = 0.0  # a limit must lie in [lo, hi] (`config_base.check_limit`, or the field's pydantic bounds)
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


#: a non-inferiority check's label (retrieval's and gate 4's drops)
NON_INFERIOR = "its one-sided {level} upper bound must stay within the margin (non-inferiority)"
