"""qval.metrics.paired: published and hand-worked values, statsmodels / scipy and brute force as checks."""

from __future__ import annotations

import doctest
import itertools
import math

import numpy as np
import pytest
import scipy.stats as stats
import statsmodels.stats.contingency_tables as contingency
import statsmodels.stats.proportion as proportion

import qval.metrics.paired as paired_module
from qval.metrics.paired import (
    PairedCounts,
    clopper_pearson,
    detectable_drop,
    drop_upper_bound,
    informative,
    mcnemar_exact,
    newcombe_paired_diff,
    noninferiority,
    paired_counts,
    wilson_interval,
)

Z95 = 1.959963984540054


def tables(max_n: int):
    """Every 2x2 table with 1 <= n <= max_n."""
    for a, b, c in itertools.product(range(max_n + 1), repeat=3):
        for d in range(max_n + 1 - a - b - c):
            if a + b + c + d:
                yield PairedCounts(a, b, c, d)


# ---- the table -------------------------------------------------------------------------------


def test_paired_counts_tally() -> None:
    ref = [True, True, True, False, False, True, False]
    cand = [True, False, True, True, False, False, False]
    c = paired_counts(ref, cand)
    assert c == PairedCounts(both=2, ref_only=2, cand_only=1, neither=2)
    assert (c.n, c.ref_correct, c.cand_correct, c.discordant) == (7, 4, 3, 3)
    assert PairedCounts(**c.to_dict()) == c
    assert paired_counts(np.array(ref), np.array(cand, dtype=np.int8)) == c  # arrays too
    assert type(paired_counts(np.array(ref), np.array(cand)).both) is int
    assert paired_counts([], []) == PairedCounts(0, 0, 0, 0)
    with pytest.raises(ValueError, match="one answer per item"):
        paired_counts([True, False], [True])
    with pytest.raises(ValueError, match="ref_only"):
        PairedCounts(1, -1, 0, 0)


# ---- single proportions ----------------------------------------------------------------------


