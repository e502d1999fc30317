"""Aggregate gate-1 per-position vectors (KLD, Δp, top-1 flags) into report figures.

Kept apart from `tokens.py` (lm-evaluation-harness style): the per-position numbers are computed
chunk by chunk on the device, then concatenated on the CPU and summarised here once.
A NaN anywhere propagates into the mean and the quantiles on purpose: the verdict treats a NaN
figure as a failure, so nothing here may drop it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qval.metrics.estimate import Estimate, mean_estimate, proportion, quantiles


def _max(a: np.ndarray) -> float:
    # np.max raises on empty input; an empty measurement is NaN, which the verdict fails.
    return float(np.max(a)) if a.size else float("nan")


def kld_summary(kld: np.ndarray) -> dict[str, Any]:
    """Mean KLD with its standard error, plus the tail that a mean hides.

    Quantization damage is often a few positions with large KLD, so p99/p99.9/max are reported
    beside the mean (the llama.cpp KLD scoreboard does the same).
    >>> s = kld_summary(np.array([0.0, 0.0, 0.0, 0.4]))
    >>> s["mean"].value, round(s["mean"].stderr, 6), s["median"], s["max"]
    (0.1, 0.1, 0.0, 0.4)
    """
    a = np.asarray(kld, dtype=np.float64).reshape(-1)
    q = quantiles(a, [0.5, 0.9, 0.99, 0.999])
    return {
        "mean": mean_estimate(a),
        "median": q["p50"],
        "p90": q["p90"],
        "p99": q["p99"],
        "p99.9": q["p99.9"],
        "max": _max(a),
    }


def delta_p_summary(dp: np.ndarray) -> dict[str, Any]:
    """Δp = p_cand(x) − p_ref(x): mean ± se, RMS, and the 1st/99th percentiles.

    A heavy negative p1 with a mild p99 means the candidate loses confidence in the right token
    (damage); a symmetric spread is noise. RMS measures size regardless of sign.
    >>> s = delta_p_summary(np.array([-0.2, 0.0, 0.2]))
    >>> round(s["mean"].value, 12), round(s["rms"], 6)
    (0.0, 0.163299)
    """
    a = np.asarray(dp, dtype=np.float64).reshape(-1)
    q = quantiles(a, [0.01, 0.99])
    rms = float(np.sqrt(np.mean(a * a))) if a.size else float("nan")
    return {"mean": mean_estimate(a), "rms": rms, "p1": q["p1"], "p99": q["p99"]}


def top1_summary(flags: np.ndarray) -> Estimate:
    """Top-1 agreement rate, p ± sqrt(p(1-p)/(n-1)).

    >>> top1_summary(np.array([True, True, False, True])).value
    0.75
    """
    return proportion(np.asarray(flags, dtype=bool))


#: per-position figures beside an estimated KLD: a snapshot reference's upper bound and audited exact KLD
#: (qval/snapshot), a top-K candidate's plain estimate, lower bound and unseen mass (qval/metrics/topk.py)
BOUND_FIELDS = ("kld_upper", "kld_exact", "kld_estimate", "kld_lower", "unseen_mass")


def kld_bound_details(a: dict[str, np.ndarray]) -> dict[str, Any]:
    """With a snapshot reference: the mean KLD's upper bound (the full-vocabulary mean is at most
    it) and, when the full reference logits were at hand, the exact mean and how far
    the estimate is from it. With a candidate known by its top K: the estimate's lower bound and the
    mass it could not see. Nothing when both models' full logits were used."""
    out: dict[str, Any] = {}
    if "kld_upper" in a:
        est, hi = float(np.mean(a["kld"])), float(np.mean(a["kld_upper"]))
        out["kld_bound"] = {"mean_kld": est, "mean_kld_upper": hi, "p99_kld_upper": quantiles(a["kld_upper"], [0.99])["p99"],
                            "note": "KLD from the reference snapshot: its top-k log-probabilities exactly, its tail from a "
                                    "systematic sample of tail tokens; mean_kld_upper is a strict upper bound of the "
                                    "full-vocabulary mean KLD (qval/metrics/compact.py)"}
    if "kld_lower" in a:
        q = quantiles(a["unseen_mass"], [0.99])["p99"]
        out["kld_topk"] = {"mean_kld": float(np.mean(a["kld"])), "mean_kld_lower": float(np.mean(a["kld_lower"])),
                           "p99_kld": quantiles(a["kld"], [0.99])["p99"], "p99_kld_lower": quantiles(a["kld_lower"], [0.99])["p99"],
                           "mean_unseen_mass": float(np.mean(a["unseen_mass"])), "p99_unseen_mass": q,
                           "note": "the candidate (or the reference, or both) is known by its top K log-probabilities (a "
                                   "served engine): the KLD gated is an estimate (the seen tokens exactly, the unseen ones "
                                   "assumed as damaged as the seen) plus what that estimate gained from the top K/2 to the "
                                   "top K at each position (both sides served: from the top K/4 on), set above the plain "
                                   "estimate because the estimate runs under the exact KLD the shorter the list; "
                                   "mean_kld_estimate is the plain estimate, mean_kld_lower a strict lower bound; no upper "
                                   "bound exists from top-K log-probabilities; unseen_mass is the reference's probability on "
                                   "tokens not seen on both sides, the part the estimate assumes (qval/metrics/topk.py)"}
        if "kld_estimate" in a:
            out["kld_topk"].update(mean_kld_estimate=float(np.mean(a["kld_estimate"])),
                                   p99_kld_estimate=quantiles(a["kld_estimate"], [0.99])["p99"])
    if "kld_exact" in a and a["kld_exact"].size == a["kld"].size:  # audited only where every position was computed here
        exact = float(np.mean(a["kld_exact"]))
        out["kld_audit"] = {"mean_kld_exact": exact, "mean_kld_snapshot": float(np.mean(a["kld"])),
                            "relative_difference": (float(np.mean(a["kld"])) - exact) / exact if exact else float("nan")}
    return out
