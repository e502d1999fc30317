"""Gate 3's judge: per-prompt and per-window figures from the continuations and their teacher-forced arrays,
the loop rule, and its limits (absolute, or sized from the reference's own spread; qval.gates.longgen.run
generates and scores).

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import GateConfig, Sized
from ...gate_metrics import Metric
from ...metrics import detect_loop, distinct_n, mean_estimate, median_estimate, seq_rep_n, sized_threshold, windows
from ...metrics.agreement import BOUND_FIELDS, kld_bound_details
from ...metrics.estimate import Estimate
from ...results import parse
from ...verdict import CheckKey, GateResult, Threshold
from .metrics import LONGGEN
from .result import LonggenDetails


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.longgen.enabled


LOOP_MAX_PERIOD = 64  # DESIGN: a period of at most 64 tokens ...
LOOP_SPAN = 256  # ... repeating through the last 256


def edges(n: int, edge: int) -> tuple[slice, slice]:
    """The early (first `edge`) and late (last `edge`) positions of an n-token continuation.

    >>> edges(2048, 512)
    (slice(0, 512, None), slice(1536, 2048, None))
    """
    return slice(0, min(edge, n)), slice(max(0, n - edge), n)


def health(tokens: list[int], window: int, edge: int, span: int) -> dict[str, Any]:
    """One continuation's own health: per-window seq-rep-4 / distinct-2 / loop at the window's
    end, the late part's seq-rep-4 and distinct-2, and the loop period at the very end."""
    spans = windows(len(tokens), window)
    _, late = edges(len(tokens), edge)
    return {
        "seq_rep4": [seq_rep_n(tokens[s:e], 4) for s, e in spans],
        "distinct2": [distinct_n(tokens[s:e], 2) for s, e in spans],
        "loop": [detect_loop(tokens[:e], max_period=LOOP_MAX_PERIOD, span=span) for _, e in spans],
        "late_seq_rep4": seq_rep_n(tokens[late], 4),
        "late_distinct2": distinct_n(tokens[late], 2),
        "loop_period": detect_loop(tokens, max_period=LOOP_MAX_PERIOD, span=span),
    }


def _window_mean(arrays: list[np.ndarray], s: int, e: int) -> float | None:
    vals = [a[s:e].mean() for a in arrays if a.size >= e]
    return float(np.mean(vals)) if vals else None


def _count(x: float, n: int) -> Estimate:
    return Estimate(x, n=n)


