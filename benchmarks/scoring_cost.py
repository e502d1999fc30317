"""Scoring cost: how fast the gates score the reference and the candidate against the bare forward passes
of the same tokens, and the memory they take.

On a random-weight Llama layout (`--shape 8b`, bf16 on a GPU) or the built-in model (`--shape real`)
and its FP8 fake-quant candidate, calibrated and built through qval's own pipeline, in one process:

- `gate1`: gate 1 exactly as `qval gate` runs it (both models, per-position KLD/top-1/Δp/NLL on the
  device, arrays written) against the same chunks through the two models' forwards alone, at two
  token budgets (16,384 and 65,536), with the peak GPU memory above the resident models at each;
- `long`: gate 1 at depth (8k context, `--pieces` piece sizes in turn) and the retrieval matrix
  (2,048–8,192 tokens) through `run_gate`, FP8 weights and FP8 KV cache: each gate's seconds and
  peak memory from the report's stage table, tokens per second, and the ratio to the FLOP floor
  (2 models × 2 × matmul parameters × tokens ÷ the bf16 matmul peak measured in the run; causal
  attention's own FLOPs given apart); then the depth chunks through both engines' `logits_pieces`
  alone, per piece size;
- `teacher_forced`: gate 3's teacher-forced passes (`qval.gates.teacher_forced`: the candidate and
  the reference over the reference's text, the reference over the candidate's) over 8 prompts ×
  2,048 tokens, one row at a time and 8 rows at once, against the same pieces without statistics
  and against whole-sequence forwards.

    python3 benchmarks/lib/nojit.py benchmarks/scoring_cost.py --tokenizer .tok --out DIR     # a GPU
    python3 benchmarks/scoring_cost.py --smoke --out DIR                                      # anywhere, toy shape

Random weights cost what trained ones cost for every kernel here; the gates' figures on them mean
nothing and are never reported as quality. DIR/scoring.json holds every figure.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from lib import measure, setup, shapes  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (first: it imports engines, gates and reference in an order that resolves)

STEPS = "gate1,long,teacher_forced"
LONG = dict(calib=(32, 512), agreement=dict(tokens=8192, ctx=512), depth=dict(ctx=8192, tokens=32768), pieces=(2048, 8192, 512),
            retrieval=dict(lengths=[2048, 4096, 8192], depths=[0.0, 0.25, 0.5, 0.75, 1.0], trials=2))
LONG_SMOKE = dict(calib=(4, 64), agreement=dict(tokens=512, ctx=128), depth=dict(ctx=256, tokens=512), pieces=(128, 256),
                  retrieval=dict(lengths=[160, 256], depths=[0.0, 0.5, 1.0], trials=1))


# ---- gate 1 against its forwards


def gate1(built: setup.Built, tok: Any, spec: dict[str, Any], data: dict[str, Path], work: Path, plan: dict[str, Any]) -> dict[str, Any]:
    return measure.scoring(built.reference, built.candidate, tok,
                           lambda n: setup.gate_config("scoring", spec, data, work / "scoring", plan, n),
                           work / "scoring_gate1", plan["budgets"], plan["reps"])


# ---- the long-context gates


def model_facts(model: Any) -> dict[str, Any]:
    c = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    total = shapes.parameters(model)
    # parameters that take part in a matmul per token: all but an untied input embedding (a lookup)
    return {"parameters": total, "matmul_parameters": total - (0 if tied else embed.numel()),
            "head_parameters": head.weight.numel() if head is not None else 0,
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "layers": c.num_hidden_layers, "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads}


def attention_flops(m: dict[str, Any], length: int) -> float:
    """QKᵀ and PV of one causal sequence of `length` tokens, all layers: 2 × 2 × L²/2 × H × d each."""
    return 2.0 * m["layers"] * length * length * m["heads"] * m["head_dim"]


def floors(m: dict[str, Any], hw: dict[str, Any], tokens: int, attn_flops: float, forwards: int, seconds: float | None) -> dict[str, Any]:
    """The FLOP and weight-read floors of work that puts `tokens` through BOTH models."""
    peak, bw = hw.get("matmul_flops_per_s"), hw.get("bytes_per_s")
    flop = 2 * 2.0 * m["matmul_parameters"] * tokens
    out: dict[str, Any] = {"tokens_both_models": tokens, "linear_flops": flop, "attention_flops": 2 * attn_flops, "forwards": forwards}
    if peak:
        out["flop_floor_s"] = flop / peak
        out["flop_floor_with_attention_s"] = (flop + 2 * attn_flops) / peak
    if bw:
        out["weight_floor_s"] = forwards * m["weight_bytes"] / bw
    if seconds and peak:
        out["of_flop_peak"] = out["flop_floor_s"] / seconds
        out["of_flop_peak_with_attention"] = out["flop_floor_with_attention_s"] / seconds
    if seconds:
        out["tokens_per_s"] = tokens / seconds
    return out


def long_config(plan: dict[str, Any], spec: dict[str, Any], report_dir: Path, piece: int, name: str) -> Any:
    from qval.config import parse_config

    samples, seq_len = plan["calib"]
    loose = {"min_top1": 0.0, "max_mean_kld": 1e9, "max_p99_kld": 1e9}
    cfg = {"name": name, "model": spec, "quant": {"format": "fp8", "kv_cache": "fp8", "exclude": ["*lm_head*"]},
           "calibration": {"dataset": "calib_data/general_mix.jsonl", "samples": samples, "seq_len": seq_len},
           "gates": {"agreement": {"dataset": "calib_data/heldout_eval.jsonl", **plan["agreement"], **loose},
                     "depth": {"enabled": True, "dataset": "calib_data/longctx_docs.jsonl", **plan["depth"], "piece": piece, **loose},
                     "retrieval": {"enabled": True, "haystack": "calib_data/longctx_docs.jsonl", **plan["retrieval"],
                                   "margin": 1.0, "margin_overall": 1.0, "min_reference_accuracy": 0.01}},
           "report": {"dir": str(report_dir)}, "diagnostics": {"enabled": False, "sensitivity": "never"}, "seed": 0}
    return parse_config(cfg, f"<scoring long, depth piece {piece}>")


def retrieval_work(cfg: Any, tok: Any, m: dict[str, Any], hw: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    """What the retrieval gate put through both models (the trials rebuilt as the gate builds them:
    each prompt prefilled whole, the lm_head on its last position only, then the answer but its last token)."""
    from qval.gates.base import GateContext
    from qval.gates.retrieval.run import trials_for

    ctx = GateContext(config=cfg, reference=None, candidate=None, tokenizer=tok, folder=Path("."))
    trials, _ = trials_for(ctx)
    answers = sum(len(t.answer) for t in trials)
    lens = [len(t.prompt) + len(t.answer) - 1 for t in trials]
    fwd = sum(1 + (len(t.answer) > 1) for t in trials)
    out = floors(m, hw, sum(lens), sum(attention_flops(m, n) for n in lens), 2 * fwd, seconds)
    head = 2 * 2.0 * m["head_parameters"] * (sum(lens) - answers)  # lm_head work the prefill skips
    out["linear_flops"] -= head
    if hw.get("matmul_flops_per_s"):
        for k in ("flop_floor_s", "flop_floor_with_attention_s"):
            out[k] -= head / hw["matmul_flops_per_s"]
        if seconds:
            out["of_flop_peak"] = out["flop_floor_s"] / seconds
            out["of_flop_peak_with_attention"] = out["flop_floor_with_attention_s"] / seconds
    return {"trials": len(trials), "answer_tokens": answers, "max_scored_tokens": max(lens, default=0), "forwards_per_model": fwd,
            "floors": out}


def long_context(loaded: Any, tok: Any, spec: dict[str, Any], work: Path, hw: dict[str, Any], plan: dict[str, Any],
                 pieces: list[int], run: setup.Run) -> dict[str, Any]:
    """Gate 1 at depth at each piece size and the retrieval matrix, through run_gate; then the depth
    chunks through both engines' forwards alone. Memory: each stage's peak from the report; "above the
    models" subtracts what was resident before the run and the candidate's weights (a copy of the
    reference's, as fake quantization keeps them)."""
    import torch

    from qval import pipeline
    from qval.gates.base import GateContext
    from qval.gates.depth import run as depth_gate
    from qval.progress import Progress

    m = model_facts(loaded.model)
    out: dict[str, Any] = {"model": {"name": loaded.name, **m}, "runs": [], "forwards_alone": []}
    cuda = torch.cuda.is_available()
    for piece in pieces:
        if run.left() < 90:
            out["runs"].append({"depth_piece": piece, "skipped": f"{run.left():.0f} s left of --deadline"})
            continue
        cfg = long_config(plan, spec, work / "reports_long", piece, f"long-{spec.get('path', 'real').rsplit('_', 1)[-1]}")
        resident = torch.cuda.memory_allocated() if cuda else None
        t0 = time.perf_counter()
        result = pipeline.run_gate(cfg, progress=Progress(enabled=True), reference=loaded)
        wall = time.perf_counter() - t0
        rep, gates = result.report, {}
        for name, g in rep.get("gates", {}).items():
            stage = (rep.get("stages") or {}).get(f"gate_{name}", {})
            secs, peak = stage.get("seconds"), (stage.get("memory") or {}).get("peak_cuda_bytes")
            entry: dict[str, Any] = {"status": g.get("status"), "stage_seconds": secs, "cached": stage.get("cached"), "peak_bytes": peak,
                                     "peak_above_models_bytes": peak - resident - m["weight_bytes"] if peak and resident is not None else None}
            d = g.get("details", {}) or {}
            if name == "agreement":
                a = cfg.gates.agreement
                n = int(d.get("chunks", 0))
                entry["floors"] = floors(m, hw, n * a.ctx, n * attention_flops(m, a.ctx), 2 * -(-n // a.batch_size), secs)
            elif name == "depth":
                ctx, n = int(d.get("ctx", 0)), int(d.get("chunks", 0))
                entry["floors"] = floors(m, hw, n * ctx, n * attention_flops(m, ctx), 2 * n * -(-ctx // piece), secs)
            elif name == "retrieval":
                entry.update(retrieval_work(cfg, tok, m, hw, secs))
            gates[name] = entry
        out["runs"].append({"depth_piece": piece, "wall_s": wall, "gates": gates, "approved": result.verdict.approved})
        del result
        built = setup.calibrate_and_build(loaded, cfg)  # the calibration is the run's, reused
        ctx = GateContext(config=cfg, reference=built.reference, candidate=built.candidate, tokenizer=tok, folder=work / "plain")
        chunks, _ = depth_gate.scored_chunks(ctx)
        dev = built.reference.device
        measure.sync(dev)
        t0 = time.perf_counter()
        for ids in chunks:
            x = torch.tensor([ids])
            for lr, lc in zip(built.reference.logits_pieces(x, piece), built.candidate.logits_pieces(x, piece)):
                del lr, lc
        measure.sync(dev)
        secs = time.perf_counter() - t0
        depth_secs = gates.get("depth", {}).get("stage_seconds")
        out["forwards_alone"].append({"piece": piece, "seconds": secs, "gate_over_forwards": depth_secs / secs if depth_secs else None,
                                      "floors": floors(m, hw, len(chunks) * len(chunks[0]), len(chunks) * attention_flops(m, len(chunks[0])),
                                                       2 * len(chunks) * -(-len(chunks[0]) // piece), secs)})
        del built, ctx
        setup.free(dev)
        run.save()
    return out


# ---- gate 3's teacher-forced passes


def teacher_forced(ref: Any, cand: Any, tok: Any, prompts: list[list[int]], new_tokens: int, piece: int, rows: int,
                   reps: int, before: bool = True) -> dict[str, Any]:
    """Gate 3's three passes per prompt (reference and candidate over the reference's text, the
    reference over the candidate's), one row at a time and `rows` at a time, against bare forwards."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from qval.gates import teacher_forced as tf

    vocab = min(len(tok), ref.model.config.vocab_size)
    rng = random.Random(0)
    conts = [[rng.randrange(200, vocab) for _ in range(new_tokens)] for _ in prompts]
    other = [[rng.randrange(200, vocab) for _ in range(new_tokens)] for _ in prompts]  # "the candidate's" text
    ctx = SimpleNamespace(reference=ref, candidate=cand, tokenizer=tok)
    pad = tok.pad_token_id or 0

    def padded(k: int, b0: int, texts: list[list[int]]) -> Any:
        seqs = [p + c for p, c in zip(prompts[b0 : b0 + k], texts[b0 : b0 + k])]
        width = max(len(x) for x in seqs)
        return torch.tensor([x + [pad] * (width - len(x)) for x in seqs])

    def passes(k: int) -> None:
        for b0 in range(0, len(prompts), k):
            tf.teacher_forced_rows(ctx, prompts[b0 : b0 + k], conts[b0 : b0 + k], piece)
            tf.judge_nll_rows(ctx, prompts[b0 : b0 + k], other[b0 : b0 + k], piece)

    def forwards(k: int) -> None:
        """The same three passes' tokens as whole-sequence forwards, `k` rows per forward."""
        for b0 in range(0, len(prompts), k):
            for engine, texts in ((ref, conts), (cand, conts), (ref, other)):
                engine.logits(padded(k, b0, texts))

    def pieces_only(k: int) -> None:
        """The same pieces through the KV cache (right-padded rows, as the gate walks them), no statistics."""
        for b0 in range(0, len(prompts), k):
            for engine, texts in ((ref, conts), (cand, conts), (ref, other)):
                for _ in engine.logits_pieces(padded(k, b0, texts), piece):
                    pass

    out: dict[str, Any] = {"prompts": len(prompts), "new_tokens": new_tokens, "piece": piece, "rows": rows,
                           "tokens_per_pass": sum(len(p) + new_tokens for p in prompts)}
    for name, fn in (("gate_1row", lambda: passes(1)), ("gate_rows", lambda: passes(rows)),
                     ("pieces_only_1row", lambda: pieces_only(1)), ("pieces_only_rows", lambda: pieces_only(rows)),
                     ("forward_1row", lambda: forwards(1)), ("forward_rows", lambda: forwards(rows))):
        if not before and name.endswith("_1row") and name != "forward_1row":
            continue
        secs = measure.timed(fn, ref.device, reps, warmup=1)
        out[name] = {"median_s": statistics.median(secs), "reps": secs}
        print(f"[scoring] teacher_forced {name}: {out[name]['median_s']:.2f} s", flush=True)
    best_forward = min(out["forward_1row"]["median_s"], out["forward_rows"]["median_s"])
    if before:
        out["ratio_forward_over_gate_1row"] = best_forward / out["gate_1row"]["median_s"]
    out["ratio_forward_over_gate_rows"] = best_forward / out["gate_rows"]["median_s"]
    out["ratio_pieces_over_gate_rows"] = out["pieces_only_rows"]["median_s"] / out["gate_rows"]["median_s"]
    # the figures themselves: rows at once against one at a time (kernels of another batch shape)
    a = tf.teacher_forced_rows(ctx, prompts[:rows], conts[:rows], piece)
    b = [tf.teacher_forced_rows(ctx, [p], [c], piece)[0] for p, c in zip(prompts[:rows], conts[:rows])]
    out["rows_vs_1row"] = {k: {"max_abs_diff": float(max(np.nanmax(np.abs(x[k].astype(float) - y[k].astype(float))) for x, y in zip(a, b))),
                               "mean_1row": float(np.mean([y[k].astype(float).mean() for y in b]))}
                           for k in ("kld", "nll_ref", "nll_cand", "top1")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    setup.common_args(ap, STEPS, "scoring_out")
    ap.add_argument("--pieces", help="long: comma list of depth piece sizes, run in order (default 2048,8192,512)")
    ap.add_argument("--skip-before", action="store_true", help="teacher_forced: only the rows-at-once variant (the one-row figures stand)")
    args = ap.parse_args(argv)
    import torch

    dev = setup.device()
    if args.deterministic:
        from qval import determinism

        determinism.configure(dev)  # before the first CUDA work, as load_model does
    plan = setup.SMOKE if args.smoke else setup.FULL
    long_plan = LONG_SMOKE if args.smoke else LONG
    shape = "smoke" if args.smoke else args.shape
    out = Path(args.out)
    work = out / "work"
    run = setup.Run(out / "scoring.json", args.only, args.deadline)
    run.results["bandwidth"] = bw = measure.hbm_bandwidth(dev, gib=0.25 if args.smoke else 2.0, reps=5 if args.smoke else 20)
    hw: dict[str, Any] = {"bytes_per_s": bw["bytes_per_s"]}
    if run.wants("long"):
        mm = run.step("long:matmul", 10, lambda: measure.matmul_tflops(dev, n=512 if args.smoke else 8192, reps=3 if args.smoke else 10))
        if isinstance(mm, dict) and "tflops" in mm:
            hw["matmul_flops_per_s"] = mm["tflops"] * 1e12
    tok = setup.load_tokenizer(args.tokenizer, args.gguf if shape == "real" else None)
    loaded, spec = setup.load_shape(shape, tok, dev, work, args.gguf)
    run.results["model"] = {"name": loaded.name, "weight_bytes": shapes.weight_bytes_per_step(loaded.model)}
    if run.wants("gate1", "teacher_forced"):
        data = setup.bench_data(plan, tok, work, max(plan["budgets"]))
        built = setup.calibrate_and_build(loaded, setup.gate_config("scoring", spec, data, work / "reports", plan))
        run.step("gate1", 60, lambda: gate1(built, tok, spec, data, work, plan))
        new_tokens, piece, rows = (48, 32, 2) if args.smoke else (2048, 256, 8)
        prompts = setup.longgen_prompts(tok)[: 2 if args.smoke else None]
        run.step("teacher_forced", 90, lambda: teacher_forced(built.reference, built.candidate, tok, prompts,
                                                              new_tokens, piece, rows, 1, before=not args.skip_before))
        del built
        setup.free(dev)
    pieces = [int(p) for p in args.pieces.split(",")] if args.pieces else list(long_plan["pieces"])
    run.step("long", 120, lambda: long_context(loaded, tok, {**spec, "device": dev, "dtype": "bfloat16" if dev == "cuda" else "float32"},
                                               work, hw, long_plan, pieces, run))
    if torch.cuda.is_available():
        run.results["gpu_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    run.save()
    print({k: v for k, v in run.results.items() if k in ("bandwidth", "elapsed_s")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
