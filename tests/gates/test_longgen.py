"""Gate 3 bookkeeping on a tiny deterministic model (tests/gates/fakes.py), where every figure
has a closed form: positions and windows, early/late drift, collapse the reference does not
show, premature EOS, non-finite logits, and the sized thresholds against worked numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qval.config import Sized, parse_config
from qval.errors import ConfigError
from qval.gates.base import GateContext
from qval.gates.longgen.metrics import LONGGEN
from qval.gates.longgen.judge import _sized, edges, health, thresholds
from qval.gates.longgen.run import inputs, run
from qval.metrics.text import seq_rep_n
from qval.metrics.estimate import Estimate
from qval.verdict import GateResult, decide

from .fakes import EOS, HIGH, KLD_MISMATCH, LOW, FakeEngine, FakeTokenizer, collapse_after, walk

ROW = {m.key: m for m in LONGGEN.metrics}

PROMPTS = ["abcdefgh", "ijklmnop", "qrstuvwx"]  # 8 tokens each with FakeTokenizer
P = 8


def make_ctx(tmp_path: Path, candidate: FakeEngine, reference: FakeEngine | None = None, **longgen: object) -> GateContext:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "lang": "en", "kind": "story", "prompt": p}) + "\n"
                               for i, p in enumerate(PROMPTS)), encoding="utf-8")
    section = {"prompts": str(prompts), "new_tokens": 64, "window": 16, "edge": 16, "piece": 24, "batch_size": 2, **longgen}
    cfg = parse_config({"name": "lg", "quant": {"format": "none"},
                        "gates": {"agreement": {"min_top1": 0.5}, "longgen": section}}, str(tmp_path / "c.yaml"))
    return GateContext(config=cfg, reference=reference or FakeEngine(walk), candidate=candidate, tokenizer=FakeTokenizer(),
                       folder=tmp_path / "gate_longgen")


class GpuFake(FakeEngine):
    """The same model, said to be on a GPU: gate 3 scores its rows `batch_size` at a time."""

    @property
    def device(self) -> str:
        return "cuda:0"


@pytest.mark.parametrize("gpu_rows", [2, 3])
def test_rows_scored_together_give_the_figures_of_one_row_at_a_time(tmp_path: Path, gpu_rows: int) -> None:
    """Right-padded rows of different lengths (the prompts are 8, 3 and 13 tokens) through the
    same pieces: every figure and series of the one-row run, and fewer, fuller passes."""
    prompts = ["abcdefgh", "ijk", "lmnopqrstuvwx"]

    def ctx(folder: Path, ref: FakeEngine, cand: FakeEngine) -> GateContext:
        c = make_ctx(folder, cand, ref, batch_size=gpu_rows)
        (folder / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)),
                                              encoding="utf-8")
        return c

    one = run(ctx(tmp_path / "cpu", FakeEngine(walk), FakeEngine(collapse_after(P + 20))))
    ref, cand = GpuFake(walk), GpuFake(collapse_after(P + 20))
    many = run(ctx(tmp_path / "gpu", ref, cand))
    assert one.status == many.status == "ok"
    assert one.details.teacher_forced_rows == 1 and many.details.teacher_forced_rows == gpu_rows
    assert {k: v.value for k, v in one.measurements.items()} == {k: v.value for k, v in many.measurements.items()}
    assert one.details.windows == many.details.windows and one.details.per_prompt == many.details.per_prompt
    # teacher-forced passes of both models, then the reference's judge of the differing continuations
    assert max(cand.pieces_rows) == gpu_rows and len(cand.pieces_rows) == -(-3 // gpu_rows)
    assert len(ref.pieces_rows) == 2 * len(cand.pieces_rows)


def test_identical_candidate_has_exactly_zero_drift(tmp_path: Path) -> None:
    r = run(make_ctx(tmp_path, FakeEngine(walk)))
    assert r.status == "ok", r.error
    m = {k: v.value for k, v in r.measurements.items()}
    assert m == {"late_top1": 1.0, "early_top1": 1.0, "late_kld": 0.0, "early_kld": 0.0, "late_drift": 0.0, "top1_drift": 0.0,
                 "seq_rep4_excess": 0.0, "judge_nll_excess": 0.0, "loops_excess": 0.0, "tf_late_seq_rep4": 0.0}
    d = r.details
    assert [(w.start, w.end) for w in d.windows] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert all(p.first_divergence is None for p in d.per_prompt)
    assert d.ref_loops == d.cand_loops == 0  # the walk has period 120: no loop of period <= 64
    # intervals count prompts (positions of one continuation are not independent)
    assert r.measurements["late_kld"].n == 3 and d.late_positions == 3 * 16


def test_collapse_the_reference_does_not_show(tmp_path: Path) -> None:
    # the candidate follows the reference until continuation position 24 (absolute row P-1+24),
    # then loops 61 62 61 62 … ; the reference never emits 61/62, so every later position disagrees
    start = P - 1 + 24
    r = run(make_ctx(tmp_path, FakeEngine(collapse_after(start))))
    assert r.status == "ok", r.error
    m = r.measurements
    assert m["early_top1"].value == 1.0 and m["early_kld"].value == 0.0
    assert m["late_top1"].value == 0.0
    assert m["late_kld"].value == pytest.approx(KLD_MISMATCH, rel=1e-5)  # (p_hi − p_lo)·(HIGH − LOW)
    assert m["late_drift"].value == pytest.approx(KLD_MISMATCH, rel=1e-5)
    assert m["top1_drift"].value == 1.0
    # judge: the reference gives the candidate's late tokens p_lo and its own p_hi: excess HIGH − LOW nats
    assert m["judge_nll_excess"].value == pytest.approx(HIGH - LOW, rel=1e-5)
    assert m["loops_excess"].value == 3  # all three prompts end in the 2-loop; the reference in none
    late_loop = [61, 62] * 8
    ref_late = [walk_continuation(p)[48:] for p in PROMPTS]
    want = np.mean([seq_rep_n(late_loop, 4) - seq_rep_n(t, 4) for t in ref_late])
    assert seq_rep_n(late_loop, 4) == pytest.approx(1 - 2 / 13)  # 13 four-grams, 2 distinct
    assert m["seq_rep4_excess"].value == pytest.approx(want)
    w = r.details.windows
    assert [x.top1 for x in w] == [1.0, 0.5, 0.0, 0.0]  # window [16, 32) holds the switch at 24
    assert w[1].kld == pytest.approx(KLD_MISMATCH / 2, rel=1e-5)
    assert [x.cand_loops for x in w] == [0, 0, 0, 3] and all(x.ref_loops == 0 for x in w)
    assert all(p.first_divergence == 24 and p.cand_loop_period == 2 for p in r.details.per_prompt)
    cfg = make_ctx(tmp_path, FakeEngine(walk), max_late_drift=0.5, max_seq_rep4_excess=0.2, min_late_top1=0.9).config
    v = decide({"longgen": r}, thresholds(cfg, r))
    assert not v.approved
    assert {c.metric for c in v.failures} == {"late_drift", "seq_rep4_excess", "late_top1", "loops_excess"}


def walk_continuation(prompt: str, n: int = 64) -> list[int]:
    ids = FakeTokenizer()(prompt)["input_ids"]
    return FakeEngine(walk).generate([ids], n, suppress_eos=True, batch_size=1).tokens[0]


def test_premature_eos_counts_only_without_suppression(tmp_path: Path) -> None:
    def stops_at(pos_stop: int):
        return lambda token, pos: EOS if pos >= pos_stop else walk(token, pos)

    r = run(make_ctx(tmp_path, FakeEngine(stops_at(P - 1 + 20)), suppress_eos=False))
    assert r.status == "ok", r.error
    assert r.measurements["premature_eos_excess"].value == 3
    assert all(p.cand_eos_step == 20 and p.cand_tokens == 21 and p.ref_tokens == 64 for p in r.details.per_prompt)
    # the teacher-forced figures still cover the reference's whole continuation
    assert r.details.late_positions == 3 * 16
    names = [t.metric for t in thresholds(make_ctx(tmp_path, FakeEngine(walk), suppress_eos=False).config, r)]
    assert "premature_eos_excess" in names
    # with EOS suppressed the same candidate runs to full length and the figure is not measured
    r2 = run(make_ctx(tmp_path / "s", FakeEngine(stops_at(P - 1 + 20))))
    assert "premature_eos_excess" not in r2.measurements
    assert all(p.cand_tokens == 64 for p in r2.details.per_prompt)


def test_nonfinite_candidate_fails_with_the_step_named(tmp_path: Path) -> None:
    r = run(make_ctx(tmp_path, FakeEngine(walk, nan_from=P - 1 + 11)))
    assert r.status == "nonfinite"
    assert "prompt 0, step 11" in r.error
    v = decide({"longgen": r}, thresholds(make_ctx(tmp_path, FakeEngine(walk)).config, r))
    assert not v.approved


def test_edges_and_health_on_planted_sequences() -> None:
    assert edges(2048, 512) == (slice(0, 512), slice(1536, 2048))
    assert edges(100, 512) == (slice(0, 100), slice(0, 100))  # short: early and late are the whole text
    fresh = list(range(300))
    loop = list(range(40)) + [5, 6, 7] * 100
    h_fresh, h_loop = health(fresh, 100, 100, 64), health(loop, 100, 100, 64)
    assert h_fresh["seq_rep4"] == [0.0, 0.0, 0.0] and h_fresh["loop_period"] is None
    assert h_loop["loop_period"] == 3
    assert h_loop["loop"] == [None, 3, 3]  # the first window's end (100 tokens) has 60 looping tokens < span + p
    # late 100 tokens of a period-3 loop: 97 four-grams, 3 distinct
    assert h_loop["late_seq_rep4"] == pytest.approx(1 - 3 / 97)
    assert h_loop["late_distinct2"] == pytest.approx(3 / 99)


def test_sized_thresholds_worked_numbers() -> None:
    z = {"prompts": 8, "ref_late_seq_rep4_sigma": 0.2, "ref_late_nll_sigma": 0.5, "ref_loop_rate": 0.25, "ref_eos_rate": 0.0}
    s = Sized()
    # judge NLL excess, a median over prompts: the reference's own σ 0.5 × √(π/2) = 0.6266571, n = 8:
    # sqrt(2·0.6266571²/8) = 0.3133285; 1.6448536·0.3133285 = 0.5153796
    t = _sized(ROW["judge_nll_excess"], s, z)
    assert t.limit == pytest.approx(0.5153796, abs=1e-7) and t.detail["sized_from"] == "the reference's own spread × √(π/2), a median's"
    assert t.detail["sigma"] == pytest.approx(0.6266571, abs=1e-7)
    # seq-rep-4 excess: sqrt(2·0.04/8) = 0.1; threshold 0.16448536
    t = _sized(ROW["seq_rep4_excess"], s, z)
    assert t.limit == pytest.approx(0.16448536, abs=1e-7) and t.detail["sized_from"] == "the reference's own spread"
    # loops: σ = sqrt(0.25·0.75) = 0.4330127; sqrt(2·0.1875/8) = 0.21650635 (a rate); × 8 prompts:
    # threshold 8·1.6448536·0.21650635 = 2.84897, θ = 8·2.4864748·0.21650635 = 4.30670
    t = _sized(ROW["loops_excess"], s, z)
    assert t.limit == pytest.approx(2.84897, abs=1e-4) and t.min_detectable_effect == pytest.approx(4.30670, abs=1e-4)
    assert t.detectable == pytest.approx(4.30670, abs=1e-4)
    # a reference that never stops early leaves no room: the premature-EOS limit is exactly 0
    assert _sized(ROW["premature_eos_excess"], s, z).limit == 0.0
    # a single prompt cannot be sized: the check fails and says why
    bad = _sized(ROW["seq_rep4_excess"], s, {**z, "prompts": 1})
    assert math.isnan(bad.limit) and "cannot be sized" in bad.description
    # ... except a count, which falls back to the strict limit: no more loops than the reference
    one = _sized(ROW["loops_excess"], s, {**z, "prompts": 1})
    assert one.limit == 0.0 and "strict limit 0" in one.description


def test_a_sized_limit_centred_on_a_stated_healthy_figure() -> None:
    """`healthy` moves the centre, never the margin: the limit is healthy + the same 0.5153796 as around 0,
    the detectable figure moves with it, and the report's check states the centre and α there."""
    z = {"prompts": 8, "ref_late_seq_rep4_sigma": 0.2, "ref_late_nll_sigma": 0.5, "ref_loop_rate": 0.25, "ref_eos_rate": 0.0}
    at0, at_h = _sized(ROW["judge_nll_excess"], Sized(), z), _sized(ROW["judge_nll_excess"], Sized(healthy=0.05), z)
    assert at_h.limit == pytest.approx(0.05 + 0.5153796, abs=1e-7) and at_h.limit - at0.limit == pytest.approx(0.05)
    assert at_h.detectable - at0.detectable == pytest.approx(0.05) and at_h.min_detectable_effect == at0.min_detectable_effect
    assert (at_h.detail["healthy"], at_h.detail["relative_to"], at0.detail["healthy"]) == (0.05, 0.05, None)
    # a count: the centre is in prompts, the margin scaled to prompts as before
    loops = _sized(ROW["loops_excess"], Sized(healthy=1.0), z)
    assert loops.limit == pytest.approx(1.0 + 2.84897, abs=1e-4)
    res = GateResult("longgen", "ok", {"judge_nll_excess": Estimate(0.54, n=8)}, {})  # between 0.5154 and 0.5654
    c0, ch = decide({"longgen": res}, [at0]).checks[0], decide({"longgen": res}, [at_h]).checks[0]
    assert (c0.outcome, ch.outcome) == ("fail", "pass") and (c0.healthy, ch.healthy) == (None, 0.05)
    assert "around the healthy figure 0.05" in ch.size_basis and ch.size == c0.size == 0.05  # α, at the centre