def summarize(cfg: GateConfig, records: list[dict[str, Any]], seqs: list[dict[str, Any]], ref_eos: list[int | None],
              cand_eos: list[int | None], info: dict[str, Any], seconds: float) -> GateResult:
    """Measurements, the per-window series and per-prompt figures from the per-sequence arrays."""
    g = cfg.gates.longgen
    n = len(seqs)
    span = min(LOOP_SPAN, max(1, g.new_tokens // 2))  # short test runs scale the loop span down
    # per prompt: mean over its early / late positions. Positions of one continuation are far
    # from independent (a loop repeats the same few predictions), so the prompt is the unit
    # every interval and sized threshold below counts.
    e_kld, l_kld, e_top1, l_top1 = [], [], [], []
    ref_late_nll, cand_late_nll, per_prompt = [], [], []
    ref_health, cand_health = [], []
    edge_positions = 0
    for i, s in enumerate(seqs):
        tf = s["tf"]
        e, l = edges(tf["kld"].size, g.edge)
        e_kld.append(float(tf["kld"][e].mean())), l_kld.append(float(tf["kld"][l].mean()))
        e_top1.append(float(tf["top1"][e].mean())), l_top1.append(float(tf["top1"][l].mean()))
        edge_positions += int(tf["kld"][l].size)
        rh, ch = health(s["ref"], g.window, g.edge, span), health(s["cand"], g.window, g.edge, span)
        ref_health.append(rh), cand_health.append(ch)
        _, rl = edges(len(s["ref"]), g.edge)
        _, cl = edges(len(s["cand"]), g.edge)
        ref_late_nll.append(float(tf["nll_ref"][rl].mean()) if tf["nll_ref"][rl].size else float("nan"))
        cand_late_nll.append(float(s["judge_cand"][cl].mean()) if s["judge_cand"][cl].size else float("nan"))
        diverge = next((k for k, (a, b) in enumerate(zip(s["ref"], s["cand"])) if a != b), None)
        if diverge is None and len(s["ref"]) != len(s["cand"]):
            diverge = min(len(s["ref"]), len(s["cand"]))
        rec = records[i]
        per_prompt.append({"id": rec.get("id", str(i)), "lang": rec.get("lang"), "kind": rec.get("kind"),
                           "ref_tokens": len(s["ref"]), "cand_tokens": len(s["cand"]), "first_divergence": diverge,
                           "early_kld": e_kld[-1], "late_kld": l_kld[-1], "early_top1": e_top1[-1], "late_top1": l_top1[-1],
                           "ref_late_seq_rep4": rh["late_seq_rep4"], "cand_late_seq_rep4": ch["late_seq_rep4"],
                           "ref_late_nll": ref_late_nll[-1], "cand_late_judge_nll": cand_late_nll[-1],
                           "ref_loop_period": rh["loop_period"], "cand_loop_period": ch["loop_period"],
                           "ref_eos_step": ref_eos[i] if i < len(ref_eos) else None,
                           "cand_eos_step": cand_eos[i] if i < len(cand_eos) else None})

    # the teacher-forced figures are taken over the prompts whose reference continuation does not end
    # in a loop, when those are at least half (`loop_rule`); else over every prompt, and uninformative
    rule = loop_rule([h["loop_period"] is not None for h in ref_health])
    use = rule["natural_prompts"] if rule["informative"] else list(range(n))
    e_kld, l_kld, e_top1, l_top1 = ([x[i] for i in use] for x in (e_kld, l_kld, e_top1, l_top1))
    ek, lk, et, lt = (mean_estimate(np.array(x)) for x in (e_kld, l_kld, e_top1, l_top1))
    rep_excess = np.array([c["late_seq_rep4"] - r["late_seq_rep4"] for r, c in zip(ref_health, cand_health)])
    nll_excess = np.array(cand_late_nll) - np.array(ref_late_nll)
    ref_loops = sum(h["loop_period"] is not None for h in ref_health)
    cand_loops = sum(h["loop_period"] is not None for h in cand_health)
    measurements = {
        "late_top1": lt, "early_top1": et, "late_kld": lk, "early_kld": ek,
        # paired per prompt: late − early KLD (the gated drift), early − late top-1 (> 0: agreement decays)
        "late_drift": mean_estimate(np.array(l_kld) - np.array(e_kld)),
        "top1_drift": mean_estimate(np.array(e_top1) - np.array(l_top1)),
        "seq_rep4_excess": mean_estimate(rep_excess),
        "judge_nll_excess": median_estimate(nll_excess),  # median over prompts: LONGGEN (metrics.py) says why
        "loops_excess": _count(cand_loops - ref_loops, n),
        # how repetitive the teacher-forced text (the reference's own continuation) is late on: a
        # looping continuation makes its late positions easy to predict, so late top-1 says less
        "tf_late_seq_rep4": mean_estimate(np.array([h["late_seq_rep4"] for h in ref_health])),
    }
    ref_stops = sum(s is not None and s + 1 < g.new_tokens for s in ref_eos)
    cand_stops = sum(s is not None and s + 1 < g.new_tokens for s in cand_eos)
    if not g.suppress_eos:
        measurements["premature_eos_excess"] = _count(cand_stops - ref_stops, n)

    series = window_series([s["tf"] for s in seqs], [s["judge_cand"] for s in seqs], ref_health, cand_health, g.window,
                           max(len(s["ref"]) for s in seqs))
    details = LonggenDetails.model_validate({
               **info, **kld_bound_details({k: np.concatenate([s["tf"][k] for s in seqs]) for k in BOUND_FIELDS + ("kld",)
                                            if all(k in s["tf"] for s in seqs)}),
               "loop_span": span, "loop_max_period": LOOP_MAX_PERIOD, "windows": series, "per_prompt": per_prompt,
               "ref_loops": ref_loops, "cand_loops": cand_loops, "ref_eos_stops": ref_stops, "cand_eos_stops": cand_stops,
               "late_positions": edge_positions, "loop_rule": rule,
               "sizing": {"prompts": n,
                          "ref_late_seq_rep4_sigma": _sd([h["late_seq_rep4"] for h in ref_health]),
                          "ref_late_nll_sigma": _sd(ref_late_nll), "ref_loop_rate": ref_loops / n if n else float("nan"),
                          "ref_eos_rate": ref_stops / n if n else float("nan")}})
    return GateResult("longgen", "ok", measurements, details, seconds=seconds)


def loop_rule(ref_loops: list[bool]) -> dict[str, Any]:
    """Whether gate 3's teacher-forced checks (late top-1, late KLD, drift) can see damage here. A
    continuation that ends in a loop is predicted late on by copying the loop, which any candidate
    that kept induction does: a near-perfect late top-1 there is no evidence. Those checks are judged
    on the prompts whose reference continuation does not end in a loop when those are at least half
    of the prompts; otherwise they are uninformative, stated beside the verdict, and the decision
    rests on the checks that read natural text or the candidate's own text (gate 1 and gate 1 at
    depth, judge NLL, seq-rep-4, loops).

    >>> loop_rule([True, False, True, True])["informative"], loop_rule([True, False, False, True])["natural_prompts"]
    (False, [1, 2])
    """
    natural = [i for i, looped in enumerate(ref_loops) if not looped]
    informative = bool(natural) and 2 * len(natural) >= len(ref_loops)
    why = None if informative else (
        f"the reference's own continuation ends in a loop on {len(ref_loops) - len(natural)} of {len(ref_loops)} prompts: "
        "late positions of a loop are predicted by copying it, so late top-1 / KLD / drift cannot see damage there "
        "(the decision rests on the checks against natural text and on the candidate's own text)")
    return {"looping_prompts": len(ref_loops) - len(natural), "natural_prompts": natural, "informative": informative, "why": why}


def _sd(x: list[float]) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def window_series(tfs: list[dict[str, np.ndarray]], judges: list[np.ndarray], ref_health: list[dict[str, Any]],
                  cand_health: list[dict[str, Any]], window: int, longest: int) -> list[dict[str, Any]]:
    """One row per window, averaged over the prompts whose continuation reaches it."""
    rows = []
    for k, (s, e) in enumerate(windows(longest, window)):
        def at(hs: list[dict[str, Any]], key: str) -> float | None:
            vals = [h[key][k] for h in hs if k < len(h[key])]
            return float(np.mean(vals)) if vals else None

        def loops(hs: list[dict[str, Any]]) -> int:
            return sum(1 for h in hs if k < len(h["loop"]) and h["loop"][k] is not None)

        rows.append({"start": s, "end": e,
                     "top1": _window_mean([t["top1"].astype(np.float64) for t in tfs], s, e),
                     "kld": _window_mean([t["kld"] for t in tfs], s, e),
                     "ref_nll": _window_mean([t["nll_ref"] for t in tfs], s, e),
                     "cand_judge_nll": _window_mean(judges, s, e),
                     "ref_seq_rep4": at(ref_health, "seq_rep4"), "cand_seq_rep4": at(cand_health, "seq_rep4"),
                     "ref_distinct2": at(ref_health, "distinct2"), "cand_distinct2": at(cand_health, "distinct2"),
                     "ref_loops": loops(ref_health), "cand_loops": loops(cand_health)})
    return rows


def _sized(m: Metric, limit: Sized, z: dict[str, Any]) -> Threshold:
    """Sized limits of the health excesses, n = prompts, from the REFERENCE's own spread only, by
    the row's sizing rule (its late seq-rep-4 and NLL per prompt, its loop / EOS rate): nothing the
    candidate does can widen them. Centred on the config's `healthy` figure where it states one (the
    excess a healthy candidate is measured to show), else on the reference's own level, 0. The
    drift-type figures (late top-1, late KLD, drift) are absolute."""
    rule = m.sizing
    assert rule is not None, f"the row of {m.field} allows a sized limit but names no sizing rule"
    sigma = rule.sigma(z)
    ref, n = (limit.healthy or 0.0), z["prompts"]
    if n < 2 and rule.scale_by_n:
        # one prompt gives no rate to size against: the count falls back to the strict limit
        # (no more than the reference), which is what sizing gives when the reference never does it
        return Threshold(CheckKey("longgen", m.key), m.op, ref, f"{m.label} (one prompt: cannot be sized, strict limit {ref:g})",
                         "sized", None, {"sigma": None, "n": n, "alpha": limit.alpha, "beta": limit.beta, "relative_to": ref,
                                         "healthy": limit.healthy})
    try:
        s = sized_threshold(0.0, sigma, n, alpha=limit.alpha, beta=limit.beta, higher_is_better=False)
    except ValueError as err:
        return Threshold(CheckKey("longgen", m.key), m.op, float("nan"), f"{m.label} (cannot be sized: {err})", "sized")
    scale = n if rule.scale_by_n else 1
    effect = s.min_detectable_effect * scale
    return Threshold(CheckKey("longgen", m.key), m.op, ref + s.threshold * scale, m.label, "sized",
                     effect, {"sigma": sigma, "n": n, "alpha": limit.alpha, "beta": limit.beta, "relative_to": ref,
                              "healthy": limit.healthy, "sized_from": rule.basis},
                     detectable=ref + effect)


def _details(result: GateResult) -> LonggenDetails:
    return parse(LonggenDetails, result.details, "gate longgen's result")


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.longgen
    usable = result is not None and result.status == "ok"
    out = []
    for m in LONGGEN.metrics:
        limit = getattr(g, m.field)
        if limit is None or (m.applies is not None and not m.applies(g)):
            continue
        if isinstance(limit, Sized):
            if usable:
                out.append(_sized(m, limit, _details(result).sizing.to_dict()))  # type: ignore[arg-type]
            else:
                out.append(Threshold(CheckKey("longgen", m.key), m.op, float("nan"), m.label, "sized"))
        else:
            rule = _details(result).loop_rule if usable else None  # type: ignore[arg-type]
            teacher_forced = m.on != "value"  # late top-1, late KLD, drift: figures on the reference's continuation
            ok = not teacher_forced or rule is None or rule.informative
            out.append(Threshold(CheckKey("longgen", m.key), m.op, float(limit), m.label, on=m.on, informative=ok,
                                 why_uninformative=None if ok or rule is None else rule.why))
    return out
