"""Issue 15 in one process on a GPU: decode, gate 3's teacher-forced passes, the lm-eval peer, the whole gate.

    python3 benchmarks/nojit.py benchmarks/h200_issue15.py --tokenizer .tok --out $OUT [--deadline 540]
    python3 benchmarks/nojit.py benchmarks/h200_issue15.py --real --out $OUT --only peer   # the built-in model

On a random-weight Llama of the 8B layout (bf16) and its FP8 fake-quant candidate (calibrated as
`bench.py` does), every "before" and "after" in the same run, against limits measured in it:

- `gemv`, `attn`: a step's products alone (benchmarks/gemv.py) and its attention alone
  (benchmarks/decode_kernel.py), each kernel against cuBLAS / sdpa and against its floor;
- `b8`: gate 3's decode at batch 8 × 2,048 and batch 1 before and after gemv.py's products at 8 rows
  and decode_kernel.py's attention (with `--deterministic`: in the gate's own mode);
- `decode`: the reference's static decode without and with the fused element-wise step
  (`HFEngine.static_fused`, qval/engines/fused_step.py): batch 1 × 256 tokens against the roofline
  (weight bytes ÷ the copy bandwidth), batch 8 × 2,048 tokens per 256-step segment against its floor
  (weights + the K/V slots a step reads), the greedy tokens of both against each other and the plain
  path, and the kernel profile of the fused step;
- `candidate`: the same for the FP8 candidate (batch 1 and 8, 256 tokens);
- `tf`: gate 3's teacher-forced drift and judge-NLL passes (`qval/gates/teacher_forced.py`: `teacher_forced_rows`,
  `judge_nll_rows`) over 8 prompts × 2,048 continuation tokens, one row at a time (before) and the
  gate's 8 rows at once (after), against the same three passes as bare forwards;
- `peer`: perplexity through lm-eval's `HFLM.loglikelihood_rolling` and through qval (alone, and
  qval's gate-1 pass with the candidate: KLD/top-1 in the same pass), same windows and batch;
- `e2e`: `run_gate` for the FP8 candidate, every gate at its shipped default, diagnostics on, the
  reference included (bench.py's end-to-end step).

Random weights: the figures time the work; the tokens and perplexities say nothing of quality.
Writes $OUT/h200_issue15.json after every step (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import h200_decode  # noqa: E402
import measure  # noqa: E402
import peer_lmeval  # noqa: E402
import shapes  # noqa: E402
import spans  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (import order, as bench.py)

SHORT = 256  # new tokens of the short decode measurements (--smoke: 16)


def decode_rows(engine: Any, prompts: list[list[int]], wbytes: int, per_slot: int, bw: float, new_tokens: int, batch: int,
                long: bool) -> dict[str, Any]:
    roof = 1000 * wbytes / bw
    row: dict[str, Any] = {}
    one = measure.decode_speed(engine, prompts[:1], 1, SHORT, 3, "static")
    one["x_roofline"] = one["ms_per_step"] / roof
    row["batch1"] = one
    eight = measure.decode_speed(engine, prompts, batch, SHORT, 3, "static")
    eight["x_roofline"] = eight["ms_per_step"] / roof
    row["batch8_256"] = eight
    if long:
        engine.decode = "static"
        group = [prompts[i % len(prompts)] for i in range(batch)]
        t = h200_decode.timeline(engine, group, new_tokens)
        row["tokens"] = t.pop("tokens")
        row["batch8_long"] = h200_decode.with_floors(t, wbytes, batch, per_slot, bw)
    row["notes"] = list(engine.notes)
    row["fused"] = engine.describe().get("decode_fused")
    return row


def teacher_forced(ref: Any, cand: Any, tok: Any, prompts: list[list[int]], new_tokens: int, piece: int, rows: int,
                   reps: int, before: bool = True) -> dict[str, Any]:
    """Gate 3's three passes per prompt (reference and candidate over the reference's text, the
    reference over the candidate's), one row at a time and `rows` at a time, against bare forwards."""
    import torch

    import numpy as np

    from qval.gates import teacher_forced as tf

    vocab = min(len(tok), ref.model.config.vocab_size)
    rng = random.Random(0)
    conts = [[rng.randrange(200, vocab) for _ in range(new_tokens)] for _ in prompts]
    other = [[rng.randrange(200, vocab) for _ in range(new_tokens)] for _ in prompts]  # "the candidate's" text
    ctx = SimpleNamespace(reference=ref, candidate=cand, tokenizer=tok)
    pad = tok.pad_token_id or 0

    def passes(k: int) -> None:
        for b0 in range(0, len(prompts), k):
            sl = slice(b0, b0 + k)
            tf.teacher_forced_rows(ctx, prompts[sl], conts[sl], piece)
            tf.judge_nll_rows(ctx, prompts[sl], other[sl], piece)

    def forwards(k: int) -> None:
        """The same three passes' tokens as whole-sequence forwards, `k` rows per forward."""
        for b0 in range(0, len(prompts), k):
            for engine, texts in ((ref, conts), (cand, conts), (ref, other)):
                seqs = [p + c for p, c in zip(prompts[b0 : b0 + k], texts[b0 : b0 + k])]
                width = max(len(x) for x in seqs)
                engine.logits(torch.tensor([x + [pad] * (width - len(x)) for x in seqs]))

    def pieces_only(k: int) -> None:
        """The same pieces through the KV cache, no statistics."""
        for b0 in range(0, len(prompts), k):
            for engine, texts in ((ref, conts), (cand, conts), (ref, other)):
                seqs = [p + c for p, c in zip(prompts[b0 : b0 + k], texts[b0 : b0 + k])]
                for _ in tf._pieces(engine, seqs, piece, pad):
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
        print(f"[i15] tf {name}: {out[name]['median_s']:.2f} s", flush=True)
    best_forward = min(out["forward_1row"]["median_s"], out["forward_rows"]["median_s"])
    if before:
        out["ratio_forward_over_gate_1row"] = best_forward / out["gate_1row"]["median_s"]
    out["ratio_forward_over_gate_rows"] = best_forward / out["gate_rows"]["median_s"]
    out["ratio_pieces_over_gate_rows"] = out["pieces_only_rows"]["median_s"] / out["gate_rows"]["median_s"]
    # the figures themselves: rows at once against one at a time (bf16 kernels of another batch shape)
    a = tf.teacher_forced_rows(ctx, prompts[:rows], conts[:rows], piece)
    b = [tf.teacher_forced_rows(ctx, [p], [c], piece)[0] for p, c in zip(prompts[:rows], conts[:rows])]
    out["rows_vs_1row"] = {k: {"max_abs_diff": float(max(np.nanmax(np.abs(x[k].astype(float) - y[k].astype(float))) for x, y in zip(a, b))),
                               "mean_1row": float(np.mean([y[k].astype(float).mean() for y in b]))}
                           for k in ("kld", "nll_ref", "nll_cand", "top1")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer folder for the random model")
    ap.add_argument("--real", action="store_true", help="the built-in model (its GGUF where qval finds it) instead of the 8B layout")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--only", default="decode,candidate,tf,peer,e2e")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds; a step that would start later is skipped")
    ap.add_argument("--peer-tokens", type=int, default=32768)
    ap.add_argument("--peer-window", type=int, default=1024)
    ap.add_argument("--peer-batch", type=int, default=8)
    ap.add_argument("--skip-before", action="store_true",
                    help="only the after variants (fused decode, rows at once): the before figures of an earlier run stand")
    ap.add_argument("--spans", action="store_true",
                    help="e2e: time the gate's stages and the engines' work inside them (spans.py; syncs the GPU at each edge)")
    ap.add_argument("--deterministic", action="store_true",
                    help="qval's deterministic mode from the start (as run_gate sets it on a GPU): the decode figures in the gate's own numerics")
    ap.add_argument("--smoke", action="store_true", help="toy shape and budgets on any device: check the script in ~2 minutes")
    args = ap.parse_args()
    started = time.perf_counter()
    only = set(args.only.split(","))

    import torch
    from qval.reference import render_prompts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    res: dict[str, Any] = {"env": bench.environment(), "shape": "real" if args.real else args.shape}

    def save() -> None:
        (out / "h200_issue15.json").write_text(json.dumps(res, indent=1, default=str))

    def step(name: str, needs: float, fn: Any) -> Any:
        left = args.deadline - (time.perf_counter() - started)
        if name.split(":")[0] not in only:
            return None
        if left < needs:
            res[name] = {"error": f"skipped: {left:.0f} s left of --deadline, needs ~{needs:.0f}"}
            save()
            return None
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as err:  # keep going: the other figures are still worth having
            traceback.print_exc()
            res[name] = {"error": "".join(traceback.format_exception_only(type(err), err)).strip()}
        print(f"[i15] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        save()
        return res[name]

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.deterministic:
        from qval import determinism

        res["determinism_mode"] = determinism.configure(device)  # before the first CUDA work, as load_model does
    if args.smoke:
        global SHORT
        args.shape, args.peer_tokens, args.peer_window, args.peer_batch, SHORT = "smoke", 1024, 128, 2, 16
    new_tokens, piece = (48, 32) if args.smoke else (2048, 256)
    bw = measure.hbm_bandwidth(device, gib=0.25 if args.smoke else 2.0)
    res["bandwidth"] = bw
    if args.real:
        from qval.config import ModelConfig
        from qval.models import load_model

        spec: dict[str, Any] = {"source": "default", "dtype": "float16"}
        loaded = load_model(ModelConfig(**spec))
        tok = loaded.tokenizer
    else:
        tok = bench.load_bench_tokenizer(SimpleNamespace(tokenizer=args.tokenizer, gguf=None))
        loaded = shapes.random_llama(args.shape, tok, device, torch.bfloat16 if device == "cuda" else torch.float32,
                                     work / f"model_{args.shape}")
        spec = {"source": "path", "path": str(work / f"model_{args.shape}"), "dtype": "bfloat16"}
    model = loaded.model
    wbytes = shapes.weight_bytes_per_step(model)
    per_slot = h200_decode.kv_bytes_per_slot(model.config)
    res.update(model=loaded.name, weight_bytes=wbytes, roofline_ms=1000 * wbytes / bw["bytes_per_s"])
    plan = bench.SMOKE if args.smoke else bench.FULL
    samples, seq_len = plan["calib"]
    data = {"calib": bench.expanded_jsonl(ROOT / "calib_data/general_mix.jsonl", work / "data/calib.jsonl", tok, samples * seq_len),
            "heldout": bench.expanded_jsonl(ROOT / "calib_data/heldout_eval.jsonl", work / "data/heldout.jsonl", tok, 65536)}
    records = [json.loads(line) for line in (ROOT / "calib_data/longgen_prompts.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts, _ = render_prompts(tok, [r["prompt"] for r in records])
    session = None
    if device == "cuda":
        import gemv

        step("gemv", 120, lambda: gemv.run(out / "gemv", layers=4 if args.smoke else gemv.LAYERS))
        import decode_kernel

        step("attn", 90, lambda: decode_kernel.run(out / "attn", layers=4 if args.smoke else decode_kernel.LAYERS))
    if only & {"decode", "b8", "b1", "determinism", "candidate", "tf", "peer"}:
        cfg = bench.gate_config("i15", spec, data, work / "reports", plan)
        facts, session = bench.calibrate_and_build(loaded, cfg)
        res["calibration_s"] = (facts.get("calibration") or {}).get("seconds")
        ref, cand = session.ref_engine, session._candidate

        def decode_both(engine: Any, long: bool) -> dict[str, Any]:
            row: dict[str, Any] = {}
            for fused in ((True,) if args.skip_before else (False, True)):
                engine.static_fused, engine._decoder = fused, None
                row["fused" if fused else "unfused"] = decode_rows(engine, prompts, wbytes, per_slot, bw["bytes_per_s"], new_tokens, 8,
                                                                   long and device == "cuda")
            a, b = (row.get("unfused") or {}).pop("tokens", None), row["fused"].pop("tokens", None)
            if a and b:
                row["unfused_vs_fused_first_divergence"] = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), None) for r, s in zip(a, b)]
            engine.static_fused, engine._decoder = True, None
            row["identity_plain_vs_fused"] = measure.greedy_identity(engine, prompts, 8, min(256, new_tokens))
            return row

        def batch1(engine: Any) -> dict[str, Any]:
            """Batch 1 without and with gemv.py's kernels (fused element-wise work in both), the
            tokens of each against the plain path's, and the step's kernel profile with them."""
            from qval.engines import fused_step

            row: dict[str, Any] = {}
            roof = 1000 * wbytes / bw["bytes_per_s"]
            engine.decode = "plain"
            plain = engine.generate(prompts[:1], SHORT, suppress_eos=True, batch_size=1).tokens[0]
            for use in (False, True):
                fused_step.use_gemv, engine.static_fused, engine._decoder = use, True, None
                one = measure.decode_speed(engine, prompts[:1], 1, SHORT, 3, "static")
                one["x_roofline"] = one["ms_per_step"] / roof
                toks = engine.generate(prompts[:1], SHORT, suppress_eos=True, batch_size=1).tokens[0]
                one["first_divergence_from_plain"] = next((i for i, (a, b) in enumerate(zip(plain, toks)) if a != b), None)
                one["tokens"] = toks
                row["gemv" if use else "no_gemv"] = one
            a, b = row["no_gemv"].pop("tokens"), row["gemv"].pop("tokens")
            row["gemv_vs_no_gemv_first_divergence"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            row["profile"] = measure.step_profile(engine, prompts, 1, SHORT, wbytes, bw["bytes_per_s"])
            row["notes"] = list(engine.notes)
            row["fused"] = engine.describe().get("decode_fused")
            engine.decode = "auto"
            return row

        def deterministic(engine: Any) -> dict[str, Any]:
            """The gate's numerics (qval's deterministic mode, as run_gate sets it): batch 8 × 256 and
            batch 1 with the static step's index writes through torch's sorted index_put_ and without
            (determinism.distinct_index_writes); the tokens of both must be the same."""
            from qval import determinism
            from qval.engines.static_decode import StaticDecoder

            row: dict[str, Any] = {"mode": determinism.configure("cuda")}
            roof = 1000 * wbytes / bw["bytes_per_s"]
            toks = {}
            for distinct in (False, True):
                StaticDecoder.distinct_writes = distinct
                for b in (8, 1):
                    engine.static_fused, engine._decoder = True, None
                    r = measure.decode_speed(engine, prompts, b, SHORT, 3, "static")
                    r["x_roofline"] = r["ms_per_step"] / roof
                    toks[(distinct, b)] = engine.generate(measure._batch_of(prompts, b), SHORT, suppress_eos=True, batch_size=b).tokens
                    row[f"{'distinct' if distinct else 'sorted'}_b{b}"] = r
            row["tokens_identical"] = {b: toks[(False, b)] == toks[(True, b)] for b in (8, 1)}
            engine.decode = "auto"
            return row

        def batch8(engine: Any) -> dict[str, Any]:
            """Gate 3's decode (batch 8 × 2,048 new tokens, per 256-step segment against its floor) and
            batch 1, before and after each of this step's kernels, in one process: cuBLAS products and
            sdpa attention (before), gemv.py's products at 8 rows, then decode_kernel.py's attention
            too; the greedy tokens of each against the others, the last against the plain path, and
            the last's kernel profile. Run with --deterministic for the gate's own mode."""
            from qval.engines import decode_attention, fused_step

            row: dict[str, Any] = {}
            roof = 1000 * wbytes / bw["bytes_per_s"]
            group = [prompts[i % len(prompts)] for i in range(8)]
            toks = {}
            for name, use_gemv, use_kernel in (("before", False, False), ("gemv", True, False), ("gemv_kernel", True, True)):
                fused_step.use_gemv, decode_attention.use_kernel = use_gemv, use_kernel
                engine.static_fused, engine._decoder, engine.decode = True, None, "static"
                if device == "cuda":
                    t = h200_decode.timeline(engine, group, new_tokens)
                    toks[name] = t.pop("tokens")
                    r = h200_decode.with_floors(t, wbytes, 8, per_slot, bw["bytes_per_s"])
                else:  # --smoke on a CPU: no device events, the script's own path only
                    toks[name] = engine.generate(group, new_tokens, suppress_eos=True, batch_size=8).tokens
                    r = {"x_floor_overall": float("nan")}
                one = measure.decode_speed(engine, prompts[:1], 1, SHORT, 3, "static")
                one["x_roofline"] = one["ms_per_step"] / roof
                row[name] = {"batch8_long": r, "batch1": one}
                print(f"[i15] b8 {name}: x{r['x_floor_overall']:.3f} floor; b1 x{one['x_roofline']:.3f}", flush=True)
            for a, b in (("before", "gemv"), ("gemv", "gemv_kernel")):
                row[f"{a}_vs_{b}_first_divergence"] = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), None)
                                                      for r, s in zip(toks[a], toks[b])]
            engine.static_fused, engine._decoder = True, None
            row["identity_plain_vs_static"] = measure.greedy_identity(engine, prompts, 8, min(256, new_tokens))
            row["profile_b8"] = measure.step_profile(engine, prompts, 8, SHORT, wbytes, bw["bytes_per_s"])
            row["profile_b1"] = measure.step_profile(engine, prompts, 1, SHORT, wbytes, bw["bytes_per_s"])
            row["notes"] = list(engine.notes)
            engine.decode = "auto"
            return row

        step("b8", 150, lambda: batch8(ref))
        step("b1", 60, lambda: batch1(ref))
        step("determinism", 60, lambda: deterministic(ref))
        step("decode", 150, lambda: decode_both(ref, True))
        step("decode:profile", 40, lambda: measure.step_profile(ref, prompts, 8, SHORT, wbytes, bw["bytes_per_s"]))

        def candidate(engine: Any) -> dict[str, Any]:
            """The FP8 candidate's decode (batch 1 and 8 × 256, fused step) without and with gemv.py's
            products (after its lean input quantizer) and decode_kernel.py's attention."""
            from qval.engines import decode_attention, fused_step

            row: dict[str, Any] = {}
            for name, use in (("before", False), ("after", True)):
                fused_step.use_gemv, decode_attention.use_kernel = use, use
                engine.static_fused, engine._decoder = True, None
                row[name] = decode_rows(engine, prompts, wbytes, per_slot, bw["bytes_per_s"], new_tokens, 8, False)
            row["identity_plain_vs_static"] = measure.greedy_identity(engine, prompts, 8, min(256, new_tokens))
            row["profile_b8"] = measure.step_profile(engine, prompts, 8, SHORT, wbytes, bw["bytes_per_s"])
            engine.decode = "auto"
            return row

        step("candidate", 60, lambda: candidate(cand) if args.skip_before else decode_both(cand, False))
        step("tf", 90, lambda: teacher_forced(ref, cand, tok, prompts, new_tokens, piece, 8, 1, before=not args.skip_before))
        step("peer", 60, lambda: peer_lmeval.compare(model, tok, name=loaded.name, dtype=loaded.compute_dtype,
                                                     dataset=ROOT / "calib_data/heldout_eval.jsonl", max_tokens=args.peer_tokens,
                                                     window=args.peer_window, batch=args.peer_batch, reps=2, candidate=cand))
        del ref, cand, session
        gc.collect()
        torch.cuda.empty_cache()
    if not args.real:
        e2e_cfg = bench.gate_config("i15-e2e", spec, data, work / "reports_e2e", plan, diagnostics="on")

        def e2e() -> dict[str, Any]:
            if not args.spans:
                return bench.end_to_end(loaded, e2e_cfg)[0]
            with spans.recording(spans.GATE_SPANS) as rec:
                facts = bench.end_to_end(loaded, e2e_cfg)[0]
            facts["spans"] = rec.table()
            return facts

        step("e2e", 120, e2e)
    res["wall_s"] = time.perf_counter() - started
    save()
    brief = {k: v for k, v in res.items() if k in ("bandwidth", "roofline_ms", "calibration_s", "wall_s")}
    print(json.dumps(brief, default=str))
    for k in ("decode", "candidate"):
        for v in ("unfused", "fused", "before", "after"):
            r = (res.get(k) or {}).get(v) or {}
            print(k, v, {kk: round(r[kk]["x_roofline"], 3) for kk in ("batch1", "batch8_256") if kk in r},
                  round(r["batch8_long"]["x_floor_overall"], 3) if "batch8_long" in r else "", r.get("notes"))
    for k in ("gemv", "attn", "b8", "b1", "determinism", "tf", "peer", "e2e"):
        print(k, json.dumps({kk: vv for kk, vv in (res.get(k) or {}).items() if kk != "spans"}, default=str)[:1500])
    for label, v in ((res.get("e2e") or {}).get("spans") or {}).items():
        print("span", label, v)


if __name__ == "__main__":
    main()