def test_config_rules() -> None:
    base = {"name": "x", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}}}
    with pytest.raises(ConfigError, match="early and late parts would overlap; use edge <= 64"):
        parse_config({**base, "gates": {**base["gates"], "longgen": {"new_tokens": 128, "window": 64}}}, "x.yaml")
    with pytest.raises(ConfigError, match="max_loops_excess = 1.5: must be a whole number"):
        parse_config({**base, "gates": {**base["gates"], "longgen": {"max_loops_excess": 1.5}}}, "x.yaml")
    cfg = parse_config({**base, "gates": {**base["gates"], "longgen": {"max_judge_nll_excess": {"sized": True, "beta": 0.1}}}}, "x.yaml")
    assert cfg.gates.longgen.max_judge_nll_excess.beta == 0.1 and isinstance(cfg.gates.longgen.max_loops_excess, Sized)
    # the candidate-vs-reference figures cannot be sized: their only spread is the candidate's own
    for key in ("min_late_top1", "max_late_kld", "max_late_drift"):
        with pytest.raises(ConfigError, match=f"{key} = .*cannot be sized: the only spread it could be sized from is the candidate's own"):
            parse_config({**base, "gates": {**base["gates"], "longgen": {key: {"sized": True}}}}, "x.yaml")


def _result_with_noise(noise: float) -> Any:
    """A gate-3 result whose candidate figures spread by `noise` across 8 prompts (the reference's
    own figures, which size the health limits, stay the same)."""
    from qval.metrics import mean_estimate

    rng = np.random.default_rng(0)
    spread = rng.standard_normal(8) * noise
    m = {"late_top1": mean_estimate(0.99 - np.abs(spread)), "late_kld": mean_estimate(0.01 + np.abs(spread)),
         "late_drift": mean_estimate(spread), "seq_rep4_excess": mean_estimate(spread), "judge_nll_excess": mean_estimate(spread),
         "loops_excess": Estimate(0.0, n=8)}
    sizing = {"prompts": 8, "ref_late_seq_rep4_sigma": 0.05, "ref_late_nll_sigma": 0.1, "ref_loop_rate": 0.25, "ref_eos_rate": 0.0}
    from qval.gates.longgen.result import LonggenDetails

    # the rest of gate 3's typed details, which no threshold here reads: no prompt listed, no window
    details = LonggenDetails.model_validate({
        "prompts_file": "p.jsonl", "prompts": 8, "rendering": "raw", "new_tokens": 64, "suppress_eos": True, "window": 16,
        "edge": 16, "piece": 16, "reference_generation": {}, "candidate_generation_seconds": 0.0, "generated_side_by_side": False,
        "loop_span": 32, "loop_max_period": 64, "windows": [], "per_prompt": [], "ref_loops": 2, "cand_loops": 2,
        "ref_eos_stops": 0, "cand_eos_stops": 0, "late_positions": 128, "sizing": sizing})
    return GateResult("longgen", "ok", m, details)