def test_wilson_hand_worked() -> None:
    # 8/10 at 95 %: z² = 3.841459; centre = (8 + 1.920729)/13.841459 = 0.716740;
    # half = 1.959964/13.841459 · sqrt(8·2/10 + 0.960365) = 0.141601 · 1.600114 = 0.226578
    # -> (0.490162, 0.943318).
    lo, hi = wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.490162, 0.943318), abs=2e-6)
    # k = 0 and k = n: one end exactly 0 / 1, the other n/(n+z²) away from it.
    assert wilson_interval(0, 20) == (0.0, pytest.approx(Z95**2 / (20 + Z95**2), rel=1e-12))
    assert wilson_interval(20, 20) == (pytest.approx(20 / (20 + Z95**2), rel=1e-12), 1.0)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    for bad in [(3, 2, 0.95), (-1, 2, 0.95), (1, 2, 1.0), (1, 2, 0.0)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


@pytest.mark.parametrize("conf", [0.8, 0.9, 0.95, 0.99])
def test_wilson_matches_statsmodels(conf: float) -> None:
    for n in [1, 2, 5, 17, 100, 1319, 100_000]:
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            want = proportion.proportion_confint(k, n, alpha=1 - conf, method="wilson")
            assert wilson_interval(k, n, conf) == pytest.approx(want, abs=1e-12), (k, n)


def test_clopper_pearson_hand_worked() -> None:
    # k = 0: the upper end solves (1 − p)^10 = 0.025 -> 1 − 0.025^0.1 = 1 − 0.691503 = 0.308497.
    # k = 1: the lower end solves P(X >= 1) = 1 − (1 − p)^10 = 0.025 -> 1 − 0.975^0.1 = 0.002529.
    assert clopper_pearson(0, 10) == (0.0, pytest.approx(0.308497, abs=1e-6))
    assert clopper_pearson(1, 10)[0] == pytest.approx(1 - 0.975**0.1, rel=1e-10)
    assert clopper_pearson(1, 10)[0] == pytest.approx(0.002529, abs=1e-6)
    assert clopper_pearson(10, 10) == (pytest.approx(0.025**0.1, rel=1e-12), 1.0)
    assert clopper_pearson(9, 10)[1] == pytest.approx(0.975**0.1, rel=1e-10)
    assert all(math.isnan(x) for x in clopper_pearson(0, 0))
    with pytest.raises(ValueError):
        clopper_pearson(11, 10)


@pytest.mark.parametrize("conf", [0.9, 0.95, 0.99])
def test_clopper_pearson_matches_statsmodels_and_the_binomial_tails(conf: float) -> None:
    tail = (1 - conf) / 2
    for n in [1, 2, 7, 40, 1319, 100_000]:
        for k in sorted({0, 1, min(2, n), n // 4, n // 2, n - 1, n}):
            lo, hi = clopper_pearson(k, n, conf)
            want = proportion.proportion_confint(k, n, alpha=1 - conf, method="beta")
            assert (lo, hi) == pytest.approx(want, abs=1e-10), (k, n)
            # The definition, checked by scipy's binomial: each end leaves α/2 in its tail.
            if k > 0:
                assert stats.binom.sf(k - 1, n, lo) == pytest.approx(tail, rel=1e-8)
            if k < n:
                assert stats.binom.cdf(k, n, hi) == pytest.approx(tail, rel=1e-8)
            assert lo <= k / n <= hi


# ---- McNemar ---------------------------------------------------------------------------------


def test_mcnemar_hand_worked() -> None:
    # 5 flips one way, none back: 2 · 0.5^5 = 0.0625; 6: 2 · 0.5^6 = 0.03125.
    assert mcnemar_exact(PairedCounts(50, 5, 0, 10)) == pytest.approx(0.0625, rel=1e-12)
    assert mcnemar_exact(PairedCounts(50, 0, 6, 10)) == pytest.approx(0.03125, rel=1e-12)
    # 9 vs 2: 2 · (C(11,0) + C(11,1) + C(11,2)) / 2^11 = 2 · 67 / 2048.
    assert mcnemar_exact(PairedCounts(12, 9, 2, 21)) == pytest.approx(134 / 2048, rel=1e-12)
    assert mcnemar_exact(PairedCounts(12, 4, 4, 21)) == 1.0
    assert mcnemar_exact(PairedCounts(12, 0, 0, 21)) == 1.0
    assert mcnemar_exact(PairedCounts(0, 0, 0, 0)) == 1.0


def test_mcnemar_matches_statsmodels_and_scipy() -> None:
    pairs = list(itertools.product(range(25), repeat=2)) + [(300, 250), (1000, 1100), (4000, 3800), (60, 5)]
    for b, c in pairs:
        p = mcnemar_exact(PairedCounts(7, b, c, 3))
        if b + c == 0:
            assert p == 1.0
            continue
        sm = contingency.mcnemar(np.array([[7, b], [c, 3]]), exact=True).pvalue
        sp = stats.binomtest(b, b + c, 0.5).pvalue
        assert p == pytest.approx(sm, rel=1e-9, abs=1e-300), (b, c)
        assert p == pytest.approx(sp, rel=1e-6, abs=1e-300), (b, c)  # scipy's own tolerance is 1e-7
        assert p == mcnemar_exact(PairedCounts(0, c, b, 0))  # symmetric; the concordant cells are ignored


# ---- Newcombe --------------------------------------------------------------------------------


def brute_newcombe(c: PairedCounts, conf: float) -> tuple[float, float, float]:
    """Method 10 from the item vectors: Wilson limits as the roots of the score equation
    (p̂ − p)² = z²p(1 − p)/n, φ from the moments of the two 0/1 vectors. Newcombe's correction
    A − n/2 (A = ad − bc = n²·cov) becomes r − 1/(2n·s1·s2) (√den = n²·s1·s2)."""
    ref = np.array([1] * c.both + [1] * c.ref_only + [0] * c.cand_only + [0] * c.neither, dtype=float)
    cand = np.array([1] * c.both + [0] * c.ref_only + [1] * c.cand_only + [0] * c.neither, dtype=float)
    n = ref.size
    z = stats.norm.ppf(0.5 + conf / 2)

    def wilson(x: np.ndarray) -> tuple[float, float, float]:
        ph = x.mean()
        roots = np.roots([1 + z * z / n, -(2 * ph + z * z / n), ph * ph]).real
        return ph, max(0.0, roots.min()), min(1.0, roots.max())

    (p1, l1, u1), (p2, l2, u2) = wilson(ref), wilson(cand)
    s1, s2 = ref.std(), cand.std()
    if s1 * s2 == 0:
        phi = 0.0
    else:
        r = float(np.mean((ref - p1) * (cand - p2)) / (s1 * s2))
        shrink = 1 / (2 * n * s1 * s2)
        phi = r - shrink if r > shrink else (0.0 if r >= 0 else r)
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return d, lo, hi


def test_newcombe_published_examples() -> None:
    # Newcombe (1998), Stat Med 17:2635, worked example: 12 both, 9 first only, 2 second only, 21
    # neither; θ = 7/44 = 0.1591, method 10: 0.0112 to 0.2954. (The brief quoted 0.0017 to 0.3232;
    # this code does not give that, nor does the uncorrected-phi variant, which gives 0.0182 to
    # 0.2892: the test pins the published figures, and so fails if the phi correction is dropped.)
    d, lo, hi = newcombe_paired_diff(PairedCounts(both=12, ref_only=9, cand_only=2, neither=21))
    assert d == pytest.approx(7 / 44, rel=1e-12)
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (0.1591, 0.0112, 0.2954)
    # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), ch. 8
    # (Cavo et al. 2012: 59, 6, 16, 80): estimate −0.0621, 95 % CI −0.1186 to −0.0046.
    d, lo, hi = newcombe_paired_diff(PairedCounts(59, 6, 16, 80))
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (-0.0621, -0.1186, -0.0046)


@pytest.mark.parametrize("conf", [0.9, 0.95])
def test_newcombe_matches_brute_force(conf: float) -> None:
    rng = np.random.default_rng(7)
    cases = list(tables(9)) + [PairedCounts(*rng.integers(0, 400, size=4)) for _ in range(200)]
    for c in cases:
        got = newcombe_paired_diff(c, conf)
        assert got == pytest.approx(brute_newcombe(c, conf), abs=1e-9), c
        assert -1.0 <= got[1] <= got[0] <= got[2] <= 1.0, c


def test_identical_models() -> None:
    # No discordant pairs: drop exactly 0; φ* = (ad − n/2)/(ad) = 1 − n/(2ad), so with x = p − l,
    # y = u − p both half-widths are sqrt((x − y)² + (n/(ad))·x·y): the interval is symmetric.
    c = PairedCounts(both=9000, ref_only=0, cand_only=0, neither=1000)
    d, lo, hi = newcombe_paired_diff(c)
    l, u = wilson_interval(9000, 10_000)
    x, y = 0.9 - l, u - 0.9
    half = math.sqrt((x - y) ** 2 + 10_000 / (9000 * 1000) * x * y)
    assert d == 0.0
    assert (lo, hi) == pytest.approx((-half, half), rel=1e-9)
    assert 0 < hi < 0.0015
    assert mcnemar_exact(c) == 1.0
    r = noninferiority(c, margin=0.01)
    assert r["passed"] and r["drop"] == 0.0 and r["mcnemar_p"] == 1.0 and r["flip_rate"] == 0.0
    # Small n with the same table shape is honestly uncertain and does not pass a tight margin.
    assert not noninferiority(PairedCounts(9, 0, 0, 1), margin=0.01)["passed"]


def test_all_right_and_all_wrong() -> None:
    # All right for both: a margin is empty, φ* = 0, and the drop's half-width is 1 − l = z²/(n + z²).
    for c in (PairedCounts(20, 0, 0, 0), PairedCounts(0, 0, 0, 20)):
        d, lo, hi = newcombe_paired_diff(c)
        half = Z95**2 / (20 + Z95**2)
        assert (d, lo, hi) == (0.0, pytest.approx(-half, rel=1e-12), pytest.approx(half, rel=1e-12))
        assert mcnemar_exact(c) == 1.0
    # Candidate wrong on everything the reference got right: the drop is 1 and the bound reaches 1.
    d, lo, hi = newcombe_paired_diff(PairedCounts(0, 20, 0, 0))
    assert d == 1.0 and hi == pytest.approx(1.0, abs=1e-12) and 0.5 < lo < 1.0
    assert mcnemar_exact(PairedCounts(0, 20, 0, 0)) == pytest.approx(2 * 0.5**20, rel=1e-12)


def test_more_flips_never_lower_the_upper_bound() -> None:
    # A right->wrong flip of the candidate moves an item both -> ref_only or cand_only -> neither.
    for c in tables(16):
        u = drop_upper_bound(c)
        if c.both:
            lost_shared = PairedCounts(c.both - 1, c.ref_only + 1, c.cand_only, c.neither)
            assert drop_upper_bound(lost_shared) >= u - 1e-12, c
        if c.cand_only:
            lost_own = PairedCounts(c.both, c.ref_only, c.cand_only - 1, c.neither + 1)
            assert drop_upper_bound(lost_own) >= u - 1e-12, c


def test_drop_upper_bound_is_the_two_sided_interval_at_one_minus_two_alpha() -> None:
    c = PairedCounts(12, 9, 2, 21)
    assert drop_upper_bound(c) == newcombe_paired_diff(c, 0.90)[2]
    assert drop_upper_bound(c, alpha=0.025) == newcombe_paired_diff(c, 0.95)[2] == pytest.approx(0.2954, abs=5e-5)
    assert drop_upper_bound(c) < drop_upper_bound(c, alpha=0.01)
    assert math.isnan(drop_upper_bound(PairedCounts(0, 0, 0, 0)))
    with pytest.raises(ValueError):
        drop_upper_bound(c, alpha=0.5)


# ---- power -----------------------------------------------------------------------------------


def mcnemar_z_power(n: int, psi: float, drop: float, alpha: float) -> float:
    """Exact power of the one-sided test (b − c)/sqrt(b + c) > z_{1−α}: the discordant count
    m ~ Bin(n, ψ), and given m the net-loss count b ~ Bin(m, (ψ + δ)/(2ψ))."""
    z = stats.norm.ppf(1 - alpha)
    m = np.arange(1, n + 1)
    threshold = np.floor((m + z * np.sqrt(m)) / 2)  # reject when b > (m + z·sqrt(m))/2
    return float(np.sum(stats.binom.pmf(m, n, psi) * stats.binom.sf(threshold, m, (psi + drop) / (2 * psi))))


def test_detectable_drop_hand_worked_and_scaling() -> None:
    # n 1000, ψ 0.1: (1.6448536 + 0.8416212) · sqrt(0.1/1000) = 2.4864748 · 0.01 = 0.0248647.
    assert detectable_drop(1000, 0.1) == pytest.approx(0.0248647, abs=1e-7)
    assert detectable_drop(4000, 0.1) == pytest.approx(detectable_drop(1000, 0.1) / 2, rel=1e-12)
    assert detectable_drop(1000, 0.0) == 0.0
    assert math.isnan(detectable_drop(0, 0.1))
    for bad in [(-1, 0.1), (10, 1.5), (10, -0.1)]:
        with pytest.raises(ValueError):
            detectable_drop(*bad)
    with pytest.raises(ValueError):
        detectable_drop(10, 0.1, alpha=0.0)


@pytest.mark.parametrize(
    "n, psi, alpha, beta", [(2000, 0.1, 0.05, 0.2), (500, 0.2, 0.05, 0.2), (3000, 0.05, 0.025, 0.1)]
)
def test_detectable_drop_has_the_power_it_claims(n: int, psi: float, alpha: float, beta: float) -> None:
    delta = detectable_drop(n, psi, alpha, beta)
    assert mcnemar_z_power(n, psi, delta, alpha) == pytest.approx(1 - beta, abs=0.015)
    assert mcnemar_z_power(n, psi, delta / 2, alpha) < 1 - beta - 0.2  # half of it is missed far more


# ---- the verdict -----------------------------------------------------------------------------

KEYS = {
    "drop", "lo", "hi", "upper", "margin", "passed", "detectable_drop", "mcnemar_p", "flip_rate", "flip_interval",
    "net_loss", "net_loss_interval", "ref_accuracy", "ref_interval", "cand_accuracy", "cand_interval", "n",
}


def test_noninferiority_report() -> None:
    c = PairedCounts(both=np.int64(900), ref_only=10, cand_only=8, neither=82)
    r = noninferiority(c, margin=0.02)
    assert set(r) == KEYS
    assert r["drop"] == pytest.approx(0.002) and (r["lo"], r["hi"]) == newcombe_paired_diff(c, 0.9)[1:]
    assert r["upper"] == r["hi"] == drop_upper_bound(c) and r["hi"] < 0.02 and r["passed"] is True
    assert r["detectable_drop"] == detectable_drop(1000, 18 / 1000)
    assert r["mcnemar_p"] == pytest.approx(contingency.mcnemar([[900, 10], [8, 82]], exact=True).pvalue, rel=1e-9)
    assert r["flip_rate"] == 0.018 and r["flip_interval"] == clopper_pearson(18, 1000)
    assert r["net_loss"] == 10 and r["net_loss_interval"] == clopper_pearson(10, 1000)
    assert r["ref_accuracy"] == 0.91 and r["ref_interval"] == wilson_interval(910, 1000)
    assert r["cand_accuracy"] == 0.908 and r["cand_interval"] == wilson_interval(908, 1000)
    assert r["n"] == 1000 and type(r["n"]) is int and type(r["net_loss"]) is int
    for key in KEYS - {"passed", "n", "net_loss"}:
        values = r[key] if isinstance(r[key], tuple) else (r[key],)
        assert all(type(v) is float for v in values), key
    # The margin decides: the same table fails a margin below its upper bound.
    assert noninferiority(c, margin=r["hi"] - 1e-9)["passed"] is False
    assert noninferiority(c, margin=r["hi"])["passed"] is True
    # No flips at all: the detectable drop is floored at one flip in n.
    assert noninferiority(PairedCounts(90, 0, 0, 10), 0.1)["detectable_drop"] == detectable_drop(100, 0.01)


def test_noninferiority_empty_never_raises() -> None:
    r = noninferiority(PairedCounts(0, 0, 0, 0), margin=0.02)
    assert set(r) == KEYS and r["passed"] is False and r["n"] == 0 and r["margin"] == 0.02
    for key in KEYS - {"passed", "n", "net_loss", "margin"}:
        values = r[key] if isinstance(r[key], tuple) else (r[key],)
        assert all(math.isnan(v) for v in values), key


def test_informative() -> None:
    # 30/100 at 90 %: z = 1.644854, z² = 2.705543; centre (30 + 1.352772)/102.705543 = 0.305270,
    # half 1.644854/102.705543 · sqrt(21 + 0.676386) = 0.016015 · 4.655791 = 0.074564 -> lo 0.230706.
    assert wilson_interval(30, 100, 0.9)[0] == pytest.approx(0.230706, abs=2e-6)
    assert informative(30, 100, 0.25) is False and informative(30, 100, 0.2) is True
    assert informative(0, 0, 0.25) is False
    grid = [(k, n, ch) for n in (10, 57, 400) for k in range(0, n + 1, max(1, n // 9)) for ch in (0.0, 0.25, 0.5)]
    for k, n, chance in grid:
        lo90 = proportion.proportion_confint(k, n, alpha=0.1, method="wilson")[0]
        assert informative(k, n, chance) == (lo90 > chance), (k, n, chance)
    assert informative(0, 10, 0.0) is False  # a lower bound of exactly 0 is not above a chance of 0


def test_docstring_examples() -> None:
    result = doctest.testmod(paired_module)
    assert result.attempted > 0 and result.failed == 0


def test_mean_noninferiority_is_statsmodels_z_interval_of_the_paired_differences() -> None:
    from statsmodels.stats.weightstats import DescrStatsW

    from qval.metrics.paired import mean_noninferiority

    rng = np.random.default_rng(3)
    ref = rng.uniform(0, 1, 57)
    cand = ref - rng.normal(0.02, 0.1, 57)
    for alpha in (0.05, 0.1):
        r = mean_noninferiority(ref, cand, margin=0.05, alpha=alpha)
        lo, hi = DescrStatsW(ref - cand).zconfint_mean(alpha=2 * alpha)
        assert (r["lo"], r["hi"]) == pytest.approx((lo, hi), abs=1e-12) and r["passed"] == (hi <= 0.05)
        z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(0.8)
        assert r["detectable_drop"] == pytest.approx(z * np.std(ref - cand, ddof=1) / math.sqrt(57))
    lower = mean_noninferiority(ref, cand, margin=0.05, higher_is_better=False)  # a lower score is better: the drop flips sign
    assert lower["drop"] == pytest.approx(-mean_noninferiority(ref, cand, margin=0.05)["drop"])
    assert math.isnan(mean_noninferiority([0.5], [0.4], margin=0.1)["hi"]) and not mean_noninferiority([0.5], [0.4], margin=0.1)["passed"]


def test_loglik_noninferiority_is_the_log_perplexity_ratio_and_the_mean_rule_at_unit_weights() -> None:
    from qval.metrics.paired import loglik_noninferiority, mean_noninferiority

    rng = np.random.default_rng(4)
    words = rng.integers(20, 200, 30).astype(float)
    ref = -words * rng.uniform(2.0, 3.0, 30)
    cand = ref - words * rng.uniform(0.0, 0.1, 30)
    r = loglik_noninferiority(ref, cand, words, margin=0.1)
    assert r["drop"] == pytest.approx(math.log(r["cand_ppl"] / r["ref_ppl"]))
    assert r["ref_ppl"] == pytest.approx(math.exp(-ref.sum() / words.sum())) and r["weight"] == words.sum()
    bits = loglik_noninferiority(ref, cand, words, margin=0.1, scale=1 / math.log(2))
    assert bits["drop"] == pytest.approx(r["cand_bpb"] - r["ref_bpb"]) and bits["stderr"] == pytest.approx(r["stderr"] / math.log(2))
    ones = np.ones(30)
    a, b = loglik_noninferiority(ref, cand, ones, margin=0.1), mean_noninferiority(ref, cand, margin=0.1)
    assert (a["drop"], a["stderr"], a["hi"]) == pytest.approx((b["drop"], b["stderr"], b["hi"]), rel=1e-12)
    assert not loglik_noninferiority([], [], [], margin=0.1)["passed"]
