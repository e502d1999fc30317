"""Gate 4's judge: each suite's figures from both models' marks (the paired table and the drop's
non-inferiority interval: Newcombe's for right/wrong marks; for scores, the paired mean difference or the
perplexity's log ratio with a normal interval), the flipped items and, for a scored suite, the documents that
lost the most; whether a suite can show a loss; its limits. qval.gates.tasks.run runs the suites.

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

import math
from typing import Any

from ...config import GateConfig
from ...metrics.estimate import Estimate, normal_ppf
from ...metrics.paired import (PairedCounts, informative, loglik_noninferiority, mean_noninferiority, noninferiority,
                               paired_counts)
from ...results import parse
from ...verdict import CheckKey, GateResult, Threshold
from .config import TaskSuite
from .metrics import TASKS
from .result import ScoreDrop, Suite, TasksDetails


def enabled(cfg: GateConfig) -> bool:
    return cfg.gates.tasks.enabled


def _suite_result(result: GateResult | None, label: str) -> Suite | None:
    if result is None or result.status != "ok":
        return None
    details = parse(TasksDetails, result.details, "gate tasks' result")
    return next((s for s in details.suites if s.suite == label), None)


def _informative(suite: TaskSuite, s: Suite | None) -> tuple[bool, str | None]:
    """Informative when the REFERENCE is clearly above chance on the suite (its one-sided
    (1 − α) Wilson lower bound exceeds it): a task the reference cannot do shows no loss."""
    if s is None:
        return True, None  # the check fails for the missing result, as any other
    if s.scored:
        return _score_informative(suite, s, s.score)
    c = PairedCounts(**s.marks[1].to_dict())
    chance = suite.chance if suite.chance is not None else s.default_chance  # the config's, even on a stored result
    if informative(c.ref_correct, c.n, chance, suite.alpha):
        return True, None
    return False, (f"the reference itself answers {c.ref_correct} of {c.n} items of suite {suite.label}, not clearly "
                   f"above chance ({chance:.3g})")


def _score_informative(suite: TaskSuite, s: Suite, st: ScoreDrop) -> tuple[bool, str | None]:
    """A score suite is informative unless its config sets a `chance` the reference's mean score
    does not clearly exceed (its one-sided (1 − α) lower bound); a perplexity has no chance."""
    if suite.chance is None or s.kind == "loglik":
        return True, None
    assert st.ref_mean is not None and st.ref_stderr is not None  # a mean score's figures
    bound = st.ref_mean - normal_ppf(1 - suite.alpha) * st.ref_stderr
    if bound > suite.chance:
        return True, None
    return False, (f"the reference's mean score on suite {suite.label} is {st.ref_mean:.4g}, not clearly above "
                   f"chance ({suite.chance:.3g})")


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    out = []
    drop, flips = TASKS.by_field("margin"), TASKS.by_field("max_flip_rate")
    for suite in cfg.gates.tasks.suites:
        s = _suite_result(result, suite.label)
        ok, why = _informative(suite, s)
        det = s.drop.detectable_drop if s else None
        what = "accuracy drop (reference − candidate)" if s is None or not s.scored else f"drop in {s.score.unit}"
        out.append(Threshold(CheckKey("tasks", drop.key, suite.label), drop.op, suite.margin,
                             drop.describe(what=what, suite=suite.label, level=f"{1 - suite.alpha:.0%}"), "absolute",
                             det, on=drop.on, informative=ok, why_uninformative=why, detectable=det))
        if suite.max_flip_rate is not None:
            out.append(Threshold(CheckKey("tasks", flips.key, suite.label), flips.op, suite.max_flip_rate,
                                 flips.describe(suite=suite.label), on=flips.on, informative=ok, why_uninformative=why))
    return out


def summarize(cfg: GateConfig, suites: list[dict[str, Any]], seconds: float) -> GateResult:
    """Per suite: the paired table, non-inferiority of the drop, and the flipped items; `suites`
    holds each suite's rows (ref_right, cand_right, answers) as `run` produced them."""
    g = cfg.gates.tasks
    by_label = {s.label: s for s in g.suites}
    measurements: dict[str, Estimate] = {}
    out = []
    for s in suites:
        suite = by_label[s["suite"]]
        rows = s.pop("rows")
        if s.get("kind") in ("mean", "loglik"):
            out.append(summarize_scores(suite, s, rows, measurements))
            continue
        c = paired_counts([r["ref_right"] for r in rows], [r["cand_right"] for r in rows])
        ni = noninferiority(c, suite.margin, alpha=suite.alpha, beta=suite.beta)
        L = s["suite"]
        measurements[drop_key(L)] = Estimate(ni["drop"], None, ni["lo"], ni["hi"], c.n)
        measurements[f"flip_rate@{L}"] = Estimate(ni["flip_rate"], None, *ni["flip_interval"], c.n)
        measurements[f"ref_accuracy@{L}"] = Estimate(ni["ref_accuracy"], None, *ni["ref_interval"], c.n)
        measurements[f"cand_accuracy@{L}"] = Estimate(ni["cand_accuracy"], None, *ni["cand_interval"], c.n)
        flips = [{"suite": L, **r} for r in rows if r["ref_right"] != r["cand_right"]]
        s["chance"] = suite.chance if suite.chance is not None else s["default_chance"]
        if "lmeval" in s:
            s["lmeval"]["qval_reference"], s["lmeval"]["qval_candidate"] = ni["ref_accuracy"], ni["cand_accuracy"]
        out.append({**s, "n": c.n, "counts": c.to_dict(), "drop": ni, "flipped": flips, "alpha": suite.alpha,
                    "interval": f"Newcombe paired, two-sided {1 - 2 * suite.alpha:.0%} (its upper end is the one-sided "
                                f"{1 - suite.alpha:.0%} bound); flip and net-loss intervals Clopper–Pearson 95%"})
    notes = [s["shortfall"] for s in out if s.get("shortfall")]
    details = TasksDetails(suites=out, **({"shortfall": "; ".join(notes)} if notes else {}))
    return GateResult("tasks", "ok", measurements=measurements, details=details, seconds=seconds)


