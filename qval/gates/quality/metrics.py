"""Gate 2's table: perplexity and BLEU/chrF, the figures it is judged on, and the config fields that limit them."""

from __future__ import annotations

from ...gate_metrics import EITHER, GateMetrics, Metric

QUALITY = GateMetrics("quality", (
    # a ratio limit below 1 would demand a candidate better than the reference
    Metric("ppl_ratio", "max_ppl_ratio", "max", "PPL_cand / PPL_ref over the scored positions", EITHER, lo=1.0, sweep="PPL ratio"),
    # per language: {per} is " on the <lang> prompts, points"
    Metric("bleu_drop", "max_bleu_drop", "max", "reference BLEU − candidate BLEU{per}", EITHER, hi=100.0),
    Metric("chrf_drop", "max_chrf_drop", "max", "reference chrF − candidate chrF{per}", EITHER, hi=100.0),
))