def test_a_noisier_candidate_never_gets_a_looser_limit() -> None:
    """Property: for every gate-3 check, the limit does not move with the candidate's noise, and the
    side of the figure that meets it (the interval's bound for candidate-vs-reference figures)
    only gets closer to failing as the candidate gets noisier."""
    base = {"name": "x", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}, "longgen": {
        "min_late_top1": 0.9, "max_late_kld": 0.2, "max_late_drift": 0.1, "max_seq_rep4_excess": {"sized": True},
        "max_judge_nll_excess": {"sized": True}, "max_loops_excess": {"sized": True}}}}
    cfg = parse_config(base, "x.yaml")
    slack_before: dict[str, float] | None = None
    limits_before: dict[str, float] | None = None
    for noise in (0.0, 0.01, 0.03, 0.1):
        r = _result_with_noise(noise)
        ts = thresholds(cfg, r)
        limits = {t.metric: t.limit for t in ts}
        checks = {c.metric: c for c in decide({"longgen": r}, ts).checks}
        slack = {}
        for t in ts:
            c = checks[t.metric]
            met = c.value if t.on == "value" else (c.hi if t.on == "hi" else c.lo)
            slack[t.metric] = (t.limit - met) if t.op == "max" else (met - t.limit)
        if limits_before is not None:
            assert limits == limits_before  # nothing the candidate does moves a limit
            for k in ("late_top1", "late_kld", "late_drift"):  # bound-checked: noise only eats slack
                assert slack[k] <= slack_before[k] + 1e-12, (k, noise)
        limits_before, slack_before = limits, slack
    assert LOW < 0 < HIGH  # the fake model's logits have the shape the closed forms assume


