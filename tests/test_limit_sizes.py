"""The size of every shipped absolute limit that is met by an interval's end (issue 29): the
probability that a healthy candidate — at the reference's level, or as noisy as a measured healthy
one — fails it. A limit that such a candidate fails 30 % of the time or more is a defect; the ones
found are listed in DEFECTS (with why) so that fixing one, or a new one, fails this test.

The measured noise and the late top-1 derivations are data: benchmarks/results/limit_derivations.json
(`noise`, each figure with its source; `late_top1`, each check file's stored runs and the figures
`python benchmarks/late_top1_healthy.py --write` derives from them). Gate 3's late top-1 (8 prompts, met by
the lower end of its 95 % interval) is sized at the level its limit was derived for — a check file's
measured healthy candidates, or (the 4-bit files) a candidate at gate 1's top-1 bar; elsewhere at the
reference's level with the measured per-prompt noise.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from benchmarks.lib import late_top1
from qval.config import load_config
from qval.metrics.thresholds import absolute_rates, paired_reject_probability

ROOT = Path(__file__).resolve().parent.parent
DEFECT = 0.30
#: (check file, check) -> why it is a defect; each must still measure ≥ DEFECT here
#: none since 2026-12-06: the 4-bit files' `min_late_top1` 0.99 (size 0.32 at a candidate at the reference's level
#: with se 0.0041, only a looping continuation met it) is re-derived at gate 1's bar
DEFECTS: dict[tuple[str, str], str] = {}
DATA = late_top1.load()
NOISE = DATA["noise"]
#: per suite: (reference accuracy, the largest discordant rate an approving shipped candidate showed)
TASKS = {k: (v["reference_accuracy"], v["discordant"]) for k, v in NOISE["tasks"].items() if k != "source"}
RETRIEVAL_MISS = NOISE["retrieval_miss"]["value"]
LATE_TOP1_SE, LATE_DRIFT_SE = NOISE["late_top1_se"]["value"], NOISE["late_drift_se"]["value"]
#: check file -> its `min_late_top1` derivation (rule, raw runs, figures)
LATE_TOP1 = DATA["late_top1"]
#: check files with format none are left out: the identity's candidate is the reference itself (no noise to size
#: against; its exact limits, 1.0 and 0.0, are met exactly), and a served engine's noise is not measured here


@functools.cache  # shipped_sizes and the derivation's own test read the same files
def derived(name: str) -> dict:
    """A check file's late top-1 level and limit, computed again from the stored runs its derivation names."""
    return late_top1.derivation(LATE_TOP1[name])


def shipped_sizes() -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for path in sorted((ROOT / "checks").glob("*.yaml")):
        cfg, name = load_config(path), path.stem
        if not cfg.quant.spec.quantizes:
            continue  # the identity's candidate is the reference (no noise); a served engine's noise is not measured here
        g = cfg.gates
        if g.longgen.enabled:
            if g.longgen.min_late_top1 is not None and not isinstance(g.longgen.min_late_top1, dict):
                lim = float(g.longgen.min_late_top1)
                if name in LATE_TOP1:
                    out[(name, "longgen/late_top1")] = late_top1.rates(derived(name), lim).size
                else:
                    out[(name, "longgen/late_top1")] = absolute_rates("min", lim, "lo", 1.0, 1.0, 1.0 - 1.96 * LATE_TOP1_SE,
                                                                      LATE_TOP1_SE).size
            if g.longgen.max_late_drift is not None:
                lim = float(g.longgen.max_late_drift)
                out[(name, "longgen/late_drift")] = absolute_rates("max", lim, "hi", 0.0, 0.0, 1.96 * LATE_DRIFT_SE,
                                                                   LATE_DRIFT_SE).size
        if g.retrieval.enabled:
            r = g.retrieval
            per = len(r.depths) * r.trials
            for length in r.lengths:
                out[(name, f"retrieval/drop@{length}")] = paired_reject_probability(per, 1.0, RETRIEVAL_MISS, 0.0, r.margin, r.alpha)
            if r.margin_overall is not None:
                out[(name, "retrieval/drop")] = paired_reject_probability(per * len(r.lengths), 1.0, RETRIEVAL_MISS, 0.0,
                                                                          r.margin_overall, r.alpha)
        if g.tasks.enabled:
            for s in g.tasks.suites:
                if s.builtin in TASKS and s.size == 40:
                    acc, flips = TASKS[s.builtin]
                    out[(name, f"tasks/drop@{s.builtin}")] = paired_reject_probability(40, acc, flips / 2, flips / 2, s.margin, s.alpha)
    return out


@pytest.fixture(scope="module")
def sizes() -> dict[tuple[str, str], float]:
    return shipped_sizes()


