"""A measured number with its uncertainty, and the small statistics that produce one.

Every figure in a qval report carries its standard error and a 95 % interval, so a reader can
tell a real regression from sampling noise. These helpers are pure: arrays in, numbers out.
NaN is never hidden: a NaN input gives a NaN estimate, and `to_dict` writes it as "nan" so a
failed measurement cannot pass through JSON as a silent null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

# Two-sided 95 % normal quantile; spelled out so the intervals do not depend on a lookup.
Z95 = 1.959963984540054


def _opt_float(x: float | None) -> float | None:
    return None if x is None else float(x)


def _json_float(x: float | None) -> float | str | None:
    """Finite floats stay floats; NaN/±Inf become strings, because JSON has no spelling for them.

    >>> _json_float(0.5), _json_float(float("nan")), _json_float(float("-inf")), _json_float(None)
    (0.5, 'nan', '-inf', None)
    """
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _from_json_float(x: float | str | None) -> float | None:
    return None if x is None else float(x)  # float("nan") / float("inf") parse the strings back


@dataclass(frozen=True)
class Estimate:
    """A value with standard error, 95 % interval [lo, hi] and sample count.

    >>> Estimate(0.75, 0.25, 0.26, 1.0, 4).to_dict()
    {'value': 0.75, 'stderr': 0.25, 'lo': 0.26, 'hi': 1.0, 'n': 4}
    """

    value: float
    stderr: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int | None = None

    def __post_init__(self) -> None:
        # Callers hand in numpy scalars; coerce so reports and equality see plain Python numbers.
        object.__setattr__(self, "value", float(self.value))
        object.__setattr__(self, "stderr", _opt_float(self.stderr))
        object.__setattr__(self, "lo", _opt_float(self.lo))
        object.__setattr__(self, "hi", _opt_float(self.hi))
        object.__setattr__(self, "n", None if self.n is None else int(self.n))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; NaN/Inf are kept visible as the strings "nan"/"inf"/"-inf".

        >>> Estimate(float("nan"), n=0).to_dict()
        {'value': 'nan', 'stderr': None, 'lo': None, 'hi': None, 'n': 0}
        """
        return {
            "value": _json_float(self.value),
            "stderr": _json_float(self.stderr),
            "lo": _json_float(self.lo),
            "hi": _json_float(self.hi),
            "n": self.n,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Estimate:
        """Inverse of `to_dict` (reports are read back when a sweep ranks candidates).

        >>> Estimate.from_dict({"value": "nan", "stderr": None, "lo": None, "hi": None, "n": 0})
        Estimate(value=nan, stderr=None, lo=None, hi=None, n=0)
        """
        value = _from_json_float(d["value"])
        return cls(
            value=float("nan") if value is None else value,
            stderr=_from_json_float(d.get("stderr")),
            lo=_from_json_float(d.get("lo")),
            hi=_from_json_float(d.get("hi")),
            n=d.get("n"),
        )


def _as_1d(x: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    return np.asarray(x, dtype=dtype).reshape(-1)


def proportion(flags: np.ndarray) -> Estimate:
    """Share of true flags, p ± sqrt(p(1-p)/(n-1)); the 95 % interval is clipped to [0, 1].

    n-1 rather than n: the unbiased variance, and it keeps p=1 from claiming zero error on n=1.
    >>> e = proportion(np.array([1, 1, 0, 1]))
    >>> round(e.value, 4), round(e.stderr, 4), e.hi, e.n
    (0.75, 0.25, 1.0, 4)
    """
    f = _as_1d(flags, np.float64)
    n = f.size
    if n == 0:
        return Estimate(float("nan"), n=0)
    p = float(f.mean())
    if n < 2:
        return Estimate(p, n=n)
    se = math.sqrt(p * (1.0 - p) / (n - 1)) if not math.isnan(p) else float("nan")
    return Estimate(p, se, max(0.0, p - Z95 * se), min(1.0, p + Z95 * se), n)


def mean_estimate(x: np.ndarray) -> Estimate:
    """Sample mean ± std(ddof=1)/sqrt(n), normal 95 % interval.

    >>> e = mean_estimate(np.array([1.0, 2.0, 3.0, 4.0]))
    >>> e.value, round(e.stderr, 6), e.n
    (2.5, 0.645497, 4)
    """
    a = _as_1d(x)
    n = a.size
    if n == 0:
        return Estimate(float("nan"), n=0)
    m = float(a.mean())
    if n < 2:
        return Estimate(m, n=n)
    se = float(a.std(ddof=1)) / math.sqrt(n)
    return Estimate(m, se, m - Z95 * se, m + Z95 * se, n)


def median_estimate(x: np.ndarray) -> Estimate:
    """Sample median with a distribution-free 95 % interval: the order statistics x(k) and x(n+1−k) for
    the largest k whose coverage 1 − 2·P(Binomial(n, ½) < k) is still ≥ 0.95. Under 6 values no pair
    reaches 95 %: no interval then. No standard error: the median's depends on the shape of x's
    distribution, which a few values cannot tell. NaN in x gives NaN, as the mean does.

    >>> e = median_estimate(np.array([0.3, -0.1, 0.0, 0.1, 5.0, 0.1, 0.4, 0.0]))
    >>> e.value, e.lo, e.hi, e.stderr, e.n
    (0.1, -0.1, 5.0, None, 8)
    >>> e = median_estimate(np.arange(20.0))
    >>> e.value, e.lo, e.hi
    (9.5, 5.0, 14.0)
    >>> median_estimate(np.array([1.0, 2.0, 3.0])).lo is None
    True
    """
    a = _as_1d(x)
    n = a.size
    if n == 0:
        return Estimate(float("nan"), n=0)
    if np.isnan(a).any():
        return Estimate(float("nan"), n=n)
    s = np.sort(a)
    m = float(np.median(s))
    # P(Binomial(n, ½) < k), accumulated; k grows while the coverage stays ≥ 0.95
    k, below = 0, 0.0
    while k + 1 <= n // 2 and 1.0 - 2.0 * (below + math.comb(n, k) / 2.0**n) >= 0.95:
        below += math.comb(n, k) / 2.0**n
        k += 1
    if k == 0:
        return Estimate(m, n=n)
    return Estimate(m, None, float(s[k - 1]), float(s[n - k]), n)


def quantile_key(q: float) -> str:
    """Report key of a quantile level.

    >>> [quantile_key(q) for q in (0.5, 0.9, 0.99, 0.999, 0.01)]
    ['p50', 'p90', 'p99', 'p99.9', 'p1']
    """
    return "p" + ("%g" % (q * 100))


def quantiles(x: np.ndarray, qs: Sequence[float]) -> dict[str, float]:
    """Named quantiles (linear interpolation); NaN anywhere in x gives NaN, never a quiet drop.

    >>> quantiles(np.arange(101.0), [0.5, 0.9, 0.999])
    {'p50': 50.0, 'p90': 90.0, 'p99.9': 99.9}
    """
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile level {q!r} is outside [0, 1]; pass fractions, e.g. 0.99")
    a = _as_1d(x)
    if a.size == 0:
        return {quantile_key(q): float("nan") for q in qs}
    values = np.quantile(a, np.asarray(qs, dtype=np.float64)) if len(qs) else []
    return {quantile_key(q): float(v) for q, v in zip(qs, values)}


def normal_ppf(p: float) -> float:
    """Standard normal quantile Φ⁻¹(p), from the standard library (no scipy needed).

    >>> round(normal_ppf(0.05), 6), round(normal_ppf(0.2), 6), normal_ppf(0.5)
    (-1.644854, -0.841621, 0.0)
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_ppf needs 0 < p < 1, got {p!r}")
    return NormalDist().inv_cdf(p)
