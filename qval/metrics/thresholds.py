"""Gate thresholds sized by a one-sided test, the way the TensorRT-LLM accuracy suite sizes them.

Given the reference's score `ref_value`, the per-sample standard deviation `sigma` and the number
of samples `n`, the candidate's mean differs from the reference's by noise of standard deviation
sqrt(2σ²/n) (two independent means). The threshold lets the candidate through with probability
1 − α when it is truly as good as the reference (false-reject rate α), and the gate catches a true
drop of θ with probability 1 − β. θ is printed beside every verdict so a reader knows what a
pass means: "no regression larger than θ", not "no regression".
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from statistics import NormalDist

from qval.metrics.estimate import normal_ppf


@dataclass(frozen=True)
class Sizing:
    """A threshold with the statistics that sized it (all kept for the report)."""

    threshold: float
    min_detectable_effect: float
    ref_value: float
    sigma: float
    n: int
    alpha: float
    beta: float
    higher_is_better: bool


def sized_threshold(
    ref_value: float,
    sigma: float,
    n: int,
    *,
    alpha: float = 0.05,
    beta: float = 0.2,
    higher_is_better: bool = True,
) -> Sizing:
    """threshold = ref ± Φ⁻¹(α)·sqrt(2σ²/n); θ = −(Φ⁻¹(α) + Φ⁻¹(β))·sqrt(2σ²/n).

    Φ⁻¹(α) < 0, so for a higher-is-better score the threshold is a lower bound below ref; for a
    lower-is-better one (KLD, PPL) it is an upper bound above ref.
    >>> t = sized_threshold(0.9, 0.3, 100)
    >>> round(t.threshold, 6), round(t.min_detectable_effect, 6)
    (0.830215, 0.105492)
    >>> round(sized_threshold(5.0, 0.3, 100, higher_is_better=False).threshold, 6)
    5.069785
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"sized_threshold needs an integer sample count n >= 2, got n={n!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sized_threshold needs a finite sigma >= 0, got sigma={sigma!r}")
    if not math.isfinite(ref_value):
        raise ValueError(f"sized_threshold needs a finite reference value, got ref_value={ref_value!r}")
    # α, β ≥ 0.5 would put the threshold on the wrong side of ref (Φ⁻¹ ≥ 0): a configuration error.
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"sized_threshold needs 0 < alpha < 0.5 (false-reject rate), got alpha={alpha!r}")
    if not 0.0 < beta < 0.5:
        raise ValueError(f"sized_threshold needs 0 < beta < 0.5 (miss rate), got beta={beta!r}")

    noise = math.sqrt(2.0 * sigma * sigma / n)
    z_alpha, z_beta = normal_ppf(alpha), normal_ppf(beta)
    margin = z_alpha * noise  # negative
    threshold = ref_value + margin if higher_is_better else ref_value - margin
    return Sizing(
        threshold=threshold,
        min_detectable_effect=-(z_alpha + z_beta) * noise,
        ref_value=float(ref_value),
        sigma=float(sigma),
        n=int(n),
        alpha=float(alpha),
        beta=float(beta),
        higher_is_better=bool(higher_is_better),
    )


#: the power every stated detectable effect is given at (β = 0.2), as the sized checks' default
POWER = 0.8


@dataclass(frozen=True)
class StatedRates:
    """What a check promises: the probability that a candidate at the reference's level fails it
    (its size), and the figure's value it catches with probability POWER."""

    size: float | None
    detectable: float | None
    basis: str


def absolute_rates(op: str, limit: float, on: str, reference: float, value: float, bound: float | None,
                   stderr: float | None) -> StatedRates:
    """An absolute limit's size and power under a normal model of the figure at its measured noise.

    The figure f̂ ~ N(f, se²) and the check meets the limit with f̂ itself (on "value") or with its
    interval's end f̂ ± w (on "hi"/"lo", w = |bound − value| as measured). At the reference's own
    level (f = `reference`: top-1 1, a KLD, drop or excess 0, a PPL ratio 1) it fails with
    probability 1 − Φ((d − w)/se), d the distance from the reference's level to the limit on the
    passing side; a figure at `detectable` (max: L − w + z₀.₈·se, min: L + w − z₀.₈·se) fails with
    probability 0.8. se is the candidate's own: a noisier candidate has a larger size and a farther
    detectable effect, never a looser limit.

    >>> r = absolute_rates("min", 0.99, "lo", 1.0, 0.9954, 0.9873, 0.0041)   # issue 29's late top-1
    >>> round(r.size, 2), round(r.detectable, 4)
    (0.32, 0.9946)
    >>> round(absolute_rates("max", 0.05, "value", 0.0, 0.038, None, 0.0005).size, 6)
    0.0
    """
    w = 0.0 if on == "value" or bound is None else abs(bound - value)
    d = (limit - reference) if op == "max" else (reference - limit)
    if stderr is None or not math.isfinite(stderr) or stderr <= 0:
        return StatedRates(0.0 if d >= w else 1.0, None, "a figure without noise: it fails only beyond the limit")
    z = normal_ppf(POWER)
    size = 1.0 - NormalDist().cdf((d - w) / stderr)
    detectable = limit - w + z * stderr if op == "max" else limit + w - z * stderr
    return StatedRates(size, detectable, f"normal model at this candidate's standard error {stderr:.3g}")


def paired_reject_probability(n: int, ref_accuracy: float, ref_only: float, cand_only: float, margin: float,
                              alpha: float = 0.05) -> float:
    """Exact probability that a paired non-inferiority check (gate 4's suites, the retrieval matrix)
    fails: n items, each one of (both right, only the reference right, only the candidate right,
    neither) with probabilities set by the reference's accuracy and the two discordant rates, and the
    check failing when the one-sided (1 − α) upper bound of the drop exceeds `margin`
    (`paired.drop_upper_bound`). A candidate at the reference's level has ref_only = cand_only.

    >>> round(paired_reject_probability(5, 1.0, 0.05, 0.0, 0.6), 4)   # one length of the retrieval matrix
    0.0226
    """
    from math import comb

    from .paired import PairedCounts, drop_upper_bound

    p = (ref_accuracy - ref_only, ref_only, cand_only, 1.0 - ref_accuracy - cand_only)
    if min(p) < -1e-12:
        raise ValueError(f"rates {ref_only}, {cand_only} do not fit a reference accuracy of {ref_accuracy}")
    p = tuple(max(0.0, x) for x in p)
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            for a in range(n + 1 - b - c):
                d = n - a - b - c
                pmf = comb(n, a) * comb(n - a, b) * comb(n - a - b, c) * p[0] ** a * p[1] ** b * p[2] ** c * p[3] ** d
                if pmf > 0 and drop_upper_bound(PairedCounts(a, b, c, d), alpha) > margin:
                    total += pmf
    return total
