"""qval.metrics.agreement: gate-1 summaries against hand-worked values and numpy directly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qval.metrics.agreement import delta_p_summary, kld_summary, top1_summary
from qval.metrics.estimate import proportion


def test_kld_summary_hand_worked() -> None:
    # [0, 0, 0, 0.4]: mean 0.1; sample sd = sqrt((3·0.01 + 0.09)/3) = 0.2, se = 0.2/2 = 0.1.
    s = kld_summary(np.array([0.0, 0.0, 0.0, 0.4]))
    assert s["mean"].value == pytest.approx(0.1)
    assert s["mean"].stderr == pytest.approx(0.1)
    assert s["median"] == 0.0
    assert s["max"] == pytest.approx(0.4)
    assert set(s) == {"mean", "median", "p90", "p99", "p99.9", "max"}


def test_kld_summary_tail_matches_numpy() -> None:
    kld = np.random.default_rng(2).lognormal(-6, 2, size=5000)
    s = kld_summary(kld)
    for key, q in [("median", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)]:
        assert s[key] == pytest.approx(float(np.percentile(kld, q)), rel=1e-12)
    assert s["max"] == float(kld.max())
    assert s["mean"].stderr == pytest.approx(kld.std(ddof=1) / math.sqrt(kld.size), rel=1e-10)
    assert s["median"] < s["p90"] < s["p99"] < s["p99.9"] < s["max"]


def test_kld_summary_nan_and_empty_are_not_hidden() -> None:
    s = kld_summary(np.array([0.01, float("nan"), 0.02]))
    assert math.isnan(s["mean"].value) and math.isnan(s["p99"]) and math.isnan(s["max"])
    e = kld_summary(np.array([]))
    assert math.isnan(e["mean"].value) and math.isnan(e["max"]) and math.isnan(e["median"])


def test_delta_p_summary_hand_worked() -> None:
    # [-0.2, 0, 0.2]: mean 0, RMS = sqrt((0.04 + 0 + 0.04)/3) = 0.163299.
    s = delta_p_summary(np.array([-0.2, 0.0, 0.2]))
    assert s["mean"].value == pytest.approx(0.0, abs=1e-15)
    assert s["rms"] == pytest.approx(math.sqrt(0.08 / 3))
    assert set(s) == {"mean", "rms", "p1", "p99"}


def test_delta_p_summary_sees_a_negative_tail() -> None:
    rng = np.random.default_rng(3)
    dp = rng.normal(0, 0.01, size=10_000)
    dp[:300] = -0.5  # 3 % of positions lose half their probability: damage, not noise
    s = delta_p_summary(dp)
    assert s["p1"] == pytest.approx(float(np.percentile(dp, 1)))
    assert s["p99"] == pytest.approx(float(np.percentile(dp, 99)))
    assert s["p1"] == pytest.approx(-0.5)
    assert s["p99"] < 0.05
    assert s["rms"] == pytest.approx(float(np.sqrt(np.mean(dp**2))))


def test_top1_summary_is_proportion() -> None:
    flags = np.random.default_rng(4).random(999) < 0.9
    assert top1_summary(flags) == proportion(flags)
    assert top1_summary(np.array([True, True, False, True])).stderr == pytest.approx(0.25)
