"""Paired statistics for an item-by-item comparison of a reference and a candidate model.

Both models answer the same items, so each item falls in one cell of a 2x2 table: right for
both, right for the reference only (a right->wrong flip, the loss a quantized model causes),
right for the candidate only, right for neither. Only the discordant cells carry information
about the difference, which is why a paired analysis is far tighter than comparing two
accuracies as if they were independent. Standard library and numpy only: the tests check
every figure against scipy / statsmodels, which therefore cannot share a bug with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from qval.metrics.estimate import normal_ppf

NAN = float("nan")


@dataclass(frozen=True)
class PairedCounts:
    """The 2x2 table of a paired comparison.

    >>> c = PairedCounts(both=12, ref_only=9, cand_only=2, neither=21)
    >>> c.n, c.ref_correct, c.cand_correct, c.discordant
    (44, 21, 14, 11)
    >>> c.to_dict()
    {'both': 12, 'ref_only': 9, 'cand_only': 2, 'neither': 21}
    """

    both: int
    ref_only: int
    cand_only: int
    neither: int

    def __post_init__(self) -> None:
        for name in ("both", "ref_only", "cand_only", "neither"):
            v = int(getattr(self, name))  # numpy integers in, Python ints stored
            if v < 0:
                raise ValueError(f"PairedCounts.{name} must be >= 0, got {v}")
            object.__setattr__(self, name, v)

    @property
    def n(self) -> int:
        return self.both + self.ref_only + self.cand_only + self.neither

    @property
    def ref_correct(self) -> int:
        return self.both + self.ref_only

    @property
    def cand_correct(self) -> int:
        return self.both + self.cand_only

    @property
    def discordant(self) -> int:
        return self.ref_only + self.cand_only

    def to_dict(self) -> dict[str, int]:
        """The four cells; `PairedCounts(**c.to_dict()) == c`."""
        return {"both": self.both, "ref_only": self.ref_only, "cand_only": self.cand_only, "neither": self.neither}


def paired_counts(ref: Sequence[bool], cand: Sequence[bool]) -> PairedCounts:
    """Tally per-item correctness of the two models, item i of `ref` against item i of `cand`.

    >>> paired_counts([True, True, False, False, True], [True, False, True, False, True])
    PairedCounts(both=2, ref_only=1, cand_only=1, neither=1)
    """
    r = np.asarray(ref, dtype=bool).reshape(-1)
    c = np.asarray(cand, dtype=bool).reshape(-1)
    if r.size != c.size:
        raise ValueError(f"paired_counts needs one answer per item from each model: {r.size} vs {c.size}")
    return PairedCounts(int(np.sum(r & c)), int(np.sum(r & ~c)), int(np.sum(~r & c)), int(np.sum(~r & ~c)))


def _check(k: int, n: int, conf: float) -> float:
    """Validate a count and a confidence level; return the two-sided normal quantile z."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0.0 < conf < 1.0:
        raise ValueError(f"need 0 < conf < 1, got conf={conf!r}")
    return normal_ppf(0.5 + conf / 2.0)


def wilson_interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of k successes in n: (k + z²/2 ± z·sqrt(k(n−k)/n + z²/4)) / (n + z²).

    >>> tuple(round(x, 4) for x in wilson_interval(8, 10))
    (0.4902, 0.9433)
    >>> wilson_interval(0, 5)[0], wilson_interval(5, 5)[1], wilson_interval(0, 0)
    (0.0, 1.0, (nan, nan))
    """
    z = _check(k, n, conf)
    if n == 0:
        return NAN, NAN
    z2 = z * z
    centre, half = (k + z2 / 2.0) / (n + z2), z / (n + z2) * math.sqrt(k * (n - k) / n + z2 / 4.0)
    # At k = 0 or k = n one end is exactly 0 or 1; rounding must not move it off.
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz)."""
    if not 0.0 < x < 1.0:
        return float(x >= 1.0)
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below the mean
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 200_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * h / a


