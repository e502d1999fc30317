"""Gate 3 — long-generation stability (default 2048 new tokens, EOS suppressed).

Both models decode greedily from the same prompts. Two kinds of evidence, per window of
`window` positions:

- Teacher-forced drift: the candidate scores the REFERENCE's continuation (so both models see
  the same tokens) through its KV cache, `piece` tokens at a time, exactly as decoding fills
  the cache; per window, top-1 agreement and mean KLD(ref‖cand). Quantization error that
  accumulates with context (an FP8 KV cache is the classic case) shows as late windows (the
  last `edge` positions) worse than early ones (the first `edge`): drift = late − early.
- Health of each model's OWN continuation: seq-rep-4, distinct-2, a loop detector, premature
  EOS, non-finite logits, and the reference's NLL of the text ("judge NLL").

Small models loop under greedy decoding by themselves, so every health figure is compared with
the reference's own continuation of the same prompt: the gate fails on collapse the reference
does not show. The per-window series go to report.json for plotting.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np
import torch

from ...config import GateConfig
from ...data import dataset_identity, load_dataset
from ...errors import DataError, StorageError
from ...io import atomic_write
from ...gate_metrics import Spread
from ...shortfall import shortfall
from ...metrics.tokens import first_nonfinite
from ...progress import SILENT
from ...reference import GenerationSettings, paired_generations, render_prompts
from ...snapshot.engine import ReferenceAbsent
from ...verdict import GateResult
from ..base import GateContext, GateSpec, candidate_dependent
from ..teacher_forced import judge_nll, judge_nll_rows, rows_at_once, teacher_forced, teacher_forced_rows  # noqa: F401
from .judge import enabled, summarize, thresholds
from .metrics import LONGGEN


def prompt_records(ctx: GateContext) -> list[dict[str, Any]]:
    return records_for(ctx.config)[0]


def records_for(cfg: GateConfig) -> tuple[list[dict[str, Any]], str | None]:
    """The prompts the gate generates from (the first max_prompts) and a shortfall note when the
    file holds fewer than max_prompts; no model needed (qval validate runs it too)."""
    g = cfg.gates.longgen
    ds = load_dataset(g.prompts, cfg.resolve(g.prompts))
    records = ds.records[: g.max_prompts] if g.max_prompts else ds.records
    for i, r in enumerate(records):
        if not isinstance(r.get("prompt"), str) or not r["prompt"].strip():
            raise DataError(f"{g.prompts}: record {i} needs a non-empty string field 'prompt' (optional: id, lang, kind).")
    note = shortfall("gates.longgen.max_prompts", g.max_prompts, len(records), "prompts", cfg.max_shortfall) if g.max_prompts else None
    return records, note


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    return records_for(cfg)[1]


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    g = ctx.config.gates.longgen
    records, note = records_for(ctx.config)
    prompts, rendering = render_prompts(ctx.tokenizer, [r["prompt"] for r in records])
    settings = GenerationSettings(new_tokens=g.new_tokens, suppress_eos=g.suppress_eos, batch_size=g.batch_size)
    ref, cand, paired = paired_generations(ctx, prompts, settings, "gate 3")
    progress = ctx.progress or SILENT
    info: dict[str, Any] = {"prompts_file": g.prompts, "prompts": len(prompts), "rendering": rendering, "new_tokens": g.new_tokens,
                            "suppress_eos": g.suppress_eos, "window": g.window, "edge": g.edge, "piece": g.piece,
                            "reference_generation": ref.describe(), "candidate_generation_seconds": paired["candidate_seconds"],
                            "generated_side_by_side": paired["side_by_side"]}
    if note:
        info["shortfall"] = note
    for name, gen in (("reference", ref.generation), ("candidate", cand)):
        bad = [(i, s) for i, s in enumerate(gen.first_nonfinite_step) if s is not None]
        if bad:
            status = "error" if name == "reference" else "nonfinite"
            return GateResult("longgen", status, details=info, seconds=time.perf_counter() - t0,
                              error=f"the {name} produced non-finite logits while generating: prompt {bad[0][0]}, step {bad[0][1]}")

    seqs: list[dict[str, Any]] = []
    rows = rows_at_once(ctx)
    info["teacher_forced_rows"] = rows
    with progress.task("gate 3: teacher-forced drift and judge NLL", len(prompts)) as advance:
        for b0 in range(0, len(prompts), rows):
            idx = list(range(b0, min(b0 + rows, len(prompts))))
            tfs = teacher_forced_rows(ctx, [prompts[i] for i in idx], [ref.generation.tokens[i] for i in idx], g.piece)
            for i, tf in zip(idx, tfs):
                if (j := first_nonfinite(torch.from_numpy(tf["finite_ref"]))) is not None:
                    return GateResult("longgen", "error", details=info, seconds=time.perf_counter() - t0,
                                      error=f"the REFERENCE produced non-finite logits on its own continuation of prompt {i}, position {j}")
                if (j := first_nonfinite(torch.from_numpy(tf["finite_cand"]))) is not None:
                    return GateResult("longgen", "nonfinite", details=info, seconds=time.perf_counter() - t0,
                                      error=f"the candidate produced non-finite logits scoring the reference's continuation of prompt {i}, position {j}")
            # an identical continuation needs no second pass: its judge NLL is the reference's own
            judges: dict[int, np.ndarray | None] = {i: tf["nll_ref"] for i, tf in zip(idx, tfs)}
            differ = [i for i in idx if cand.tokens[i] != ref.generation.tokens[i]]
            if differ:
                try:
                    with candidate_dependent(ctx):
                        judges.update(zip(differ, judge_nll_rows(ctx, [prompts[i] for i in differ], [cand.tokens[i] for i in differ], g.piece)))
                except ReferenceAbsent:  # a sequential run: judged once the reference is back (complete)
                    judges.update(dict.fromkeys(differ))
            for i, tf in zip(idx, tfs):
                seqs.append({"tf": tf, "judge_cand": judges[i], "ref": ref.generation.tokens[i], "cand": cand.tokens[i],
                             "prompt": prompts[i]})
            advance(len(idx))
    rest = (records, seqs, ref.generation.eos_step, cand.eos_step, info)
    if any(x["judge_cand"] is None for x in seqs):
        atomic_write(ctx.folder / PENDING, lambda path: path.write_bytes(pickle.dumps(rest)))
        pending = sum(x["judge_cand"] is None for x in seqs)
        return GateResult("longgen", "pending", details={**info, "pending_judge": pending}, seconds=time.perf_counter() - t0,
                          error=f"the reference's judge of {pending} candidate continuations waits for the reference")
    return summarize(ctx.config, *rest, time.perf_counter() - t0)


PENDING = "pending_judge.pkl"
#: how the judge-NLL figure is taken over prompts, as its row in LONGGEN (metrics.py) is sized ("median")
JUDGE_STATISTIC = next(m.sizing.statistic for m in LONGGEN.metrics if m.key == "judge_nll_excess" and isinstance(m.sizing, Spread))


def complete(ctx: GateContext, result: GateResult) -> GateResult:
    """A sequential run's last phase: the reference (back in memory) judges the candidate's
    continuations the candidate phase could not, then the gate is summarized as `run` would."""
    t0 = time.perf_counter()
    try:
        records, seqs, ref_eos, cand_eos, info = pickle.loads((ctx.folder / PENDING).read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
        raise StorageError(f"{ctx.folder / PENDING}: the candidate phase's continuations cannot be read ({err}); "
                           "delete the folder and run the gate again.") from None
    g = ctx.config.gates.longgen
    todo = [x for x in seqs if x["judge_cand"] is None]
    rows = rows_at_once(ctx)
    with candidate_dependent(ctx):
        for b0 in range(0, len(todo), rows):
            group = todo[b0 : b0 + rows]
            for x, judge in zip(group, judge_nll_rows(ctx, [x["prompt"] for x in group], [x["cand"] for x in group], g.piece)):
                x["judge_cand"] = judge
    return summarize(ctx.config, records, seqs, ref_eos, cand_eos, info, result.seconds + time.perf_counter() - t0)


# --- thresholds ------------------------------------------------------------------------------


def inputs(cfg: GateConfig) -> dict[str, Any]:
    g = cfg.gates.longgen
    # "judge": the judge-NLL figure's statistic, stored in the result: a result cached under the mean is not
    # read back as the median
    return {"gate": g.model_dump(mode="json", exclude=LONGGEN.cache_exclude()), "data": dataset_identity(g.prompts, cfg.resolve(g.prompts)),
            "judge": f"judge_nll_excess: {JUDGE_STATISTIC} over prompts"}


SPEC = GateSpec("longgen", run, thresholds, inputs, enabled, check=check, complete=complete)
