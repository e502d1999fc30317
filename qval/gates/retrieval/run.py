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

import torch

from ...config import GateConfig
from ...data import load_dataset, read_texts, token_stream
from ...errors import DataError
from ...metrics.tokens import token_stats
from ...progress import SILENT
from ...verdict import GateResult
from ...snapshot.engine import NOT_IN_MEMORY, ReferenceAbsent
from ..base import GateContext, GateSpec, candidate_dependent, context_problem, max_positions, section_inputs
from ..needles import Trial, build_trials, starts_with_digit
from .judge import enabled, summarize, thresholds
from .metrics import RETRIEVAL

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


def inputs(cfg: GateConfig) -> dict[str, Any]:
    return section_inputs(cfg, cfg.gates.retrieval, RETRIEVAL, cfg.gates.retrieval.haystack)


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    g = cfg.gates.retrieval
    if tokenizer is None:
        read_texts(g.haystack, cfg.resolve(g.haystack))
    else:
        trials_from(cfg, tokenizer)  # every cell of the matrix can be built, or a DataError says why not
    return None


SPEC = GateSpec("retrieval", run, thresholds, inputs, enabled,
                context=lambda c: ("gates.retrieval.lengths (the longest and 16 answer tokens)",
                                   max(c.gates.retrieval.lengths) + 16), check=check)