def _beta_ppf(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q, by bisection down to adjacent floats (I is increasing in x)."""
    lo, hi = 0.0, 1.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return mid
        if _betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson) interval: the beta quantiles B(α/2; k, n−k+1), B(1−α/2; k+1, n−k).

    At k = 0 the upper end solves (1−p)^n = α/2 in closed form (k = n mirrors it).
    >>> [tuple(round(x, 4) for x in clopper_pearson(k, 10)) for k in (0, 1, 10)]
    [(0.0, 0.3085), (0.0025, 0.445), (0.6915, 1.0)]
    """
    _check(k, n, conf)
    if n == 0:
        return NAN, NAN
    tail = (1.0 - conf) / 2.0
    edge = -math.expm1(math.log(tail) / n)  # 1 − (α/2)^(1/n)
    lo = 0.0 if k == 0 else (1.0 - edge if k == n else _beta_ppf(tail, k, n - k + 1))
    hi = 1.0 if k == n else (edge if k == 0 else _beta_ppf(1.0 - tail, k + 1, n - k))
    return lo, hi


def newcombe_paired_diff(c: PairedCounts, conf: float = 0.95) -> tuple[float, float, float]:
    """The drop d = p_ref − p_cand = (ref_only − cand_only)/n and Newcombe's (1998) method-10 interval.

    Wilson intervals (l1, u1), (l2, u2) for the two accuracies are combined with φ*, the phi
    coefficient of the table with Newcombe's correction (A = both·neither − ref_only·cand_only is
    replaced by A − n/2 when A > n/2, by 0 when 0 <= A <= n/2; φ* = 0 when a margin is empty):
      lo = d − sqrt((p1−l1)² − 2φ*(p1−l1)(u2−p2) + (u2−p2)²)
      hi = d + sqrt((u1−p1)² − 2φ*(u1−p1)(p2−l2) + (p2−l2)²)
    Newcombe's worked example, 12 / 9 / 2 / 21 (his paper prints 0.1591, 0.0112 to 0.2954):
    >>> tuple(round(x, 4) for x in newcombe_paired_diff(PairedCounts(12, 9, 2, 21)))
    (0.1591, 0.0112, 0.2954)
    """
    n = c.n
    if n == 0:
        _check(0, 0, conf)
        return NAN, NAN, NAN
    p1, p2 = c.ref_correct / n, c.cand_correct / n
    l1, u1 = wilson_interval(c.ref_correct, n, conf)
    l2, u2 = wilson_interval(c.cand_correct, n, conf)
    den = c.ref_correct * (n - c.ref_correct) * c.cand_correct * (n - c.cand_correct)
    a = c.both * c.neither - c.ref_only * c.cand_only
    a_star = a - n / 2.0 if a > n / 2.0 else (0.0 if a >= 0 else float(a))
    phi = a_star / math.sqrt(den) if den > 0 else 0.0
    d = (c.ref_only - c.cand_only) / n  # exactly 0.0 when the cells are equal
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2.0 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2.0 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return d, d - delta, d + eps


def mcnemar_exact(c: PairedCounts) -> float:
    """Two-sided exact McNemar p: 2·P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), capped at 1.

    >>> [round(mcnemar_exact(PairedCounts(10, b, c, 10)), 12) for b, c in ((5, 0), (9, 2), (3, 3))]
    [0.0625, 0.0654296875, 1.0]
    """
    m, k = c.discordant, min(c.ref_only, c.cand_only)
    if 2 * k >= m:  # no discordant pairs, or b == c: nothing points either way
        return 1.0
    return min(1.0, 2.0 * _betainc(m - k, k + 1, 0.5))  # P(X <= k) = I_{1/2}(m − k, k + 1)


def _check_alpha(alpha: float, name: str = "alpha") -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"need 0 < {name} < 0.5, got {name}={alpha!r}")


def drop_upper_bound(c: PairedCounts, alpha: float = 0.05) -> float:
    """One-sided (1 − α) upper confidence bound of the drop: hi of the (1 − 2α) Newcombe interval.

    >>> round(drop_upper_bound(PairedCounts(12, 9, 2, 21)), 4)
    0.2753
    """
    _check_alpha(alpha)
    return newcombe_paired_diff(c, 1.0 - 2.0 * alpha)[2]


