"""Gate 1 at depth's judge: per-bucket figures from the per-position arrays, where the candidate departs, its
limits (qval.gates.depth.run measures).

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
from ...results import parse
from ...verdict import CheckKey, GateResult, Threshold
from .metrics import DEPTH
from .result import DepthDetails, Window


#: a position whose KLD is at most this is "the same distribution" (float rounding of one model)
SAME_KLD = 1e-6


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.depth.enabled


def bucket_spans(edges: list[int], scored: int) -> list[tuple[int, int]]:
    """[lo, hi) position ranges of the depth buckets, clipped to the `scored` positions a chunk has.

    >>> bucket_spans([512, 1024, 2048], 2047)
    [(0, 512), (512, 1024), (1024, 2047)]
    >>> bucket_spans([512, 1024], 700)
    [(0, 512), (512, 700)]
    """
    out, lo = [], 0
    for e in edges:
        hi = min(e, scored)
        if hi > lo:
            out.append((lo, hi))
        lo = e
        if lo >= scored:
            break
    return out


def bucket_label(lo: int, hi: int) -> str:
    """The name a bucket's metrics carry: `top1@512-1024`."""
    return f"{lo}-{hi}"


def divergence(kld: np.ndarray, top1: np.ndarray, window: int) -> dict[str, Any]:
    """Where the candidate departs from the reference, from [chunks, positions] arrays.

    `first_difference`: the first depth at which any chunk's KLD exceeds SAME_KLD (None: the
    candidate reproduces the reference everywhere); `series`: mean KLD and top-1 per window of
    `window` positions (mean over chunks), which `first_beyond` reads against the limits.
    >>> k = np.zeros((2, 8)); k[:, 5:] = 0.5
    >>> d = divergence(k, k < 0.1, 2)
    >>> d["first_difference"], [w["kld"] for w in d["series"]]
    (5, [0.0, 0.0, 0.25, 0.5])
    """
    differs = np.nonzero((kld > SAME_KLD).any(axis=0))[0]
    series = []
    for s in range(0, kld.shape[1], window):
        e = min(s + window, kld.shape[1])
        series.append({"start": s, "end": e, "kld": float(kld[:, s:e].mean()), "top1": float(top1[:, s:e].mean())})
    return {"first_difference": int(differs[0]) if differs.size else None, "window": window, "series": series}


def first_beyond(series: list[Window], max_kld: float | None, min_top1: float | None) -> int | None:
    """Start of the first window whose mean KLD is above `max_kld` or top-1 below `min_top1`.

    >>> w = [Window(start=0, end=128, kld=0.01, top1=0.9), Window(start=128, end=256, kld=0.2, top1=0.9)]
    >>> first_beyond(w, 0.05, None)
    128
    """
    for w in series:
        if (max_kld is not None and w.kld > max_kld) or (min_top1 is not None and w.top1 < min_top1):
            return w.start
    return None


def where_it_diverges(cfg: GateConfig, result: GateResult | None) -> str:
    """'first departs from the reference at depth 601; windows beyond the limits from depth 640'."""
    if result is None or result.status != "ok":
        return ""
    g, d = cfg.gates.depth, parse(DepthDetails, result.details, "gate depth's result").divergence
    if d.first_difference is None:
        return "the candidate reproduces the reference at every depth"
    beyond = first_beyond(d.series, g.max_mean_kld, g.min_top1)
    text = f"the candidate first departs from the reference at depth {d.first_difference}"
    return text + (f"; windows of {d.window} beyond the limits from depth {beyond}" if beyond is not None
                   else "; no window of it crosses the limits")


def summarize(cfg: GateConfig, a: dict[str, np.ndarray], info: dict[str, Any], seconds: float) -> GateResult:
    g = cfg.gates.depth
    scored = a["kld"].shape[1]
    measurements: dict[str, Estimate] = {}
    buckets = []
    for lo, hi in bucket_spans(g.edges, scored):
        label = bucket_label(lo, hi)
        k, t = a["kld"][:, lo:hi].reshape(-1), a["top1"][:, lo:hi].reshape(-1)
        dp = (a["p_cand"][:, lo:hi] - a["p_ref"][:, lo:hi]).reshape(-1)
        kld = kld_summary(k)
        measurements[f"top1@{label}"] = proportion(t)
        measurements[f"mean_kld@{label}"] = kld["mean"]
        measurements[f"p99_kld@{label}"] = Estimate(value=quantiles(k, [0.99])["p99"], n=int(k.size))
        buckets.append({"label": label, "lo": lo, "hi": hi, "positions": int(k.size), "top1": proportion(t).to_dict(),
                        "kld": {key: (v.to_dict() if hasattr(v, "to_dict") else v) for key, v in kld.items()},
                        "delta_p": {key: (v.to_dict() if hasattr(v, "to_dict") else v) for key, v in delta_p_summary(dp).items()},
                        "nll_ref": float(a["nll_ref"][:, lo:hi].mean()), "nll_cand": float(a["nll_cand"][:, lo:hi].mean())})
    allk = a["kld"].reshape(-1)
    measurements["top1"] = proportion(a["top1"].reshape(-1))
    measurements["mean_kld"] = mean_estimate(allk)
    details = DepthDetails.model_validate({**info, **kld_bound_details(a), "scored_positions": int(allk.size),
                                           "scored_per_chunk": scored, "buckets": buckets,
                                           "divergence": divergence(a["kld"], a["top1"], g.window)})
    return GateResult("depth", "ok", measurements=measurements, details=details, seconds=seconds)


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.depth
    out = []
    said = where_it_diverges(cfg, result)
    for lo, hi in bucket_spans(g.edges, g.ctx - 1):
        label, where = bucket_label(lo, hi), f"at context depths {lo}–{hi}" + (f" ({said})" if said else "")
        out += [Threshold(CheckKey("depth", m.key, label), m.op, limit, m.describe(where=where), on=m.on)
                for m in DEPTH.metrics if (limit := getattr(g, m.field)) is not None]
    return out
