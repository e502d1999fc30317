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

from qval.metrics.estimate import normal_ppf


@dataclass(frozen=True)
class SizedThreshold:
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
) -> SizedThreshold:
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
    return SizedThreshold(
        threshold=threshold,
        min_detectable_effect=-(z_alpha + z_beta) * noise,
        ref_value=float(ref_value),
        sigma=float(sigma),
        n=int(n),
        alpha=float(alpha),
        beta=float(beta),
        higher_is_better=bool(higher_is_better),
    )