def detectable_drop(n: int, discordance: float, alpha: float = 0.05, beta: float = 0.2) -> float:
    """Smallest true drop a paired test on n items catches with power 1 − β at one-sided level α.

    δ = (z_{1−α} + z_{1−β}) · sqrt(ψ / n), ψ the expected fraction of discordant pairs: Connor's
    (1987) normal approximation to McNemar's test with the δ² term of the alternative's variance
    ψ − δ² dropped, so it assumes δ² << ψ (a drop small beside the flip rate), and errs to the
    conservative side when that fails. ψ is a planning guess (e.g. the flip rate observed).
    >>> round(detectable_drop(1000, 0.1), 6)
    0.024865
    >>> detectable_drop(0, 0.1)
    nan
    """
    if n < 0:
        raise ValueError(f"detectable_drop needs n >= 0, got n={n!r}")
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"detectable_drop needs a discordance in [0, 1], got {discordance!r}")
    _check_alpha(alpha)
    _check_alpha(beta, "beta")
    if n == 0:
        return NAN
    return (normal_ppf(1.0 - alpha) + normal_ppf(1.0 - beta)) * math.sqrt(discordance / n)


def noninferiority(c: PairedCounts, margin: float, alpha: float = 0.05, beta: float = 0.2) -> dict[str, Any]:
    """Non-inferiority verdict: passed when the one-sided (1 − α) upper bound of the drop <= margin.

    Reported beside it: the drop the test could detect (power 1 − β, from the observed flip rate,
    floored at 1/n), the exact McNemar p, the flip and net-loss rates with Clopper–Pearson
    intervals, and each model's accuracy with its Wilson interval. n = 0 never raises: every figure
    is nan and `passed` is False.
    >>> r = noninferiority(PairedCounts(both=900, ref_only=10, cand_only=8, neither=82), margin=0.02)
    >>> r["passed"], round(r["drop"], 3), round(r["upper"], 4), round(r["detectable_drop"], 4), r["net_loss"]
    (True, 0.002, 0.0095, 0.0105, 10)
    """
    n = c.n
    _check_alpha(alpha)
    _check_alpha(beta, "beta")
    rate = (lambda k: k / n) if n else (lambda k: NAN)
    drop, lo, hi = newcombe_paired_diff(c, 1.0 - 2.0 * alpha)  # nan for n = 0, and nan <= margin is False
    return {
        "drop": float(drop), "lo": float(lo), "hi": float(hi), "upper": float(hi),
        "margin": float(margin), "passed": bool(hi <= margin),
        "detectable_drop": detectable_drop(n, max(c.discordant / n, 1.0 / n) if n else 0.0, alpha, beta),
        "mcnemar_p": mcnemar_exact(c) if n else NAN,
        "flip_rate": rate(c.discordant), "flip_interval": clopper_pearson(c.discordant, n),
        "net_loss": c.ref_only, "net_loss_interval": clopper_pearson(c.ref_only, n),
        "ref_accuracy": rate(c.ref_correct), "ref_interval": wilson_interval(c.ref_correct, n),
        "cand_accuracy": rate(c.cand_correct), "cand_interval": wilson_interval(c.cand_correct, n),
        "n": n,
    }


def informative(ref_correct: int, n: int, chance: float, alpha: float = 0.05) -> bool:
    """True when the reference is clearly above chance: its (1 − 2α) Wilson lower bound > chance.

    A task the reference cannot do says nothing about what quantization cost.
    >>> informative(30, 100, 0.25), informative(60, 100, 0.25), informative(0, 0, 0.25)
    (False, True, False)
    """
    _check_alpha(alpha)
    if n == 0:
        return False
    return bool(wilson_interval(ref_correct, n, 1.0 - 2.0 * alpha)[0] > chance)


# --- per-item scores rather than right/wrong marks ------------------------------------------------

def _drop_bounds(drop: float, se: float, n: int, margin: float, alpha: float, beta: float, sd: float) -> dict[str, Any]:
    """The shared tail of the two score rules: the (1 − 2α) normal interval of the drop (its upper
    end is the one-sided (1 − α) bound the margin meets) and the drop detectable with power 1 − β."""
    z = normal_ppf(1.0 - alpha)
    lo, hi = drop - z * se, drop + z * se
    detect = (z + normal_ppf(1.0 - beta)) * sd / math.sqrt(n) if n else NAN
    return {"drop": float(drop), "lo": float(lo), "hi": float(hi), "upper": float(hi), "stderr": float(se),
            "margin": float(margin), "passed": bool(hi <= margin), "detectable_drop": float(detect), "n": n}


