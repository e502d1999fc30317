"""The retrieval matrix's judge: paired counts per length, non-inferiority bounds, informativeness and limits
(qval.gates.retrieval.run measures).

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import GateConfig
from ...metrics import mean_estimate
from ...metrics.estimate import Estimate
from ...metrics.paired import PairedCounts, noninferiority, paired_counts, wilson_interval
from ...results import parse
from ...verdict import CheckKey, GateResult, Threshold
from .metrics import RETRIEVAL
from .result import RetrievalDetails


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.retrieval.enabled


def _wilson(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(k, n)
    return {"value": k / n if n else float("nan"), "lo": lo, "hi": hi, "n": n}


def _drop(c: PairedCounts, g: Any, margin: float | None) -> dict[str, Any]:
    # the margin changes only the pass/fail, which `thresholds` decides; 1.0 stands in when none is set
    return noninferiority(c, margin if margin is not None else 1.0, alpha=g.alpha, beta=g.beta)


def summarize(cfg: GateConfig, rows: list[dict[str, Any]], info: dict[str, Any], seconds: float) -> GateResult:
    g = cfg.gates.retrieval
    measurements: dict[str, Estimate] = {}
    lengths, cells = [], []
    for L in g.lengths:
        at = [r for r in rows if r["length"] == L]
        c = paired_counts([r["ref_right"] for r in at], [r["cand_right"] for r in at])
        ni = _drop(c, g, g.margin)
        measurements[f"drop@{L}"] = Estimate(ni["drop"], None, ni["lo"], ni["hi"], c.n)
        lengths.append({"length": L, "counts": c.to_dict(), "n": c.n, "ref": _wilson(c.ref_correct, c.n),
                        "cand": _wilson(c.cand_correct, c.n), "drop": ni, "mean_prompt_tokens": float(np.mean([r["prompt_tokens"] for r in at]))})
        for d in g.depths:
            here = [r for r in at if r["depth"] == d]
            cells.append({"length": L, "depth": d, "n": len(here), "ref_right": sum(r["ref_right"] for r in here),
                          "cand_right": sum(r["cand_right"] for r in here)})
    c_all = paired_counts([r["ref_right"] for r in rows], [r["cand_right"] for r in rows])
    ni_all = _drop(c_all, g, g.margin_overall)
    measurements["drop"] = Estimate(ni_all["drop"], None, ni_all["lo"], ni_all["hi"], c_all.n)
    measurements["answer_kld"] = mean_estimate(np.array([r["answer_kld"] for r in rows]))
    measurements["answer_top1"] = mean_estimate(np.array([r["answer_top1"] for r in rows]))
    for key, k in (("ref_accuracy", c_all.ref_correct), ("cand_accuracy", c_all.cand_correct)):
        w = _wilson(k, c_all.n)
        measurements[key] = Estimate(w["value"], None, w["lo"], w["hi"], c_all.n)
    flips = [r for r in rows if r["ref_right"] != r["cand_right"]]
    details = RetrievalDetails.model_validate({
        **info, "per_length": lengths, "cells": cells, "overall": {"counts": c_all.to_dict(), "drop": ni_all},
        "flipped": flips, "rows": rows, "alpha": g.alpha, "beta": g.beta,
        "interval": f"Newcombe paired, two-sided {1 - 2 * g.alpha:.0%} (its upper end is the one-sided {1 - g.alpha:.0%} bound)"})
    return GateResult("retrieval", "ok", measurements=measurements, details=details, seconds=seconds)


def _details(result: GateResult) -> RetrievalDetails:
    return parse(RetrievalDetails, result.details, "gate retrieval's result")


def _informative(cfg: GateConfig, result: GateResult | None, length: int | None) -> tuple[bool, str | None]:
    """A length (or the pooled matrix, `length` None) is informative when the REFERENCE solves at
    least `min_reference_accuracy` of its trials: a task the reference cannot do shows no loss."""
    g = cfg.gates.retrieval
    if result is None or result.status != "ok":
        return True, None  # the check fails for the missing result, as any other
    c = PairedCounts(**_details(result).at_length(length).counts.to_dict())
    acc = c.ref_correct / c.n if c.n else 0.0
    if acc >= g.min_reference_accuracy:
        return True, None
    return False, (f"the reference itself answers {c.ref_correct} of {c.n} trials"
                   f"{'' if length is None else f' at {length} tokens'} (below min_reference_accuracy {g.min_reference_accuracy:g})")


def _detectable(result: GateResult | None, key: str, length: int | None) -> float | None:
    if result is None or result.status != "ok":
        return None
    return _details(result).at_length(length).drop.detectable_drop


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.retrieval
    out = []
    per, pooled, kld = (RETRIEVAL.by_field(f) for f in ("margin", "margin_overall", "max_answer_kld"))
    targets: list[tuple[CheckKey, int | None, float | None]] = [(CheckKey("retrieval", per.key, str(L)), L, g.margin)
                                                                for L in g.lengths]
    targets.append((CheckKey("retrieval", pooled.key), None, g.margin_overall))
    for key, length, margin in targets:
        if margin is None:
            continue
        m = per if length else pooled
        ok, why = _informative(cfg, result, length)
        det = _detectable(result, key.name, length)
        where = f"at {length} tokens of context" if length else "over the whole matrix"
        out.append(Threshold(key, m.op, margin, m.describe(where=where, level=f"{1 - g.alpha:.0%}"),
                             "absolute", det, on=m.on, informative=ok, why_uninformative=why, detectable=det))
    if g.max_answer_kld is not None:
        out.append(Threshold(CheckKey("retrieval", kld.key), kld.op, g.max_answer_kld, kld.label, on=kld.on))
    return out
