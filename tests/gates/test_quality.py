"""Gate 2 (perplexity, BLEU/chrF) without a model: windows, paired figures against direct
loops, scores against sacrebleu's own, and sized thresholds against worked numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from qval.config import Sized, parse_config
from qval.errors import ConfigError, DataError
from qval.gates.base import GateContext
from qval.gates.quality.metrics import QUALITY
from qval.gates.quality.run import _positions, bleu_records, paired_bootstrap_drop, score_language, sliding_windows
from qval.gates.quality.judge import _sized_drop, _sized_ppl, perplexity_part, thresholds
from qval.verdict import GateResult, decide

REFS = ["The train leaves at eight o'clock.", "I forgot my umbrella at home.", "My sister works in a hospital.",
        "It is very cold this morning.", "We bought bread and cheese.", "The library is closed on Mondays."]
REF_HYPS = ["The train leaves at 8 o'clock.", "I forgot my umbrella at home.", "My sister works at a hospital.",
            "It is very cold this morning.", "We bought some bread and cheese.", "The library closes on Monday."]
CAND_HYPS = ["The train part at eight.", "I forgot umbrella home.", "My sister works in a hospital.",
             "It is cold.", "We buy bread.", "Library is closed Mondays."]


def test_sliding_windows_hand_worked_and_cover_every_token_once() -> None:
    # 10 tokens, window 4, stride 2: HF's loop reads [0,4) scoring 4, then [2,6) scoring the last 2, ...
    assert sliding_windows(10, 4, 2) == [(0, 4, 4), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
    assert sliding_windows(9, 4, 4) == [(0, 4, 4), (4, 8, 4), (8, 9, 1)]
    for n, w, s in [(1000, 512, 256), (777, 128, 100), (512, 512, 512), (5, 8, 3)]:
        scored = []
        for begin, end, k in sliding_windows(n, w, s):
            assert end - begin <= w and 0 < k <= end - begin
            scored.extend(range(end - k, end))
        assert scored == list(range(n))  # every token exactly once, in order


def test_sliding_windows_match_the_hf_loop() -> None:
    """The loop from the transformers perplexity guide, written out: targets outside the last
    trg_len positions are masked with -100."""
    n, window, stride = 1000, 256, 100
    hf = []
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        trg_len = end - prev_end
        labels = list(range(begin, end))
        labels[:-trg_len] = [-100] * (len(labels) - trg_len)
        hf.append([t for t in labels if t != -100])
        prev_end = end
        if end == n:
            break
    mine = [list(range(end - k, end)) for begin, end, k in sliding_windows(n, window, stride)]
    assert mine == hf


def test_perplexity_part_against_a_direct_loop() -> None:
    rng = np.random.default_rng(1)
    nll_ref = rng.gamma(2.0, 1.5, size=500)
    nll_cand = nll_ref + rng.normal(0.03, 0.2, size=500)
    m, d = perplexity_part(nll_ref, nll_cand)
    n = len(nll_ref)
    mean_r = sum(nll_ref) / n
    mean_c = sum(nll_cand) / n
    diffs = [c - r for c, r in zip(nll_cand, nll_ref)]
    mean_d = sum(diffs) / n
    sd_d = math.sqrt(sum((x - mean_d) ** 2 for x in diffs) / (n - 1))
    assert m["ppl_ref"].value == pytest.approx(math.exp(mean_r), rel=1e-12)
    assert m["ppl_cand"].value == pytest.approx(math.exp(mean_c), rel=1e-12)
    assert m["ppl_ratio"].value == pytest.approx(math.exp(mean_d), rel=1e-12)
    assert m["ppl_ratio"].value == pytest.approx(m["ppl_cand"].value / m["ppl_ref"].value, rel=1e-12)
    # the ratio's interval comes from the paired differences: exp(mean ± 1.96·sd/√n)
    se = sd_d / math.sqrt(n)
    assert m["ppl_ratio"].lo == pytest.approx(math.exp(mean_d - 1.959963984540054 * se), rel=1e-9)
    assert m["ppl_ratio"].hi == pytest.approx(math.exp(mean_d + 1.959963984540054 * se), rel=1e-9)
    assert d["sigma_nll_diff"] == pytest.approx(sd_d, rel=1e-9) and d["positions"] == n
    # pairing is what makes it tight: far narrower than from two independent PPL intervals
    assert (m["ppl_ratio"].hi - m["ppl_ratio"].lo) < 0.2 * (m["ppl_cand"].hi - m["ppl_cand"].lo) / m["ppl_ref"].value


def test_paired_bootstrap_drop_value_is_sacrebleus_own_difference() -> None:
    for tok in ("13a", "zh"):
        metric = BLEU(tokenize=tok)
        e = paired_bootstrap_drop(metric, REFS, REF_HYPS, CAND_HYPS, resamples=300, seed=0)
        want = BLEU(tokenize=tok).corpus_score(REF_HYPS, [REFS]).score - BLEU(tokenize=tok).corpus_score(CAND_HYPS, [REFS]).score
        assert e.value == pytest.approx(want, abs=1e-9)
        assert e.stderr > 0 and e.lo < e.value < e.hi and e.n == len(REFS)
    e = paired_bootstrap_drop(CHRF(), REFS, REF_HYPS, CAND_HYPS, resamples=300, seed=0)
    assert e.value == pytest.approx(CHRF().corpus_score(REF_HYPS, [REFS]).score - CHRF().corpus_score(CAND_HYPS, [REFS]).score)
    # the same system twice: every resample's drop is exactly zero
    same = paired_bootstrap_drop(BLEU(), REFS, REF_HYPS, REF_HYPS, resamples=200, seed=3)
    assert (same.value, same.stderr, same.lo, same.hi) == (0.0, 0.0, 0.0, 0.0)


def test_score_language_equals_sacrebleu_with_the_language_tokenizer() -> None:
    zh_refs = ["请关门。", "他正在图书馆看书。", "这个苹果很甜。", "今天很热。"]
    zh_ref_hyps = ["请把门关上。", "他在图书馆看书。", "这个苹果很甜。", "今天非常热。"]
    zh_cand = ["关门。", "他在看书。", "苹果甜。", "今天热。"]
    s = score_language("zh-CN", zh_refs, zh_ref_hyps, zh_cand, resamples=200, seed=0)
    assert s.key == "zh_cn" and s.sentences == 4
    assert s.scores["bleu_ref"] == BLEU(tokenize="zh").corpus_score(zh_ref_hyps, [zh_refs]).score
    assert s.scores["bleu_cand"] == BLEU(tokenize="zh").corpus_score(zh_cand, [zh_refs]).score
    assert s.scores["bleu_cand_vs_ref"] == BLEU(tokenize="zh").corpus_score(zh_cand, [zh_ref_hyps]).score
    assert s.scores["chrf_cand"] == CHRF().corpus_score(zh_cand, [zh_refs]).score
    assert "tok:zh" in s.signatures["bleu"] and s.signatures["chrf"].startswith("nrefs:1")
    assert s.drops["bleu"].value == pytest.approx(s.scores["bleu_ref"] - s.scores["bleu_cand"])
    # σ is the per-sentence spread of the reference's own scores (effective order, as sacrebleu advises)
    per = [BLEU(tokenize="zh", effective_order=True).sentence_score(h, [r]).score for h, r in zip(zh_ref_hyps, zh_refs)]
    assert s.sentence_sigma["bleu"] == pytest.approx(float(np.std(per, ddof=1)))
    en = score_language("en", REFS, REF_HYPS, CAND_HYPS, resamples=200, seed=0)
    assert "tok:13a" in en.signatures["bleu"] and en.drops["bleu"].value > 0


def _result(given: dict) -> GateResult:
    """A finished gate 2 whose details hold `given`'s figures (the σ and n a sized limit reads), the rest
    of its typed details filled with placeholders that no threshold reads."""
    from qval.metrics.estimate import Estimate
    from qval.gates.quality.result import QualityDetails

    est = Estimate(0.0, n=1).to_dict()
    ppl = {"windowing": "chunks", "dataset": "d", "description": "t", "positions": 1, "mean_nll_ref": est,
           "mean_nll_cand": est, "mean_nll_diff": est, "sigma_nll_diff": 0.0, **given.get("ppl", {})}
    groups = {k: {"lang": k, "sentences": 1, **dict.fromkeys(("bleu_ref", "bleu_cand", "bleu_cand_vs_ref", "chrf_ref", "chrf_cand",
                                                             "chrf_cand_vs_ref", "bleu_sentence_sigma", "chrf_sentence_sigma"), 0.0),
                  "bleu_drop": est, "chrf_drop": est, "signatures": {}, **g} for k, g in given.get("bleu", {}).get("groups", {}).items()}
    bleu = {"dataset": "b", "prompts": 1, "rendering": "raw", "max_new_tokens": 1, "decoding": "greedy",
            "reference_generation": {}, "groups": groups}
    details = QualityDetails.model_validate({"ppl": ppl, "bleu": bleu})
    return GateResult("quality", "ok", {"ppl_ratio": Estimate(1.002, n=10000), "bleu_drop_en": Estimate(4.0, n=24),
                                        "bleu_drop_zh": Estimate(12.0, n=16)}, details)


def test_sized_ppl_ratio_worked_numbers() -> None:
    # σ_d = 0.2, n = 10000: paired noise σ_d/√n = 0.002; |Φ⁻¹(0.05)| = 1.6448536
    # threshold = exp(1.6448536 · 0.002) = exp(0.0032897) = 1.0032951
    # θ (log) = (1.6448536 + 0.8416212) · 0.002 = 0.0049729 -> relative PPL increase exp(θ) − 1 = 0.0049853
    t = _sized_ppl(Sized(), _result({"ppl": {"sigma_nll_diff": 0.2, "positions": 10000}}))
    assert t.limit == pytest.approx(1.0032951, abs=1e-6)
    assert t.min_detectable_effect == pytest.approx(0.0049853, abs=1e-6)
    assert t.detectable == pytest.approx(1.0049853, abs=1e-6)  # the ratio it detects, not the increase
    assert t.source == "sized" and t.op == "max"
    # a bit-identical candidate has σ_d = 0: the limit is exactly 1 and ratio 1.0 passes it
    assert _sized_ppl(Sized(), _result({"ppl": {"sigma_nll_diff": 0.0, "positions": 50}})).limit == 1.0


def test_sized_bleu_drop_worked_numbers() -> None:
    # σ = 20 BLEU, n = 24 sentences: sqrt(2·400/24) = 5.7735027
    # threshold = 1.6448536 · 5.7735027 = 9.4966; θ = 2.4864748 · 5.7735027 = 14.3557
    res = _result({"bleu": {"groups": {"en": {"bleu_sentence_sigma": 20.0, "sentences": 24}}}})
    t = _sized_drop(QUALITY.by_field("max_bleu_drop"), "en", Sized(), res, "drop")
    assert t.limit == pytest.approx(9.4966, abs=1e-4)
    assert t.min_detectable_effect == pytest.approx(14.3557, abs=1e-4)
    assert t.detectable == pytest.approx(14.3557, abs=1e-4)
    looser = _sized_drop(QUALITY.by_field("max_bleu_drop"), "en", Sized(alpha=0.01), res, "drop")
    assert looser.limit > t.limit  # a smaller false-reject rate widens the threshold


def test_sized_quality_limits_centred_on_a_stated_healthy_figure() -> None:
    # the PPL ratio: healthy 1.02 multiplies the sized factor (1.0032951 around 1); a drop adds to it (9.4966 around 0)
    ppl = _sized_ppl(Sized(healthy=1.02), _result({"ppl": {"sigma_nll_diff": 0.2, "positions": 10000}}))
    assert ppl.limit == pytest.approx(1.02 * 1.0032951, abs=1e-6) and ppl.detectable == pytest.approx(1.02 * 1.0049853, abs=1e-6)
    assert ppl.detail["healthy"] == 1.02
    res = _result({"bleu": {"groups": {"en": {"bleu_sentence_sigma": 20.0, "sentences": 24}}}})
    drop = _sized_drop(QUALITY.by_field("max_bleu_drop"), "en", Sized(healthy=2.0), res, "drop")
    assert drop.limit == pytest.approx(11.4966, abs=1e-4) and drop.detectable == pytest.approx(16.3557, abs=1e-4)
    # a centre below the reference's own level (a ratio under 1, a negative drop) is refused, with the range
    for field, bad, lo in (("max_ppl_ratio", 0.99, "1"), ("max_bleu_drop", -1.0, "0")):
        with pytest.raises(ConfigError, match=rf"max_{field[4:]} = .*healthy must be a number in \[{lo}, "):
            _cfg(**{field: {"sized": True, "healthy": bad}})
    with pytest.raises(ConfigError, match=r"max_chrf_drop\.healthy = True: a boolean .* is not a number here"):
        _cfg(max_chrf_drop={"sized": True, "healthy": True})


def _cfg(**quality) -> object:
    return parse_config({"name": "q", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}, "quality": quality}}, "q.yaml")


def test_thresholds_per_language_and_verdict() -> None:
    cfg = _cfg(max_ppl_ratio=1.01, max_bleu_drop=5.0)
    res = _result({"ppl": {"sigma_nll_diff": 0.2, "positions": 10000},
                   "bleu": {"groups": {"en": {"bleu_sentence_sigma": 20.0, "sentences": 24},
                                       "zh": {"bleu_sentence_sigma": 10.0, "sentences": 16}}}})
    ts = thresholds(cfg, res)
    assert [(t.metric, t.limit) for t in ts] == [("ppl_ratio", 1.01), ("bleu_drop_en", 5.0), ("bleu_drop_zh", 5.0)]
    v = decide({"quality": res}, ts)
    assert not v.approved and [c.metric for c in v.failures] == ["bleu_drop_zh"]  # 12 > 5; en's 4 passes
    # the gate did not run: every configured figure is a failed check, never a silent pass
    v = decide({}, thresholds(cfg, None))
    assert not v.approved and {c.metric for c in v.failures} == {"ppl_ratio", "bleu_drop"}
    # a sized threshold whose gate errored still yields a failing check
    err = GateResult("quality", "nonfinite", error="NaN")
    v = decide({"quality": err}, thresholds(_cfg(max_ppl_ratio={"sized": True}), err))
    assert not v.approved and "nonfinite" in v.failures[0].reason


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"max_ppl_ratio = 0.9: must lie in \[1, ∞\]"):
        _cfg(max_ppl_ratio=0.9)
    with pytest.raises(ConfigError, match="unknown key.*alfa.*allowed: sized, alpha, beta"):
        _cfg(max_bleu_drop={"sized": True, "alfa": 0.1})
    with pytest.raises(ConfigError, match="could never fail"):
        _cfg(windowing="chunks")
    with pytest.raises(ConfigError, match="stride applies to windowing: sliding"):
        _cfg(max_bleu_drop=1.0, stride=128)
    with pytest.raises(ConfigError, match="agreement is disabled"):
        parse_config({"name": "q", "quant": {"format": "none"},
                      "gates": {"agreement": {"enabled": False}, "quality": {"max_bleu_drop": 1.0}}}, "q.yaml")
    assert isinstance(_cfg(max_chrf_drop={"sized": True, "alpha": 0.1}).gates.quality.max_chrf_drop, Sized)


def test_bleu_records_must_have_prompt_reference_lang(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps({"prompt": "Translate: x", "reference": "x", "lang": "en"}) + "\n"
                 + json.dumps({"prompt": "Translate: y", "lang": "en"}) + "\n", encoding="utf-8")
    cfg = _cfg(max_bleu_drop=1.0, bleu_dataset=str(f))
    ctx = GateContext(config=cfg, reference=None, candidate=None, tokenizer=None, folder=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="record 1 needs .* missing or empty: reference"):
        bleu_records(ctx)


def test_gate_2_reads_gate_1s_positions_through_upstream_not_a_sibling_folder(tmp_path: Path) -> None:
    """Gate 2 takes gate 1's per-position NLLs from the result gate 1 handed on (its own folder), wherever
    that folder is; a result without the file is a DataError that names it, never a guess at a path."""
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    np.savez(elsewhere / "positions.npz", nll_ref=np.array([1.0, 2.0]), nll_cand=np.array([1.5, 2.5]))
    cfg = _cfg(max_ppl_ratio=1.1)
    up = GateResult("agreement", "ok", folder=elsewhere)
    ctx = GateContext(config=cfg, reference=None, candidate=None, tokenizer=None, folder=tmp_path / "gate_quality",  # type: ignore[arg-type]
                      upstream={"agreement": up})
    nll_ref, nll_cand, info = _positions(ctx)
    assert nll_ref.tolist() == [1.0, 2.0] and nll_cand.tolist() == [1.5, 2.5] and info["windowing"] == "chunks"
    (elsewhere / "positions.npz").unlink()
    with pytest.raises(DataError, match="gate agreement: its positions.npz is missing from .*somewhere/else"):
        _positions(ctx)
    with pytest.raises(DataError, match="gate 1 did not run before it"):
        _positions(GateContext(config=cfg, reference=None, candidate=None, tokenizer=None, folder=tmp_path))  # type: ignore[arg-type]
