"""The long-context gates on a GPU: gate 1 at depth and the retrieval matrix at 8k tokens of context.

Builds the 8B Llama layout with random weights in bf16 on CUDA (`shapes.random_llama("8b")`),
an FP8 fake-quant candidate with an FP8 KV cache (the long-context decision), and runs qval's own
pipeline (`qval.pipeline.run_gate`, what `qval gate` calls) with only gate 1 (small), `depth` and
`retrieval` enabled, thresholds so loose that the verdict never changes what runs. Per gate it
records the stage's seconds (its done.json), the peak GPU memory while the gate ran (reset before
each gate; the models' resident bytes reported apart), tokens scored per second, and the ratio to
the hardware ceilings measured in the same run (bf16 matmul TFLOP/s, copy bandwidth):

    FLOP floor   = 2 models × 2 × matmul parameters × tokens ÷ matmul peak   (attention's own FLOPs
                   given apart: 2 × layers × ctx² × heads × head_dim per chunk, causal)
    weight floor = forwards × weight bytes ÷ copy bandwidth (each piece reads every weight once)

`of FLOP peak` is the FLOP floor ÷ the measured seconds. The depth gate then runs again with other
`piece` sizes (its stage key changes; calibration, gate 1 and retrieval are reused from the run
folder, the candidate from memory), and each depth setting is compared with the same chunks walked
through both engines' `logits_pieces` alone (forwards, no metrics).

    python3 benchmarks/longctx_h200.py --tokenizer .tok --out OUT --deadline 540     # an H200
    python3 benchmarks/longctx_h200.py --smoke                                         # CPU, toy shape

Random weights cost what trained ones cost for every kernel here; the gates' figures on them mean
nothing (the reference cannot retrieve a pass code) and are never reported as quality.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import measure  # noqa: E402
import shapes  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (first: it imports engines, gates and reference in an order that resolves)

ROOT = Path(__file__).resolve().parent.parent

FULL = dict(shape="8b", calib=(32, 512), agreement=dict(tokens=8192, ctx=512),
            depth=dict(ctx=8192, tokens=32768), pieces=(2048, 8192, 512),
            retrieval=dict(lengths=[2048, 4096, 8192], depths=[0.0, 0.25, 0.5, 0.75, 1.0], trials=2, piece=2048))
SMOKE = dict(shape="smoke", calib=(4, 64), agreement=dict(tokens=512, ctx=128),
             depth=dict(ctx=256, tokens=512), pieces=(128, 256),
             retrieval=dict(lengths=[160, 256], depths=[0.0, 0.5, 1.0], trials=1, piece=128))


def cuda(device: str) -> bool:
    return device.startswith("cuda")


def retrieval_pieces() -> bool:
    """Whether this qval's retrieval gate scores prompts in `piece`-sized steps (its first design)
    or prefills each prompt whole and reads the answer through the cache (`Engine.answer_logits`)."""
    from qval.config import RetrievalGate

    return "piece" in RetrievalGate.model_fields


def retrieval_plan(plan: dict[str, Any]) -> dict[str, Any]:
    r = dict(plan["retrieval"])
    if not retrieval_pieces():
        r.pop("piece", None)
    return r


def gate_config(plan: dict[str, Any], model_spec: dict[str, Any], report_dir: Path, piece: int) -> Any:
    from qval.config import parse_config

    samples, seq_len = plan["calib"]
    cfg = {
        "name": f"longctx-{plan['shape']}-fp8-kvfp8",
        "model": model_spec,
        "quant": {"format": "fp8", "kv_cache": "fp8", "exclude": ["*lm_head*"]},
        "calibration": {"dataset": "calib_data/general_mix.jsonl", "samples": samples, "seq_len": seq_len},
        "engine": {"backend": "fakequant"},
        "gates": {
            "agreement": {"dataset": "calib_data/heldout_eval.jsonl", **plan["agreement"],
                          "min_top1": 0.0, "max_mean_kld": 1e9, "max_p99_kld": 1e9},
            "quality": {"enabled": False},
            "longgen": {"enabled": False},
            "depth": {"dataset": "calib_data/longctx_docs.jsonl", **plan["depth"], "piece": piece,
                      "min_top1": 0.0, "max_mean_kld": 1e9, "max_p99_kld": 1e9},
            "retrieval": {"haystack": "calib_data/longctx_docs.jsonl", **retrieval_plan(plan),
                          "margin": 1.0, "margin_overall": 1.0, "min_reference_accuracy": 0.01},
        },
        "report": {"dir": str(report_dir)},
        "diagnostics": {"enabled": False, "sensitivity": "never"},
        "seed": 0,
    }
    return parse_config(cfg, f"<longctx bench, depth piece {piece}>")


class Meter:
    """Peak device memory and wall seconds of each stage qval runs (calibrate, build, each gate),
    by wrapping the functions the pipeline looks up at call time."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.records: list[dict[str, Any]] = []
        self.overall_peak = 0

    def measure(self, label: str, fn: Any, *a: Any, **kw: Any) -> Any:
        on = cuda(self.device)
        if on:
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.empty_cache()
            self.overall_peak = max(self.overall_peak, torch.cuda.max_memory_allocated())
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            rec: dict[str, Any] = {"stage": label, "wall_s": None}
            if on:
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
                self.overall_peak = max(self.overall_peak, peak)
                rec.update(base_bytes=base, peak_bytes=peak, peak_above_base_bytes=peak - base,
                           after_bytes=torch.cuda.memory_allocated())
            rec["wall_s"] = time.perf_counter() - t0
            self.records.append(rec)
            print(f"[longctx] {label}: {rec['wall_s']:.1f}s" + (f", peak {peak / 2**30:.1f} GiB" if on else ""), flush=True)

    def last(self, label: str) -> dict[str, Any] | None:
        return next((r for r in reversed(self.records) if r["stage"] == label), None)


