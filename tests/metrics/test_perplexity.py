"""qval.metrics.perplexity: hand-worked values and a direct per-token loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qval.metrics.perplexity import perplexity, ppl_ratio


def _loop_mean_se(x: list[float]) -> tuple[float, float]:
    """Mean and standard error, written out term by term (the independent implementation)."""
    n = len(x)
    total = 0.0
    for v in x:
        total += v
    mean = total / n
    ss = 0.0
    for v in x:
        ss += (v - mean) ** 2
    return mean, math.sqrt(ss / (n - 1)) / math.sqrt(n)


def test_perplexity_hand_worked() -> None:
    # Every token has p = 1/4 -> NLL = ln 4 -> PPL = 4, no spread.
    e = perplexity(np.full(10, math.log(4.0)))
    assert e.value == pytest.approx(4.0, rel=1e-12)
    assert e.stderr == pytest.approx(0.0, abs=1e-12)
    # NLLs ln 2 and ln 8: mean ln 4 -> PPL 4 (geometric mean of 2 and 8), not the mean PPL 5.
    assert perplexity(np.array([math.log(2.0), math.log(8.0)])).value == pytest.approx(4.0, rel=1e-12)


def test_perplexity_matches_direct_loop() -> None:
    nll = np.random.default_rng(0).gamma(2.0, 1.2, size=2000)
    m, se = _loop_mean_se(nll.tolist())
    e = perplexity(nll)
    assert e.value == pytest.approx(math.exp(m), rel=1e-10)
    assert e.stderr == pytest.approx(math.exp(m) * se, rel=1e-8)
    assert e.lo == pytest.approx(math.exp(m - 1.959964 * se), rel=1e-6)
    assert e.hi == pytest.approx(math.exp(m + 1.959964 * se), rel=1e-6)
    assert e.lo < e.value < e.hi and e.n == 2000


def test_ppl_ratio_matches_paired_loop() -> None:
    rng = np.random.default_rng(1)
    nll_r = rng.gamma(2.0, 1.2, size=3000)
    nll_c = nll_r + rng.normal(0.02, 0.05, size=3000)  # candidate slightly worse, token by token
    m, se = _loop_mean_se([c - r for c, r in zip(nll_c.tolist(), nll_r.tolist())])
    e = ppl_ratio(nll_c, nll_r)
    assert e.value == pytest.approx(math.exp(m), rel=1e-10)
    assert e.stderr == pytest.approx(math.exp(m) * se, rel=1e-8)
    assert (e.lo, e.hi) == pytest.approx((math.exp(m - 1.959964 * se), math.exp(m + 1.959964 * se)), rel=1e-6)
    # The ratio equals PPL_c / PPL_r exactly (exp of a difference of means).
    assert e.value == pytest.approx(perplexity(nll_c).value / perplexity(nll_r).value, rel=1e-10)
    # Pairing is the point: the shared token difficulty cancels, so the paired interval is far
    # tighter than the spread of either PPL on its own.
    unpaired_rel = perplexity(nll_r).stderr / perplexity(nll_r).value
    assert e.stderr / e.value < unpaired_rel / 10
    assert e.lo > 1.0  # a 2 % per-token NLL increase is resolved as a real regression


def test_ppl_ratio_identity_and_errors() -> None:
    nll = np.random.default_rng(2).gamma(2.0, 1.0, size=50)
    e = ppl_ratio(nll, nll)
    assert (e.value, e.stderr, e.lo, e.hi) == (1.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="same scored positions"):
        ppl_ratio(nll, nll[:-1])
    bad = nll.copy()
    bad[3] = float("nan")
    assert math.isnan(ppl_ratio(bad, nll).value)
    assert math.isnan(perplexity(bad).value)