def drop_key(label: str) -> str:
    """The measurement that holds suite `label`'s paired drop (reference − candidate, in its unit)."""
    return f"drop@{label}"


def worst_drop(gate: dict[str, Any]) -> float | None:
    """The largest paired drop over the suites of gate 4's stored result (report.json's gates.tasks),
    read by each suite's key; None when no suite has one, or the gate did not finish (`ranking` orders
    candidates by it)."""
    if gate.get("status") != "ok":
        return None
    ms = gate.get("measurements") or {}
    suites = parse(TasksDetails, gate.get("details"), "report.json's gate tasks").suites
    drops = [(ms.get(drop_key(s.suite)) or {}).get("value") for s in suites]
    drops = [d for d in drops if d is not None]
    return max(drops) if drops else None


SHOWN_DROPS = 5  # items of a score suite listed in the report: the largest per-item drops


def summarize_scores(suite: TaskSuite, s: dict[str, Any], rows: list[dict[str, Any]],
                     measurements: dict[str, Estimate]) -> dict[str, Any]:
    """A suite marked by a per-document score (kind "mean") or a perplexity (kind "loglik"): the
    paired drop with its interval, and the documents that lost the most."""
    L, info = s["suite"], s.get("lmeval", {})
    if s["kind"] == "loglik":
        bpb = info.get("aggregation") == "bits_per_byte"
        st = loglik_noninferiority([r["ref_ll"] for r in rows], [r["cand_ll"] for r in rows], [r["weight"] for r in rows],
                                   suite.margin, suite.alpha, suite.beta, scale=1 / math.log(2) if bpb else 1.0)
        ref_v, cand_v = (st["ref_bpb"], st["cand_bpb"]) if bpb else (st["ref_ppl"], st["cand_ppl"])
        unit = ("bits per byte: candidate − reference" if bpb else
                "ln(perplexity_candidate / perplexity_reference), the log-likelihood lost per "
                f"{'word' if info.get('metric') == 'word_perplexity' else 'byte' if info.get('metric') == 'byte_perplexity' else 'document'}")
        per_item = [(r["ref_ll"] - r["cand_ll"]) / r["weight"] if r["weight"] else 0.0 for r in rows]
        ref_est, cand_est = Estimate(ref_v, n=st["n"]), Estimate(cand_v, n=st["n"])
    else:
        higher = bool(info.get("higher_is_better", True))
        st = mean_noninferiority([r["ref_score"] for r in rows], [r["cand_score"] for r in rows], suite.margin,
                                 suite.alpha, suite.beta, higher_is_better=higher)
        ref_v, cand_v = st["ref_mean"], st["cand_mean"]
        unit = f"mean {info.get('metric', 'score')} per document: " + ("reference − candidate" if higher else "candidate − reference")
        per_item = [(r["ref_score"] - r["cand_score"]) * (1 if higher else -1) for r in rows]
        ref_est, cand_est = Estimate(ref_v, None, *st["ref_interval"], st["n"]), Estimate(cand_v, None, *st["cand_interval"], st["n"])
    st.update(ref_value=ref_v, cand_value=cand_v, unit=unit)
    measurements[drop_key(L)] = Estimate(st["drop"], st["stderr"], st["lo"], st["hi"], st["n"])
    measurements[f"ref_score@{L}"] = ref_est
    measurements[f"cand_score@{L}"] = cand_est
    if info:
        info["qval_reference"], info["qval_candidate"] = ref_v, cand_v
    order = sorted(range(len(rows)), key=lambda i: -per_item[i])
    largest = [{"suite": L, **rows[i], "item_drop": per_item[i]} for i in order[:SHOWN_DROPS] if per_item[i] > 0]
    z = normal_ppf(1 - suite.alpha)
    return {**s, "n": st["n"], "drop": st, "flipped": [], "largest_drops": largest, "alpha": suite.alpha,
            "chance": suite.chance,
            "interval": f"normal, two-sided {1 - 2 * suite.alpha:.0%} (drop ± {z:.3f} standard errors; its upper end is "
                        f"the one-sided {1 - suite.alpha:.0%} bound)" + ("; ratio estimator over the weights" if s["kind"] == "loglik" else "")}