def loops_after(last_tokens: tuple[int, ...], walker=walk):  # noqa: ANN001, ANN201
    """A model whose continuation of a prompt ending in one of `last_tokens` is the loop 61 62 61 …
    (from the first new token on); other prompts continue by `walker`."""
    def rule(token: int, pos: int) -> int:
        if token in (61, 62):
            return 62 if token == 61 else 61
        if pos == P - 1 and token in last_tokens:
            return 61
        return walker(token, pos)
    return rule


# the prompts' last tokens (FakeTokenizer): "h" 44, "p" 52, "x" 0
def test_late_checks_are_judged_on_the_prompts_whose_reference_does_not_loop(tmp_path: Path) -> None:
    """One prompt of three loops in the reference (and the candidate copies the loop exactly); on the
    other two the candidate collapses late. The late figures are the two natural prompts' own."""
    start = P - 1 + 24
    ref, cand = FakeEngine(loops_after((44,))), FakeEngine(loops_after((44,), collapse_after(start)))
    r = run(make_ctx(tmp_path, cand, ref))
    assert r.status == "ok", r.error
    assert r.details.loop_rule.to_dict() == {"looping_prompts": 1, "natural_prompts": [1, 2], "informative": True, "why": None}
    assert r.measurements["late_top1"].value == 0.0 and r.measurements["late_top1"].n == 2  # not 1/3 with the loop's
    cfg = make_ctx(tmp_path, FakeEngine(walk), min_late_top1=0.9, max_late_drift=0.5).config
    v = decide({"longgen": r}, thresholds(cfg, r))
    assert {c.metric for c in v.failures} >= {"late_top1", "late_drift"}


