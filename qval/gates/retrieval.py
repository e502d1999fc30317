"""The retrieval matrix — context length × needle depth, both models, paired per trial.

Each trial (`needles.py`) is a long prompt whose answer is a six-digit pass code hidden in it.
Each engine prefills the prompt into its KV cache and reads the true code back through the cache
(a quantized KV cache holds the whole haystack when the code is read), so one pass per model
gives both the greedy exact-match mark (every code token is the model's argmax, and the
number ends there) and the candidate's KLD/top-1 on the answer tokens. Trials whose marks differ
are then decoded greedily by both models, so the report lists what each actually answered.

The rule is non-inferiority per length and pooled: the one-sided (1 − α) upper bound of the
accuracy drop (Newcombe's paired interval) must not exceed the margin. A length the reference
itself cannot solve (accuracy below `min_reference_accuracy`) is "uninformative", never a pass.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..config import GateConfig
from ..data import dataset_identity, load_dataset, read_texts, token_stream
from ..metrics import mean_estimate
from ..metrics.estimate import Estimate
from ..metrics.paired import PairedCounts, noninferiority, paired_counts, wilson_interval
from ..errors import DataError
from ..gate_metrics import RETRIEVAL
from ..metrics.tokens import token_stats
from ..progress import SILENT
from ..verdict import GateResult, Threshold
from ..snapshot.engine import NOT_IN_MEMORY, ReferenceAbsent
from .base import GateContext, GateSpec, candidate_dependent, context_problem, max_positions
from .needles import Trial, build_trials, starts_with_digit

ANSWER_TOKENS = 10  # greedy tokens decoded to show a discordant trial's answers


def trials_for(ctx: GateContext) -> tuple[list[Trial], dict[str, Any]]:
    return trials_from(ctx.config, ctx.tokenizer)


def trials_from(cfg: GateConfig, tokenizer: Any) -> tuple[list[Trial], dict[str, Any]]:
    """Every trial of the matrix from the haystack and the tokenizer alone (qval validate runs it too):
    all lengths × depths × trials, or a DataError; the matrix is never silently smaller."""
    g = cfg.gates.retrieval
    ds = load_dataset(g.haystack, cfg.resolve(g.haystack))
    stream = token_stream(ds.texts(), tokenizer, tokenizer.eos_token_id)
    trials = build_trials(tokenizer, stream, g.lengths, g.depths, g.trials, cfg.seed)
    info = {"haystack": g.haystack, "haystack_tokens": len(stream), "lengths": g.lengths, "depths": g.depths,
            "trials_per_cell": g.trials, "trials": len(trials),
            "rendering": "chat_template" if getattr(tokenizer, "chat_template", None) else "raw"}
    return trials, info


def mark(tokenizer: Any, logits: torch.Tensor, trial: Trial) -> tuple[bool, int | None]:
    """Exact match of greedy decoding from teacher-forced logits over the answer positions
    ([len(answer), V], row j predicts answer token j): right when each code token is the argmax
    and the next choice does not continue the number. Returns (right, first wrong answer token)."""
    top = logits.argmax(dim=-1).tolist()
    for j in range(trial.code_tokens):
        if top[j] != trial.answer[j]:
            return False, j
    if starts_with_digit(tokenizer, top[trial.code_tokens]):
        return False, trial.code_tokens
    return True, None


def score(ctx: GateContext, trial: Trial) -> dict[str, Any]:
    """Each model prefills the prompt into its KV cache and reads the true answer through it;
    figures on the answer positions only."""
    lr = ctx.reference.answer_logits(trial.prompt, trial.answer).float()
    lc = ctx.candidate.answer_logits(trial.prompt, trial.answer).float().to(lr.device)
    s = token_stats(lr, lc, torch.tensor(trial.answer))
    ref_right, ref_wrong_at = mark(ctx.tokenizer, lr, trial)
    cand_right, cand_wrong_at = mark(ctx.tokenizer, lc, trial)
    code = slice(0, trial.code_tokens)
    return {**trial.describe(), "ref_right": ref_right, "cand_right": cand_right,
            "ref_first_wrong": ref_wrong_at, "cand_first_wrong": cand_wrong_at,
            "answer_kld": float(s["kld"][code].mean()), "answer_top1": float(s["top1"][code].float().mean()),
            "finite_ref": bool(s["finite_ref"].all()), "finite_cand": bool(s["finite_cand"].all())}


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    g = ctx.config.gates.retrieval
    if (problem := context_problem(SPEC, ctx.config, max_positions(ctx))) is not None:
        raise DataError(problem)
    trials, info = trials_for(ctx)
    rows = []
    with (ctx.progress or SILENT).task(f"retrieval matrix: {len(trials)} trials, up to {max(g.lengths)} tokens", len(trials)) as advance:
        for i, t in enumerate(trials):
            r = score(ctx, t)
            if not r["finite_ref"]:
                return GateResult("retrieval", "error", details=info, seconds=time.perf_counter() - t0,
                                  error=f"the REFERENCE produced non-finite logits on retrieval trial {i} (length {t.length}, depth {t.depth})")
            if not r["finite_cand"]:
                return GateResult("retrieval", "nonfinite", details=info, seconds=time.perf_counter() - t0,
                                  error=f"the candidate produced non-finite logits on retrieval trial {i} (length {t.length}, depth {t.depth})")
            rows.append(r)
            advance(1)
    flipped = [i for i, r in enumerate(rows) if r["ref_right"] != r["cand_right"]]
    if flipped:  # what each model actually answers, by greedy decoding through its KV cache
        prompts = [trials[i].prompt for i in flipped]
        try:
            with candidate_dependent(ctx):  # which trials to answer depends on the candidate
                ref_text = [ctx.tokenizer.decode(t, skip_special_tokens=True)
                            for t in ctx.reference.generate(prompts, ANSWER_TOKENS, suppress_eos=False, batch_size=1).tokens]
        except ReferenceAbsent:  # a sequential run's candidate phase: the marks stand, the text is not shown
            ref_text = [NOT_IN_MEMORY] * len(prompts)
        cand_gen = ctx.candidate.generate(prompts, ANSWER_TOKENS, suppress_eos=False, batch_size=1)
        for k, i in enumerate(flipped):
            rows[i]["ref_answer"] = ref_text[k]
            rows[i]["cand_answer"] = ctx.tokenizer.decode(cand_gen.tokens[k], skip_special_tokens=True)
    return summarize(ctx.config, rows, info, time.perf_counter() - t0)


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
    details = {**info, "per_length": lengths, "cells": cells, "overall": {"counts": c_all.to_dict(), "drop": ni_all},
               "flipped": flips, "rows": rows, "alpha": g.alpha, "beta": g.beta,
               "interval": f"Newcombe paired, two-sided {1 - 2 * g.alpha:.0%} (its upper end is the one-sided {1 - g.alpha:.0%} bound)"}
    return GateResult("retrieval", "ok", measurements=measurements, details=details, seconds=seconds)


def _informative(cfg: GateConfig, result: GateResult | None, length: int | None) -> tuple[bool, str | None]:
    """A length (or the pooled matrix, `length` None) is informative when the REFERENCE solves at
    least `min_reference_accuracy` of its trials: a task the reference cannot do shows no loss."""
    g = cfg.gates.retrieval
    if result is None or result.status != "ok":
        return True, None  # the check fails for the missing result, as any other
    if length is None:
        c = PairedCounts(**result.details["overall"]["counts"])
    else:
        c = next(PairedCounts(**x["counts"]) for x in result.details["per_length"] if x["length"] == length)
    acc = c.ref_correct / c.n if c.n else 0.0
    if acc >= g.min_reference_accuracy:
        return True, None
    return False, (f"the reference itself answers {c.ref_correct} of {c.n} trials"
                   f"{'' if length is None else f' at {length} tokens'} (below min_reference_accuracy {g.min_reference_accuracy:g})")


def _detectable(result: GateResult | None, key: str, length: int | None) -> float | None:
    if result is None or result.status != "ok":
        return None
    d = result.details["overall"]["drop"] if length is None else next(x["drop"] for x in result.details["per_length"] if x["length"] == length)
    return d.get("detectable_drop")


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.retrieval
    out = []
    per, pooled, kld = (RETRIEVAL.by_field(f) for f in ("margin", "margin_overall", "max_answer_kld"))
    targets: list[tuple[str, int | None, float | None]] = [(f"{per.key}@{L}", L, g.margin) for L in g.lengths]
    targets.append((pooled.key, None, g.margin_overall))
    for metric, length, margin in targets:
        if margin is None:
            continue
        m = per if length else pooled
        ok, why = _informative(cfg, result, length)
        det = _detectable(result, metric, length)
        where = f"at {length} tokens of context" if length else "over the whole matrix"
        out.append(Threshold("retrieval", metric, m.op, margin, m.describe(where=where, level=f"{1 - g.alpha:.0%}"),
                             "absolute", det, on=m.on, informative=ok, why_uninformative=why, detectable=det))
    if g.max_answer_kld is not None:
        out.append(Threshold("retrieval", kld.key, kld.op, g.max_answer_kld, kld.label, on=kld.on))
    return out


def inputs(cfg: GateConfig) -> dict[str, Any]:
    g = cfg.gates.retrieval
    return {"gate": g.model_dump(mode="json", exclude=RETRIEVAL.cache_exclude()),
            "data": dataset_identity(g.haystack, cfg.resolve(g.haystack))}


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    g = cfg.gates.retrieval
    if tokenizer is None:
        read_texts(g.haystack, cfg.resolve(g.haystack))
    else:
        trials_from(cfg, tokenizer)  # every cell of the matrix can be built, or a DataError says why not
    return None


SPEC = GateSpec("retrieval", run, thresholds, inputs, lambda c: c.gates.retrieval.enabled,
                context=lambda c: ("gates.retrieval.lengths (the longest and 16 answer tokens)",
                                   max(c.gates.retrieval.lengths) + 16), check=check)
