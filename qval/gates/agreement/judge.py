"""Gate 1's judge: its figures from the per-position arrays and its limits (qval.gates.agreement.run measures).

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import GateConfig
from ...metrics import (delta_p_summary, kld_summary, mean_estimate, proportion,
                        quantiles)
from ...metrics.agreement import kld_bound_details
from ...metrics.estimate import Estimate
from ...verdict import CheckKey, GateResult, Threshold
from .metrics import AGREEMENT
from .result import AgreementDetails


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.agreement.enabled


def summarize(a: dict[str, np.ndarray], info: dict[str, Any], seconds: float) -> GateResult:
    kld = kld_summary(a["kld"])
    dp = a["p_cand"] - a["p_ref"]
    p99 = quantiles(a["kld"], [0.99])["p99"]
    measurements = {
        "top1": proportion(a["top1"]),
        "mean_kld": kld["mean"],
        "p99_kld": Estimate(value=p99, n=int(a["kld"].size)),
        "mean_delta_p": mean_estimate(dp),
    }
    details = AgreementDetails.model_validate({
        **info, **kld_bound_details(a), "kld": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in kld.items()},
        "delta_p": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in delta_p_summary(dp).items()},
        "kld_histogram": histogram(a["kld"])})
    return GateResult("agreement", "ok", measurements=measurements, details=details, seconds=seconds)


def histogram(kld: np.ndarray, bins: int = 40) -> dict[str, list[float]]:
    """Log-spaced histogram of per-position KLD, for the report's plot: every finite positive KLD from 1e-12 up
    (below it, rounding noise: left out, unless every value is below it), `zeros` those ≤ 0."""
    pos = kld[np.isfinite(kld) & (kld > 0)]
    if pos.size == 0:
        return {"edges": [], "counts": [], "zeros": int(np.sum(kld == 0))}
    lo = float(pos.min()) if pos.max() < 1e-12 else max(float(pos.min()), 1e-12)
    edges = np.logspace(np.log10(lo), np.log10(pos.max()) + 1e-9, bins + 1)
    edges[0] = lo  # 10 ** log10(lo) may round above lo, and the smallest value would fall outside
    counts, _ = np.histogram(pos, bins=edges)
    return {"edges": edges.tolist(), "counts": counts.tolist(), "zeros": int(np.sum(kld <= 0))}


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.agreement
    return [Threshold(CheckKey("agreement", m.key), m.op, limit, m.label, on=m.on)
            for m in AGREEMENT.metrics if (limit := getattr(g, m.field)) is not None]