def test_late_checks_on_a_mostly_looping_reference_are_uninformative(tmp_path: Path) -> None:
    """Two prompts of three loop in the reference: the teacher-forced checks cannot see damage and say
    so beside the verdict; the decision rests on the others (here the candidate's collapse on the
    natural prompt fails seq-rep-4; the judge does not see it: this reference also continues 61 62 61 …)."""
    start = P - 1 + 24
    ref, cand = FakeEngine(loops_after((44, 52))), FakeEngine(loops_after((44, 52), collapse_after(start)))
    r = run(make_ctx(tmp_path, cand, ref))
    assert r.details.loop_rule.informative is False and r.details.loop_rule.looping_prompts == 2
    assert r.measurements["late_top1"].value == pytest.approx(2 / 3)  # every prompt, for the record
    cfg = make_ctx(tmp_path, FakeEngine(walk), min_late_top1=0.9, max_late_drift=0.5, max_seq_rep4_excess=0.2,
                   max_judge_nll_excess=1.0).config
    v = decide({"longgen": r}, thresholds(cfg, r))
    by = {c.metric: c for c in v.checks}
    assert by["late_top1"].outcome == by["late_drift"].outcome == "uninformative"
    assert "ends in a loop on 2 of 3 prompts" in by["late_top1"].reason
    assert not v.approved and "seq_rep4_excess" in {c.metric for c in v.failures}


