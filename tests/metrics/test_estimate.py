"""qval.metrics.estimate: hand-worked values, the standard library / scipy as independent checks."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from qval.metrics.estimate import Z95, Estimate, mean_estimate, normal_ppf, proportion, quantiles


def test_proportion_hand_worked() -> None:
    # [1,1,0,1]: p = 3/4; se = sqrt(0.75·0.25/3) = sqrt(0.0625) = 0.25;
    # interval 0.75 ± 1.96·0.25 = [0.26, 1.24] -> hi clipped to 1.
    e = proportion(np.array([1, 1, 0, 1]))
    assert e.value == pytest.approx(0.75)
    assert e.stderr == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    assert e.stderr == pytest.approx(0.25)
    assert e.lo == pytest.approx(0.75 - Z95 * 0.25)
    assert e.hi == 1.0
    assert e.n == 4


def test_proportion_edges() -> None:
    all_true = proportion(np.ones(10, dtype=bool))
    assert (all_true.value, all_true.stderr, all_true.lo, all_true.hi) == (1.0, 0.0, 1.0, 1.0)
    all_false = proportion(np.zeros(10, dtype=bool))
    assert (all_false.lo, all_false.hi) == (0.0, 0.0)
    one = proportion(np.array([True]))
    assert one.value == 1.0 and one.stderr is None and one.lo is None and one.n == 1
    empty = proportion(np.array([], dtype=bool))
    assert math.isnan(empty.value) and empty.n == 0


def test_mean_estimate_matches_statistics_module() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=257)
    e = mean_estimate(x)
    se = statistics.stdev(x.tolist()) / math.sqrt(len(x))
    assert e.value == pytest.approx(statistics.fmean(x.tolist()), rel=1e-12)
    assert e.stderr == pytest.approx(se, rel=1e-10)
    assert (e.lo, e.hi) == pytest.approx((e.value - 1.959964 * se, e.value + 1.959964 * se), rel=1e-6)
    assert e.n == 257


def test_mean_estimate_hand_worked_and_nan() -> None:
    # [1,2,3,4]: mean 2.5, sample variance (2.25+0.25+0.25+2.25)/3 = 5/3, se = sqrt(5/3)/2 = 0.645497.
    e = mean_estimate(np.array([1.0, 2.0, 3.0, 4.0]))
    assert e.value == 2.5
    assert e.stderr == pytest.approx(0.6454972244, rel=1e-9)
    # A NaN input must give a NaN estimate, never a mean of the rest.
    assert math.isnan(mean_estimate(np.array([1.0, float("nan"), 3.0])).value)
    assert mean_estimate(np.array([7.0])).stderr is None


def test_quantiles_keys_and_values() -> None:
    x = np.random.default_rng(1).exponential(size=1000)
    qs = [0.01, 0.5, 0.9, 0.99, 0.999]
    out = quantiles(x, qs)
    assert list(out) == ["p1", "p50", "p90", "p99", "p99.9"]
    for q, key in zip(qs, out):
        assert out[key] == pytest.approx(float(np.percentile(x, q * 100)), rel=1e-12)
    assert quantiles(np.arange(11.0), [0.5])["p50"] == 5.0
    assert math.isnan(quantiles(np.array([1.0, float("nan")]), [0.5])["p50"])
    assert math.isnan(quantiles(np.array([]), [0.9])["p90"])
    with pytest.raises(ValueError, match="outside"):
        quantiles(x, [99.0])


@pytest.mark.parametrize(
    "p, z",
    [(0.5, 0.0), (0.975, 1.959963985), (0.05, -1.644853627), (0.2, -0.841621234), (0.999, 3.090232306)],
)
def test_normal_ppf_table_values(p: float, z: float) -> None:
    assert normal_ppf(p) == pytest.approx(z, abs=1e-8)


def test_normal_ppf_against_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for p in np.linspace(1e-6, 1 - 1e-6, 101):
        assert normal_ppf(float(p)) == pytest.approx(float(stats.norm.ppf(p)), abs=1e-9)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5])
def test_normal_ppf_rejects_out_of_range(p: float) -> None:
    with pytest.raises(ValueError):
        normal_ppf(p)


def test_to_dict_is_json_safe_and_keeps_nan_visible() -> None:
    e = Estimate(float("nan"), float("inf"), float("-inf"), 1.0, 3)
    d = e.to_dict()
    assert d == {"value": "nan", "stderr": "inf", "lo": "-inf", "hi": 1.0, "n": 3}
    json.dumps(d, allow_nan=False)  # raises if a bare NaN slipped through


def test_to_dict_round_trip_and_numpy_coercion() -> None:
    e = Estimate(np.float32(0.5), np.float64(0.1), None, None, np.int64(7))
    assert type(e.value) is float and type(e.n) is int
    d = json.loads(json.dumps(e.to_dict(), allow_nan=False))
    assert Estimate.from_dict(d) == e
    back = Estimate.from_dict(Estimate(float("nan"), n=0).to_dict())
    assert math.isnan(back.value) and back.n == 0
