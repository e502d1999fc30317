"""qval.metrics.thresholds: the sizing formula against worked numbers, and its meaning."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from qval.metrics.thresholds import Sizing, sized_threshold


def test_worked_example_higher_is_better() -> None:
    # ref 0.9, σ 0.3, n 100: sqrt(2·0.09/100) = sqrt(0.0018) = 0.0424264;
    # Φ⁻¹(0.05) = −1.6448536 -> threshold = 0.9 − 1.6448536·0.0424264 = 0.9 − 0.0697852 = 0.8302148;
    # Φ⁻¹(0.2) = −0.8416212 -> θ = (1.6448536 + 0.8416212)·0.0424264 = 2.4864748·0.0424264 = 0.1054922.
    t = sized_threshold(0.9, 0.3, 100)
    assert t.threshold == pytest.approx(0.8302148, abs=1e-6)
    assert t.min_detectable_effect == pytest.approx(0.1054922, abs=1e-6)
    assert t == Sizing(t.threshold, t.min_detectable_effect, 0.9, 0.3, 100, 0.05, 0.2, True)


def test_lower_is_better_is_an_upper_bound() -> None:
    t = sized_threshold(0.9, 0.3, 100, higher_is_better=False)
    assert t.threshold == pytest.approx(0.9 + 0.0697852, abs=1e-6)
    assert t.min_detectable_effect == pytest.approx(0.1054922, abs=1e-6)
    assert not t.higher_is_better


def test_zero_sigma_and_scaling_with_n() -> None:
    t = sized_threshold(68.17, 0.0, 1000)
    assert (t.threshold, t.min_detectable_effect) == (68.17, 0.0)
    # Quadrupling n halves the margin and θ.
    a, b = sized_threshold(0.5, 0.5, 100), sized_threshold(0.5, 0.5, 400)
    assert (0.5 - b.threshold) == pytest.approx((0.5 - a.threshold) / 2)
    assert b.min_detectable_effect == pytest.approx(a.min_detectable_effect / 2)


@pytest.mark.parametrize("alpha, beta", [(0.05, 0.2), (0.01, 0.1), (0.1, 0.3)])
def test_error_rates_mean_what_they_say(alpha: float, beta: float) -> None:
    # Observed candidate − reference difference ~ N(true effect, s), s = sqrt(2σ²/n).
    t = sized_threshold(0.7, 0.4, 250, alpha=alpha, beta=beta)
    s = math.sqrt(2 * 0.4**2 / 250)
    # A candidate exactly as good as the reference is rejected with probability α ...
    assert NormalDist(0.7, s).cdf(t.threshold) == pytest.approx(alpha, rel=1e-9)
    # ... and one that is worse by θ is caught with probability 1 − β.
    assert NormalDist(0.7 - t.min_detectable_effect, s).cdf(t.threshold) == pytest.approx(1 - beta, rel=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n": 1}, "n >= 2"),
        ({"n": 10.5}, "n >= 2"),
        ({"sigma": -0.1}, "sigma"),
        ({"sigma": float("nan")}, "sigma"),
        ({"ref_value": float("nan")}, "reference value"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 0.5}, "alpha"),
        ({"beta": 0.0}, "beta"),
        ({"beta": 0.7}, "beta"),
    ],
)
def test_invalid_inputs_raise(kwargs: dict, match: str) -> None:
    args = {"ref_value": 0.9, "sigma": 0.3, "n": 100} | kwargs
    ref_value, sigma, n = args.pop("ref_value"), args.pop("sigma"), args.pop("n")
    with pytest.raises(ValueError, match=match):
        sized_threshold(ref_value, sigma, n, **args)