def test_the_defects_are_exactly_the_listed_ones(sizes: dict[tuple[str, str], float]) -> None:
    found = {k for k, p in sizes.items() if p >= DEFECT}
    table = "\n".join(f"{f:14s} {c:24s} {p:.4f}" for (f, c), p in sorted(sizes.items()))
    assert found == set(DEFECTS), f"limits a healthy candidate fails ≥ {DEFECT:.0%} of the time:\n{table}"


def test_every_shipped_bound_limit_was_sized(sizes: dict[tuple[str, str], float]) -> None:
    # the three gates with interval-bound limits, in every shipped check that enables them
    assert {c for _, c in sizes} >= {"longgen/late_top1", "longgen/late_drift", "retrieval/drop", "tasks/drop@recall"}
    assert all(0.0 <= p <= 1.0 for p in sizes.values())


def test_sizes_that_hold_today(sizes: dict[tuple[str, str], float]) -> None:
    """The figures quoted in benchmarks/RESULTS.md ("The verdict's own error rates"), to three decimals."""
    for name in ("fp8_kvfp16", "fp8_kvfp8", "int8_sq"):
        assert sizes[(name, "longgen/late_top1")] <= 0.005, name  # derived: at the measured healthy level
    for name in ("int4_awq", "w4a8_awq", "nvfp4"):
        assert round(sizes[(name, "longgen/late_top1")], 4) == 0.0041, name  # derived: at gate 1's bar
    # the limit they replaced, 0.99, at a candidate at the reference's level with issue 29's noise: the defect
    assert round(absolute_rates("min", 0.99, "lo", 1.0, 1.0, 1.0 - 1.96 * LATE_TOP1_SE, LATE_TOP1_SE).size, 2) == 0.32
    assert round(sizes[("fp8_kvfp16", "longgen/late_drift")], 3) == 0.014
    assert round(sizes[("fp8_kvfp16", "retrieval/drop@256")], 3) == 0.001  # margin 0.75 (was 0.6: 0.023)
    assert round(sizes[("fp8_kvfp16", "retrieval/drop")], 3) == 0.075
    assert round(sizes[("fp8_kvfp16", "tasks/drop@recall")], 3) == 0.038


def test_the_paired_size_against_a_simulation() -> None:
    """The exact enumeration against 20,000 simulated suites (same counts model)."""
    import numpy as np

    from qval.metrics.paired import PairedCounts, drop_upper_bound

    rng = np.random.default_rng(0)
    p = (0.5 - 0.0625, 0.0625, 0.0625, 0.5 - 0.0625)
    sims = rng.multinomial(40, p, size=20_000)
    hits = np.mean([drop_upper_bound(PairedCounts(*map(int, s))) > 0.2 for s in sims])
    exact = paired_reject_probability(40, 0.5, 0.0625, 0.0625, 0.2)
    assert abs(hits - exact) < 4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4


@pytest.mark.parametrize("name", sorted(LATE_TOP1))
def test_a_derived_late_top1_limit_is_the_one_its_measurement_gives(name: str) -> None:
    """The shipped `min_late_top1` equals what benchmarks/lib/late_top1.py derives from the stored runs the derivation
    names, which equal the figures the data file holds; a healthy candidate (at least the issue's 20 healthy runs, no
    lower end under the limit) or one at gate 1's bar (the file's own `min_top1`, from enough runs centred on it)
    fails it at most 0.5 %."""
    entry, d = LATE_TOP1[name], derived(name)
    gates = load_config(ROOT / "checks" / f"{name}.yaml").gates
    assert gates.longgen.min_late_top1 == d["limit"] == entry["limit"]
    assert {k: entry[k] for k in late_top1.FIGURES} == {k: (d[k] if k in ("n", "limit") else round(d[k], 5)) for k in late_top1.FIGURES}
    if entry["rule"] == "healthy":
        assert d["n"] >= 20, f"{name}: {d['n']} healthy runs"
        assert min(d["lo"]) >= d["limit"]
    else:
        assert gates.agreement.min_top1 == entry["bar"]
        assert d["n"] >= 10 and abs(d["gate1_top1"] - entry["bar"]) <= 0.005, (d["n"], d["gate1_top1"])
    assert late_top1.rates(d, d["limit"]).size <= 0.005


def test_the_derivations_cover_the_quantizing_files_with_a_late_top1() -> None:
    """Every shipped quantizing check file with gate 3's late top-1 has its limit's derivation in the data file."""
    names = {p.stem for p in (ROOT / "checks").glob("*.yaml")
             if (cfg := load_config(p)).quant.spec.quantizes and cfg.gates.longgen.enabled and cfg.gates.longgen.min_late_top1 is not None}
    assert names == set(LATE_TOP1)