def test_one_prompt_cannot_carry_the_judge_nll_excess(tmp_path: Path) -> None:
    """The judge-NLL figure is the median over prompts: a candidate that falls into a loop on one prompt of three
    (the reference finds its late text HIGH − LOW nats a token less likely there, as it does where a healthy
    candidate's greedy path leaves a looping reference's) moves it by nothing; on every prompt (the collapse test
    above), by HIGH − LOW. The mean would have been (HIGH − LOW) / 3."""
    def one_loop(token: int, pos: int) -> int:
        if pos == P - 1 and token == 44:  # the first prompt's last token ("h")
            return 61
        return {61: 62, 62: 61}.get(token, walk(token, pos))
    r = run(make_ctx(tmp_path, FakeEngine(one_loop)))
    assert r.status == "ok", r.error
    excess = [p.cand_late_judge_nll - p.ref_late_nll for p in r.details.per_prompt]
    assert excess[0] == pytest.approx(HIGH - LOW, rel=1e-5) and excess[1:] == [0.0, 0.0]
    assert r.measurements["judge_nll_excess"].value == 0.0 and r.measurements["loops_excess"].value == 1
    assert "median over prompts" in ROW["judge_nll_excess"].label
    # gate 3's cached result holds the figure: its cache key names the statistic, so a result cached under the mean
    # is computed again, not read back
    assert inputs(make_ctx(tmp_path / "k", FakeEngine(walk)).config)["judge"] == "judge_nll_excess: median over prompts"