def instrument(meter: Meter, caught: dict[str, Any]) -> None:
    """Wrap qval's calibrate, build and every gate's run; keep the built candidate so a later
    run_gate with another depth piece reuses it (same quant and calibration: the same engine)."""
    from qval import pipeline
    from qval.gates import GATES

    calibrate, build = pipeline.calibrate, pipeline.build

    def calibrate_spy(s: Any, alpha: Any = None) -> Any:
        return meter.measure("calibrate", calibrate, s, alpha)

    def build_spy(s: Any, calib: Any) -> Any:
        caught["session"] = s
        if s._candidate is None and caught.get("candidate") is not None:
            s._candidate = caught["candidate"]
        if s._candidate is None:
            caught["candidate"] = meter.measure("build", build, s, calib)
        return s._candidate

    pipeline.calibrate, pipeline.build = calibrate_spy, build_spy
    for name in list(GATES._items):
        spec = GATES._items[name]
        run = spec.run

        def wrapped(ctx: Any, _run: Any = run, _name: str = name) -> Any:
            return meter.measure(f"gate_{_name}", _run, ctx)

        GATES._items[name] = dataclasses.replace(spec, run=wrapped)


def stage_seconds(run_dir: Path) -> dict[str, Any]:
    out = {}
    for done in sorted(run_dir.glob("*/done.json")):
        try:
            out[done.parent.name] = json.loads(done.read_text(encoding="utf-8")).get("seconds")
        except (OSError, ValueError):
            continue
    return out


def model_facts(model: Any) -> dict[str, Any]:
    c = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    total = shapes.parameters(model)
    # parameters that take part in a matmul per token: all but an untied input embedding (a lookup)
    matmul = total - (0 if tied else embed.numel())
    return {"parameters": total, "matmul_parameters": matmul, "head_parameters": head.weight.numel() if head is not None else 0, "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "layers": c.num_hidden_layers, "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads), "vocab": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings}