def mean_noninferiority(ref: Sequence[float], cand: Sequence[float], margin: float, alpha: float = 0.05,
                        beta: float = 0.2, higher_is_better: bool = True) -> dict[str, Any]:
    """Non-inferiority of a per-item score: the drop is the mean of the paired differences
    (reference − candidate when a higher score is better, candidate − reference otherwise), its
    standard error sd(d)/√n and a normal interval; passed when the one-sided (1 − α) upper bound
    is within the margin. The detectable drop is (z_{1−α} + z_{1−β}) sd(d)/√n. Fewer than two
    items give no interval (nan: not passed).

    >>> r = mean_noninferiority([0.9, 0.8, 0.7, 0.6], [0.8, 0.8, 0.6, 0.6], margin=0.2)
    >>> round(r["drop"], 4), round(r["stderr"], 4), round(r["hi"], 4), r["passed"], round(r["ref_mean"], 2)
    (0.05, 0.0289, 0.0975, True, 0.75)
    """
    _check_alpha(alpha)
    _check_alpha(beta, "beta")
    a, b = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need equal lengths, got {a.size} and {b.size}")
    n = int(a.size)
    d = (a - b) if higher_is_better else (b - a)
    drop = float(d.mean()) if n else NAN
    sd = float(d.std(ddof=1)) if n > 1 else NAN
    se = sd / math.sqrt(n) if n > 1 else NAN
    out = _drop_bounds(drop, se, n, margin, alpha, beta, sd)

    def stderr(x: np.ndarray) -> float:
        return float(x.std(ddof=1)) / math.sqrt(x.size) if x.size > 1 else NAN

    def interval(x: np.ndarray) -> tuple[float, float]:
        m, e = float(x.mean()) if x.size else NAN, stderr(x)
        return m - 1.959963984540054 * e, m + 1.959963984540054 * e

    out.update(ref_mean=float(a.mean()) if n else NAN, cand_mean=float(b.mean()) if n else NAN,
               ref_stderr=stderr(a), cand_stderr=stderr(b), ref_interval=interval(a), cand_interval=interval(b),
               higher_is_better=higher_is_better)
    return out


def loglik_noninferiority(ref_ll: Sequence[float], cand_ll: Sequence[float], weights: Sequence[float], margin: float,
                          alpha: float = 0.05, beta: float = 0.2, scale: float = 1.0) -> dict[str, Any]:
    """Non-inferiority of a corpus perplexity from per-item log-likelihoods ll_i over weights w_i
    (words, bytes, or 1 per item): the drop D = scale · Σ(ll_ref,i − ll_cand,i) / Σ w_i is
    ln(PPL_cand / PPL_ref) of the weighted perplexity exp(−Σ ll / Σ w) (scale 1/ln 2: the excess
    bits per byte). Its standard error is the ratio estimator's, sqrt(n/(n−1) · Σ(d_i − D w_i)²) / Σ w
    (d_i = scale · (ll_ref,i − ll_cand,i)); the detectable drop is (z_{1−α} + z_{1−β}) times that error.

    >>> r = loglik_noninferiority([-10.0, -20.0], [-11.0, -21.0], [5, 10], margin=0.2)
    >>> round(r["drop"], 4), round(r["stderr"], 4), round(r["ref_ppl"], 4), round(r["cand_ppl"] / r["ref_ppl"], 4)
    (0.1333, 0.0444, 7.3891, 1.1426)
    """
    _check_alpha(alpha)
    _check_alpha(beta, "beta")
    a, b, w = (np.asarray(x, dtype=np.float64) for x in (ref_ll, cand_ll, weights))
    if not a.shape == b.shape == w.shape:
        raise ValueError(f"paired log-likelihoods need equal lengths, got {a.size}, {b.size} and {w.size}")
    n, total = int(a.size), float(w.sum())
    if n == 0 or total <= 0:
        return {**_drop_bounds(NAN, NAN, n, margin, alpha, beta, NAN), "ref_ppl": NAN, "cand_ppl": NAN}
    d = scale * (a - b)
    drop = float(d.sum() / total)
    resid = d - drop * w
    se = math.sqrt(n / (n - 1) * float((resid ** 2).sum())) / total if n > 1 else NAN
    out = _drop_bounds(drop, se, n, margin, alpha, beta, se * math.sqrt(n))
    out.update(ref_ppl=math.exp(-float(a.sum()) / total), cand_ppl=math.exp(-float(b.sum()) / total),
               ref_bpb=-float(a.sum()) / total / math.log(2), cand_bpb=-float(b.sum()) / total / math.log(2),
               weight=total)
    return out
