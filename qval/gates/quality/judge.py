"""Gate 2's judge: perplexity from the per-position NLLs and its limits, absolute or sized (qval.gates.quality.run
measures and scores BLEU/chrF).

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...config import GateConfig, Sized
from ...gate_metrics import Metric
from ...metrics import mean_estimate, perplexity, sized_threshold
from ...metrics.estimate import Estimate
from ...metrics.perplexity import ppl_ratio
from ...results import parse
from ...verdict import CheckKey, GateResult, Threshold
from .metrics import QUALITY
from .result import LangGroup, QualityDetails


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.quality.enabled


def perplexity_part(nll_ref: np.ndarray, nll_cand: np.ndarray) -> tuple[dict[str, Estimate], dict[str, Any]]:
    d = nll_cand - nll_ref
    measurements = {"ppl_ratio": ppl_ratio(nll_cand, nll_ref), "ppl_ref": perplexity(nll_ref), "ppl_cand": perplexity(nll_cand)}
    details = {"positions": int(d.size), "mean_nll_ref": mean_estimate(nll_ref).to_dict(),
               "mean_nll_cand": mean_estimate(nll_cand).to_dict(), "mean_nll_diff": mean_estimate(d).to_dict(),
               "sigma_nll_diff": float(np.std(d, ddof=1)) if d.size > 1 else float("nan")}
    return measurements, details


_PPL = QUALITY.by_field("max_ppl_ratio")


_DROPS = (QUALITY.by_field("max_bleu_drop"), QUALITY.by_field("max_chrf_drop"))  # per language


def _sized_ppl(limit: Sized, result: GateResult) -> Threshold:
    """Paired sizing on the log scale. log(ratio) = mean(d), d = nll_c − nll_r per position; its
    noise is σ_d/√n. DESIGN's sqrt(2σ²/n) is the noise of a difference of two independent means;
    with paired data the difference's own σ_d replaces it (σ² := σ_d²/2 gives sqrt(2σ²/n) = σ_d/√n).
    threshold = h·exp(|Φ⁻¹(α)|·σ_d/√n), h the config's `healthy` ratio (1: the reference's level); the
    detectable effect is a relative PPL increase exp(θ) − 1 over h.
    """
    p = parse(QualityDetails, result.details, "gate quality's result").ppl
    sigma_d, n = p.sigma_nll_diff, p.positions
    h = limit.healthy if limit.healthy is not None else 1.0
    s = sized_threshold(0.0, sigma_d / math.sqrt(2.0), n, alpha=limit.alpha, beta=limit.beta, higher_is_better=False)
    return Threshold(CheckKey("quality", _PPL.key), _PPL.op, h * math.exp(s.threshold), _PPL.label,
                     "sized", math.exp(s.min_detectable_effect) - 1.0,
                     {"sigma_nll_diff": sigma_d, "n": n, "alpha": limit.alpha, "beta": limit.beta, "healthy": limit.healthy,
                      "effect_unit": "relative PPL increase (ratio − 1)", "test": "paired, one-sided, on log PPL"},
                     detectable=h * math.exp(s.min_detectable_effect))


def _sized_drop(m: Metric, lang_key: str, limit: Sized, result: GateResult, what: str) -> Threshold:
    """TRT-LLM sizing of a BLEU/chrF drop: σ = per-sentence score std of the reference's
    generations, n = sentences; threshold = h + |Φ⁻¹(α)|·sqrt(2σ²/n) points of drop, h the config's
    `healthy` drop (0: the reference's level)."""
    score = m.key.removesuffix("_drop")  # "bleu", "chrf": the group's figures are named after it
    grp = _groups(result)[lang_key]
    sigma, n = grp.sentence_sigma(score), grp.sentences
    h = limit.healthy or 0.0
    s = sized_threshold(0.0, sigma, n, alpha=limit.alpha, beta=limit.beta, higher_is_better=False)
    return Threshold(CheckKey("quality", m.key, lang_key, "_"), m.op, h + s.threshold, what, "sized", s.min_detectable_effect,
                     {"sigma": sigma, "n": n, "alpha": limit.alpha, "beta": limit.beta, "healthy": limit.healthy,
                      "effect_unit": f"{score} points"},
                     detectable=h + s.min_detectable_effect)


def _groups(result: GateResult) -> dict[str, LangGroup]:
    bleu = parse(QualityDetails, result.details, "gate quality's result").bleu
    return bleu.groups if bleu is not None else {}


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.quality
    usable = result is not None and result.status == "ok"
    out: list[Threshold] = []
    if isinstance(g.max_ppl_ratio, Sized) and usable:
        out.append(_sized_ppl(g.max_ppl_ratio, result))  # type: ignore[arg-type]
    elif g.max_ppl_ratio is not None:
        limit = g.max_ppl_ratio if isinstance(g.max_ppl_ratio, float) else float("nan")
        out.append(Threshold(CheckKey("quality", _PPL.key), _PPL.op, limit, _PPL.label))
    for m in _DROPS:
        limit = getattr(g, m.field)
        if limit is None:
            continue
        langs = sorted(_groups(result)) if usable else []  # type: ignore[arg-type]
        if not langs:  # the gate did not produce groups: one check that fails and says why
            out.append(Threshold(CheckKey("quality", m.key), m.op, limit if isinstance(limit, float) else float("nan"),
                                 m.describe(per="")))
        for lang in langs:
            what = m.describe(per=f" on the {lang} prompts, points")
            if isinstance(limit, Sized):
                out.append(_sized_drop(m, lang, limit, result, what))  # type: ignore[arg-type]
            else:
                out.append(Threshold(CheckKey("quality", m.key, lang, "_"), m.op, float(limit), what))
    return out