def attention_flops(m: dict[str, Any], length: int) -> float:
    """QKᵀ and PV of one causal sequence of `length` tokens, all layers: 2 × 2 × L²/2 × H × d each."""
    return 2.0 * m["layers"] * length * length * m["heads"] * m["head_dim"]


def floors(m: dict[str, Any], hw: dict[str, Any], tokens: int, attn_flops: float, forwards: int, seconds: float | None) -> dict[str, Any]:
    """The FLOP and weight-read floors of work that puts `tokens` through BOTH models."""
    peak = hw.get("matmul_flops_per_s")
    bw = hw.get("bytes_per_s")
    flop = 2 * 2.0 * m["matmul_parameters"] * tokens
    out: dict[str, Any] = {"tokens_both_models": tokens, "linear_flops": flop, "attention_flops": 2 * attn_flops,
                           "forwards": forwards}
    if peak:
        out["flop_floor_s"] = flop / peak
        out["flop_floor_with_attention_s"] = (flop + 2 * attn_flops) / peak
    if bw:
        out["weight_floor_s"] = forwards * m["weight_bytes"] / bw
    if seconds and peak:
        out["of_flop_peak"] = out["flop_floor_s"] / seconds
        out["of_flop_peak_with_attention"] = out["flop_floor_with_attention_s"] / seconds
        out["achieved_tflops"] = (flop + 2 * attn_flops) / seconds / 1e12
    if seconds:
        out["tokens_per_s"] = tokens / seconds
    return out


def plain_pieces(ref: Any, cand: Any, chunks: list[list[int]], piece: int, device: str) -> dict[str, Any]:
    """The same chunks walked through both engines' logits_pieces, logits dropped: the forwards the
    depth gate cannot avoid, without its metrics."""
    measure.sync(device)
    t0 = time.perf_counter()
    for ids in chunks:
        x = torch.tensor([ids])
        for lr, lc in zip(ref.logits_pieces(x, piece), cand.logits_pieces(x, piece)):
            del lr, lc
    measure.sync(device)
    return {"seconds": time.perf_counter() - t0, "chunks": len(chunks), "piece": piece}


def guarded(name: str, fn: Any) -> Any:
    t0 = time.perf_counter()
    try:
        value = fn()
        print(f"[longctx] {name}: done in {time.perf_counter() - t0:.1f}s", flush=True)
        return value
    except Exception as err:  # a benchmark keeps going: the other figures are still worth having
        traceback.print_exc()
        return {"error": f"{type(err).__name__}: {err}"}


def retrieval_work(cfg: Any, tok: Any, m: dict[str, Any], hw: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    """What the retrieval gate put through both models: each trial's prompt + true answer, scored
    in pieces of `piece` (the trials rebuilt as the gate builds them: deterministic, ~1 s on a CPU)."""
    from qval.gates import GateContext
    from qval.gates.retrieval import trials_for

    ctx = GateContext(config=cfg, reference=None, candidate=None, tokenizer=tok, folder=Path("."), shared_cache=Path("."),
                      reference_fingerprint="")
    trials, _ = trials_for(ctx)
    answers = sum(len(t.answer) for t in trials)
    if retrieval_pieces():  # prompt + answer in pieces, every position's logits
        lens = [len(t.prompt) + len(t.answer) for t in trials]
        pc = cfg.gates.retrieval.piece
        fwd = sum(-(-n // pc) for n in lens)
        out = floors(m, hw, sum(lens), sum(attention_flops(m, n) for n in lens), 2 * fwd, seconds)
        design = f"logits_pieces, piece {pc}"
    else:  # prefill (lm_head on its last position only), then the answer but its last token
        lens = [len(t.prompt) + len(t.answer) - 1 for t in trials]
        fwd = sum(1 + (len(t.answer) > 1) for t in trials)
        out = floors(m, hw, sum(lens), sum(attention_flops(m, n) for n in lens), 2 * fwd, seconds)
        head = 2 * 2.0 * m["head_parameters"] * (sum(lens) - answers)  # lm_head work the prefill skips
        out["linear_flops"] -= head
        for k in ("flop_floor_s", "flop_floor_with_attention_s"):
            if k in out:
                out[k] -= head / hw["matmul_flops_per_s"]
        if seconds and "flop_floor_s" in out:
            out["of_flop_peak"] = out["flop_floor_s"] / seconds
            out["of_flop_peak_with_attention"] = out["flop_floor_with_attention_s"] / seconds
            out["achieved_tflops"] = (out["linear_flops"] + out["attention_flops"]) / seconds / 1e12
        design = "answer_logits: prompt prefilled whole (logits_to_keep=1), answer read through the cache"
    return {"design": design, "answer_tokens": answers, "max_scored_tokens": max(lens, default=0), "forwards_per_model": fwd,
            "floors": out}


def summarize_run(result: Any, meter: Meter, m: dict[str, Any], hw: dict[str, Any], piece: int, wall: float,
                  first: int, tok: Any) -> dict[str, Any]:
    """One run_gate's figures: per gate seconds, memory, tokens/s, floors."""
    rep = result.report
    stages = stage_seconds(result.run_dir)
    cached = {k: v.get("cached") for k, v in (rep.get("stages") or {}).items()} if isinstance(rep.get("stages"), dict) else {}
    gates: dict[str, Any] = {}
    for name, g in rep.get("gates", {}).items():
        d = g.get("details", {}) or {}
        mem = next((r for r in meter.records[first:] if r["stage"] == f"gate_{name}"), None)
        secs = stages.get(f"gate_{name}")
        entry: dict[str, Any] = {"status": g.get("status"), "stage_seconds": secs, "gate_seconds": g.get("seconds"),
                                 "ran_now": mem is not None, "memory": mem}
        if name == "agreement":
            tokens = int(d.get("chunks", 0)) * int(d.get("ctx", result.config.gates.agreement.ctx))
            entry.update(chunks=d.get("chunks"), ctx=result.config.gates.agreement.ctx, scored_positions=d.get("scored_positions"),
                         floors=floors(m, hw, tokens, d.get("chunks", 0) * attention_flops(m, result.config.gates.agreement.ctx),
                                       2 * -(-int(d.get("chunks", 0)) // result.config.gates.agreement.batch_size), secs))
        elif name == "depth":
            ctx = int(d.get("ctx", 0))
            n = int(d.get("chunks", 0))
            entry.update(chunks=n, ctx=ctx, piece=d.get("piece"), scored_positions=d.get("scored_positions"),
                         buckets=[b["label"] for b in d.get("buckets", [])],
                         floors=floors(m, hw, n * ctx, n * attention_flops(m, ctx), 2 * n * -(-ctx // max(1, int(d.get("piece") or ctx))), secs))
        elif name == "retrieval":
            rows = d.get("rows", [])
            pc = getattr(result.config.gates.retrieval, "piece", None)
            entry.update(trials=len(rows), piece=pc, prompt_tokens=sum(int(r["prompt_tokens"]) for r in rows),
                         flipped=len(d.get("flipped", [])),
                         mean_prompt_tokens={str(x["length"]): x.get("mean_prompt_tokens") for x in d.get("per_length", [])},
                         max_prompt_tokens=max((int(r["prompt_tokens"]) for r in rows), default=0),
                         **retrieval_work(result.config, tok, m, hw, secs))
        if g.get("error"):
            entry["error"] = g["error"]
        gates[name] = entry
    return {"depth_piece": piece, "wall_s": wall, "approved": result.verdict.approved, "stages": stages, "stages_cached": cached,
            "report_seconds": rep.get("seconds"), "gates": gates,
            "other_stages": [r for r in meter.records[first:] if not r["stage"].startswith("gate_")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="toy shape on the CPU, tiny budgets: check the script anywhere")
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the built-in model's)")
    ap.add_argument("--out", default="longctx_out", help="folder for h200_longctx.json")
    ap.add_argument("--work", default=None, help="scratch folder (default: OUT/work)")
    ap.add_argument("--pieces", default=None, help="comma list of depth piece sizes, run in order (default 2048,8192,512)")
    ap.add_argument("--nojit", action="store_true", help="skip ModelOpt's CUDA-kernel JIT build (its eager FP8 path instead)")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds this run may take; later depth pieces are skipped, not cut")
    args = ap.parse_args(argv)
    started = time.perf_counter()

    def left() -> float:
        return args.deadline - (time.perf_counter() - started)

    plan = SMOKE if args.smoke else FULL
    pieces = [int(p) for p in args.pieces.split(",")] if args.pieces else list(plan["pieces"])
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    from bench import environment  # the same environment facts as the main benchmark

    results: dict[str, Any] = {"what": "long-context gates (depth, retrieval) through qval.pipeline.run_gate", "env": environment(),
                               "smoke": args.smoke, "device": device, "plan": {**plan, "pieces": pieces}, "deadline_s": args.deadline}

    def save() -> None:
        from qval.io import atomic_write_json

        results["elapsed_s"] = time.perf_counter() - started
        atomic_write_json(out / "h200_longctx.json", results)

    if cuda(device):
        if args.nojit:
            from modelopt.torch.quantization import extensions

            for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
                getter.extension = None
            results["fp8_kernel"] = {"jit": False, "note": "ModelOpt's eager FP8 path (benchmarks/nojit.py)"}
        else:
            from bench import prebuild_fp8_kernel

            results["fp8_kernel"] = {"jit": True, **guarded("fp8_kernel_build", prebuild_fp8_kernel)}
    hw: dict[str, Any] = {}
    results["bandwidth"] = measure.hbm_bandwidth(device, gib=0.25 if args.smoke else 2.0, reps=5 if args.smoke else 20)
    hw["bytes_per_s"] = results["bandwidth"]["bytes_per_s"]
    mm = guarded("matmul", lambda: measure.matmul_tflops(device, n=512 if args.smoke else 8192, reps=3 if args.smoke else 10))
    results["matmul"] = mm
    if "tflops" in mm:
        hw["matmul_flops_per_s"] = mm["tflops"] * 1e12
    save()

    from bench import load_bench_tokenizer

    tok = load_bench_tokenizer(argparse.Namespace(tokenizer=args.tokenizer, gguf=None))
    dtype = torch.bfloat16 if cuda(device) else torch.float32
    meter = Meter(device)
    loaded = meter.measure("model", shapes.random_llama, plan["shape"], tok, device, dtype, work / f"model_{plan['shape']}")
    m = model_facts(loaded.model)
    results["model"] = {"name": loaded.name, "dtype": str(dtype).removeprefix("torch."), "load_s": loaded.load_seconds,
                        "resident_bytes": meter.last("model").get("after_bytes"), **m}
    model_spec = {"source": "path", "path": str(work / f"model_{plan['shape']}"),
                  "dtype": "bfloat16" if cuda(device) else "float32", "device": device}
    save()

    from qval import pipeline
    from qval.gates import GateContext, depth as depth_gate
    from qval.progress import Progress

    caught: dict[str, Any] = {}
    instrument(meter, caught)
    results["runs"], results["plain"] = [], []
    report_dir = work / "reports"
    per_piece_s: float | None = None
    for i, piece in enumerate(pieces):
        if i > 0 and per_piece_s is not None and left() < 2.5 * per_piece_s + 30:
            results["runs"].append({"depth_piece": piece, "skipped": f"{left():.0f} s left of --deadline; the last depth run took {per_piece_s:.0f} s"})
            save()
            continue
        cfg = gate_config(plan, model_spec, report_dir, piece)
        first = len(meter.records)
        t0 = time.perf_counter()
        try:
            result = pipeline.run_gate(cfg, progress=Progress(enabled=True), reference=loaded)
        except Exception as err:
            traceback.print_exc()
            results["runs"].append({"depth_piece": piece, "error": f"{type(err).__name__}: {err}", "stages": stage_seconds(report_dir / cfg.name),
                                    "records": meter.records[first:]})
            save()
            break
        wall = time.perf_counter() - t0
        run = summarize_run(result, meter, m, hw, piece, wall, first, tok)
        results["runs"].append(run)
        per_piece_s = run["gates"].get("depth", {}).get("stage_seconds") or wall
        save()
        # the same chunks through both engines' forwards alone
        s = caught.get("session")
        if s is not None:
            ctx = GateContext(config=cfg, reference=s.ref_engine, candidate=s._candidate, tokenizer=tok, folder=work / "plain",
                              shared_cache=work / "plain", reference_fingerprint="bench")
            chunks, _ = depth_gate.scored_chunks(ctx)
            p = meter.measure(f"plain_depth_piece{piece}", plain_pieces, s.ref_engine, s._candidate, chunks, piece, device)
            p["memory"] = meter.last(f"plain_depth_piece{piece}")
            d = run["gates"].get("depth", {})
            if d.get("stage_seconds"):
                p["gate_over_plain"] = d["stage_seconds"] / p["seconds"]
            p["floors"] = floors(m, hw, len(chunks) * len(chunks[0]), len(chunks) * attention_flops(m, len(chunks[0])),
                                 2 * len(chunks) * -(-len(chunks[0]) // piece), p["seconds"])
            results["plain"].append(p)
        del result
        save()
        # the report of this run (the last one's stays) for the record
        try:
            import shutil

            shutil.copy(report_dir / cfg.name / "report.json", out / "report_last.json")
        except OSError:
            pass
    if cuda(device):
        results["overall_peak_bytes"] = max(meter.overall_peak, torch.cuda.max_memory_allocated())
        results["gpu_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    results["stage_records"] = meter.records
    save()
    print(render(results))
    return 0


def render(r: dict[str, Any]) -> str:
    """A plain summary table (RESULTS.md takes its figures from the JSON)."""
    gib = 2**30
    lines = [f"device {r['device']}, model {r.get('model', {}).get('name')}, "
             f"matmul {r.get('matmul', {}).get('tflops', float('nan')):.0f} TFLOP/s, copy {r['bandwidth']['tb_per_s']:.2f} TB/s"]
    lines.append("| run piece | gate | stage s | tokens (both models) | tok/s | of FLOP peak | of peak incl. attention | peak GiB | above base GiB |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for run in r.get("runs", []):
        for name, g in run.get("gates", {}).items():
            if not g.get("ran_now"):
                continue
            f, mem = g.get("floors", {}), g.get("memory") or {}
            lines.append(f"| {run['depth_piece']} | {name} | {g.get('stage_seconds')} | {f.get('tokens_both_models')} | "
                         f"{f.get('tokens_per_s', 0):,.0f} | {f.get('of_flop_peak', float('nan')):.3f} | "
                         f"{f.get('of_flop_peak_with_attention', float('nan')):.3f} | "
                         f"{(mem.get('peak_bytes') or 0) / gib:.1f} | {(mem.get('peak_above_base_bytes') or 0) / gib:.2f} |")
    for p in r.get("plain", []):
        f = p.get("floors", {})
        lines.append(f"| {p['piece']} | plain forwards (depth chunks) | {p['seconds']:.2f} | {f.get('tokens_both_models')} | "
                     f"{f.get('tokens_per_s', 0):,.0f} | {f.get('of_flop_peak', float('nan')):.3f} | "
                     f"{f.get('of_flop_peak_with_attention', float('nan')):.3f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
