"""qval against the hardware limit: one rerunnable benchmark (issue 6).

For each model (random-weight Llama layouts of 1B and 8B in bf16, and the built-in real
model from its GGUF) it measures, in one process and one run:

1. gate-1 teacher-forced scoring (reference + FP8 candidate, metrics included) against the
   same forward passes alone, and peak GPU memory at two token budgets;
2. greedy decode ms/step at batch 1 against the memory roofline (weight bytes ÷ the HBM
   bandwidth measured at the start of the same run), tokens/s at batch 1, 8, 32, on the plain
   (transformers `generate`) and static (static KV cache + CUDA graph) paths, and whether the
   two paths emit the same greedy tokens;
3. FP8 calibration, 512 samples × 512 tokens (the qval calibrate stage);
4. end to end (`--e2e` shapes): `run_gate` — what `qval gate` runs — for an FP8 candidate with
   all three gates at their default budgets, the reference's generations included.

    python3 benchmarks/bench.py --smoke                               # CPU, toy shapes, ~a minute
    python3 benchmarks/bench.py --shapes 1b,8b --e2e 8b --out DIR     # an H100/H200
    python3 benchmarks/bench.py --shapes real --gguf model.gguf --e2e real --out DIR

Results: DIR/results.json (every figure) and DIR/RESULTS.section.md (the table that
benchmarks/RESULTS.md carries). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import measure  # noqa: E402
import report_md  # noqa: E402
import shapes  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (first: it imports engines, gates and reference in an order that resolves)

ROOT = Path(__file__).resolve().parent.parent
FULL = dict(budgets=(16384, 65536), calib=(512, 512), batches=(1, 8, 32), plain_batches=(1, 8), plain_tokens=32,
            static_tokens=256, cand_batches=(1, 8), reps=3, identity_tokens=64, gate=dict())
SMOKE = dict(budgets=(512, 1024), calib=(8, 64), batches=(1, 2), plain_batches=(1,), plain_tokens=8, static_tokens=12,
             cand_batches=(1,), reps=1, identity_tokens=12,
             gate=dict(agreement=dict(tokens=1024, ctx=128), quality=dict(bleu_max_new_tokens=8, bootstrap=100),
                       longgen=dict(new_tokens=64, window=16, edge=16, piece=32, max_prompts=2)))


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    env: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
                           "host_cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    for pkg in ("torch", "transformers", "nvidia-modelopt", "qval"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count, cuda=torch.version.cuda)
    return env


def expanded_jsonl(src: Path, dst: Path, tokenizer: Any, tokens: int) -> Path:
    """`src`'s records repeated until they hold `tokens` tokens: the shipped sets are smaller
    than the default budgets (512×512 calibration tokens, 65536 gate-1 tokens), and a speed
    benchmark must run the budget, not the shortfall."""
    from qval.data import load_dataset

    ds = load_dataset(str(src), src)
    texts = ds.texts()
    per_pass = sum(len(tokenizer(t)["input_ids"]) + 1 for t in texts)
    copies = max(1, -(-int(tokens * 1.05) // per_pass))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps({"text": t}) + "\n" for _ in range(copies) for t in texts), encoding="utf-8")
    return dst


def gate_config(name: str, model: dict[str, Any], data: dict[str, Path], report_dir: Path, plan: dict[str, Any],
                tokens: int | None = None, diagnostics: str = "on") -> Any:
    """A gate config with qval's default budgets (shrunk only by --smoke) and thresholds so
    loose that the verdict never triggers the rejected-candidate extras: we time the gates."""
    from qval.config import parse_config

    samples, seq_len = plan["calib"]
    g = plan["gate"]
    agreement = {"dataset": str(data["heldout"]), "min_top1": 0.0, "max_mean_kld": 1e9, "max_p99_kld": 1e9, **g.get("agreement", {})}
    if tokens is not None:
        agreement["tokens"] = tokens
    cfg = {
        "name": name, "model": model, "quant": {"format": "fp8", "kv_cache": "fp16"},
        "calibration": {"dataset": str(data["calib"]), "samples": samples, "seq_len": seq_len},
        "gates": {"agreement": agreement,
                  "quality": {"enabled": True, "max_ppl_ratio": 1e9, "max_bleu_drop": 100.0, **g.get("quality", {})},
                  "longgen": {"enabled": True, "max_loops_excess": 1000, "max_late_drift": 1e9, **g.get("longgen", {})}},
        "report": {"dir": str(report_dir)},
        "diagnostics": {"enabled": diagnostics == "on"},
    }
    return parse_config(cfg, f"<bench {name}>")


def stage_seconds(run_dir: Path) -> dict[str, Any]:
    """Seconds of every finished stage of a run folder (from each stage's done.json)."""
    out = {}
    for done in sorted(run_dir.glob("*/done.json")):
        try:
            out[done.parent.name] = {"seconds": json.loads(done.read_text(encoding="utf-8")).get("seconds"), "cached": False}
        except (OSError, ValueError):
            continue
    return out


def end_to_end(loaded: Any, cfg: Any) -> tuple[dict[str, Any], Any]:
    """`run_gate` with the already-loaded reference; returns the facts and the run's Session
    (caught at build time) so the later measurements reuse its reference and candidate."""
    from qval import pipeline
    from qval.progress import Progress

    caught: dict[str, Any] = {}
    build = pipeline.build

    def spy(s: Any, calib: Any) -> Any:
        caught["session"] = s
        return build(s, calib)

    pipeline.load_model, pipeline.build = (lambda _cfg: loaded), spy
    try:
        t0 = time.perf_counter()
        result = pipeline.run_gate(cfg, progress=Progress(enabled=True))
        wall = time.perf_counter() - t0
    finally:
        pipeline.build = build
    rep = result.report
    facts = {"wall_s": wall, "approved": result.verdict.approved, "report_seconds": rep.get("seconds"),
             "stages": rep.get("stages"), "calibration": rep.get("calibration"),
             "gates": {k: {"seconds": v.get("seconds"), "status": v.get("status")} for k, v in rep.get("gates", {}).items()},
             "gate_details": {k: {kk: v.get("details", {}).get(kk) for kk in ("scored_positions", "chunks", "reference_generation",
                                                                                 "candidate_generation_seconds", "prompts")}
                              for k, v in rep.get("gates", {}).items()},
             "engines": {"reference": caught["session"].ref_engine.describe(), "candidate": rep["candidate"]["engine"]}}
    return facts, caught["session"]


def calibrate_and_build(loaded: Any, cfg: Any) -> tuple[dict[str, Any], Any]:
    from qval import pipeline
    from qval.progress import Progress
    from qval.stages import RunDir

    s = pipeline.Session(config=cfg, run=RunDir(Path(cfg.report.dir), cfg.name), progress=Progress(enabled=True))
    s._reference = loaded
    calib = pipeline.calibrate(s)
    pipeline.build(s, calib)
    return {"calibration": calib.meta() if calib else None, "stages": s.run.log}, s


def run_model(shape: str, args: argparse.Namespace, plan: dict[str, Any], tokenizer: Any, data: dict[str, Path],
              work: Path, bandwidth: float, device: str, out: dict[str, Any], checkpoint: Any) -> dict[str, Any]:
    """Every measurement of one model into `out`, calling `checkpoint()` after each (so a run
    stopped at its time limit still leaves what it measured)."""
    from qval.config import ModelConfig
    from qval.models import load_model
    from qval.reference import render_prompts

    if shape == "real":
        # the one model whose greedy tokens mean something: check the paths agree for longer
        plan = {**plan, "identity_tokens": max(plan["identity_tokens"], 4 * plan["identity_tokens"])}
        model_spec: dict[str, Any] = {"source": "gguf", "gguf": str(Path(args.gguf).resolve()), "dtype": "float16"}
        loaded = load_model(ModelConfig(**model_spec))
    else:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        loaded = shapes.random_llama(shape, tokenizer, device, dtype, work / f"model_{shape}")
        model_spec = {"source": "path", "path": str(work / f"model_{shape}"), "dtype": "bfloat16"}
    tok = loaded.tokenizer
    out.update(name=loaded.name, parameters=shapes.parameters(loaded.model), load_s=loaded.load_seconds,
               dtype=loaded.compute_dtype, weight_bytes=shapes.weight_bytes_per_step(loaded.model))
    session: Any = None
    if set(args.only) & {"scoring", "identity", "decode_reference", "decode_candidate"}:
        cfg = gate_config(f"bench-{shape}", model_spec, data, work / f"reports_{shape}", plan)
        facts, session = calibrate_and_build(loaded, cfg)
        out["calibration"] = facts["calibration"]
    from qval.engines.hf import HFEngine

    ref = session.ref_engine if session else HFEngine(loaded.model, tok)
    cand = session._candidate if session else None
    records = [json.loads(line) for line in (ROOT / "calib_data/longgen_prompts.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts, _ = render_prompts(tok, [r["prompt"] for r in records])
    steps: list[tuple[str, Any]] = [
        ("scoring", lambda: measure.scoring(ref, cand, tok, lambda n: gate_config(f"bench-{shape}", model_spec, data, work / "scoring", plan, n),
                                            work / f"scoring_{shape}", plan["budgets"], plan["reps"])),
        ("identity", lambda: [measure.greedy_identity(ref, prompts, b, plan["identity_tokens"]) for b in (1, plan["batches"][1])]),
        ("decode_reference", lambda: measure.decode_suite(ref, prompts, out["weight_bytes"], bandwidth, batches=plan["batches"],
                                                          plain_batches=plan["plain_batches"], plain_tokens=plan["plain_tokens"],
                                                          static_tokens=plan["static_tokens"], reps=plan["reps"])),
        ("decode_candidate", lambda: measure.decode_suite(cand, prompts, out["weight_bytes"], bandwidth, batches=plan["cand_batches"],
                                                          plain_batches=plan["cand_batches"][:1], plain_tokens=plan["plain_tokens"],
                                                          static_tokens=plan["static_tokens"], reps=plan["reps"])),
        ("profile", lambda: measure.step_profile(ref, prompts, 1, plan["static_tokens"] // 4, out["weight_bytes"], bandwidth)),
    ]
    for name, fn in steps:
        if name not in args.only:
            continue
        out[name] = guarded(name, fn) if args.left() > 60 else {"error": "skipped: the run's --deadline was near"}
        checkpoint()
    del session, ref, cand
    free(device)
    if shape in args.e2e and "e2e" in args.only:
        # last, in a fresh run folder (it calibrates again): a failure here costs no other figure.
        # Without the static decode path gate 3 would take many minutes; skip rather than hang.
        broken = [k for k in ("identity", "decode_reference") if isinstance(out.get(k), dict) and "error" in out[k]]
        if broken:
            out["e2e"] = {"error": f"skipped: the static decode path failed in {', '.join(broken)}"}
        elif args.left() < args.e2e_needs:
            out["e2e"] = {"error": f"skipped: {args.left():.0f} s left of --deadline, the end-to-end run needs ~{args.e2e_needs:.0f} s"}
        else:
            e2e_cfg = gate_config(f"bench-{shape}-e2e", model_spec, data, work / f"reports_{shape}_e2e", plan, diagnostics=args.diagnostics)
            out["e2e"] = guarded("e2e", lambda: end_to_end(loaded, e2e_cfg)[0])
            if "error" in out["e2e"]:  # keep what the finished stages recorded
                out["e2e"]["stages"] = stage_seconds(Path(e2e_cfg.report.dir) / e2e_cfg.name)
    del loaded
    free(device)
    return out


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def guarded(name: str, fn: Any) -> Any:
    """Run one measurement; a failure is recorded (and printed) instead of ending the run."""
    t0 = time.perf_counter()
    try:
        value = fn()
        print(f"[bench] {name}: done in {time.perf_counter() - t0:.1f}s", flush=True)
        return value
    except Exception as err:  # a benchmark keeps going: the other figures are still worth having
        traceback.print_exc()
        return {"error": f"{type(err).__name__}: {err}"}


def save(results: dict[str, Any], out: Path) -> None:
    from qval.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "RESULTS.section.md", report_md.render(results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="toy shapes and budgets: check the script anywhere in ~a minute")
    ap.add_argument("--shapes", default="1b,8b", help="comma list of 1b, 8b, real (smoke: smoke)")
    ap.add_argument("--e2e", default="8b", help="comma list of shapes that also run the end-to-end gate")
    ap.add_argument("--gguf", help="GGUF file of the real model (shape 'real')")
    ap.add_argument("--tokenizer", help="tokenizer folder for the random models (default: the built-in model's)")
    ap.add_argument("--out", default="bench_out", help="folder for results.json and RESULTS.section.md")
    ap.add_argument("--work", default=None, help="scratch folder (default: OUT/work)")
    ap.add_argument("--only", default="scoring,identity,decode_reference,decode_candidate,profile,e2e",
                    help="comma list of the measurements to run (default: all)")
    ap.add_argument("--diagnostics", choices=("on", "off"), default="on", help="the e2e run's diagnostics stage (default on, as shipped)")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds this run may take; later steps are skipped, not cut")
    ap.add_argument("--e2e-needs", type=float, default=180.0, help="seconds to keep for the end-to-end run before starting it")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    args.left = lambda: args.deadline - (time.perf_counter() - started)
    plan = SMOKE if args.smoke else FULL
    args.shapes = ["smoke"] if args.smoke else [s for s in args.shapes.split(",") if s]
    args.e2e = ["smoke"] if args.smoke else [s for s in args.e2e.split(",") if s]
    args.only = [s for s in args.only.split(",") if s]
    for s in args.shapes:
        if s not in shapes.SHAPES and s != "real":
            ap.error(f"unknown shape {s!r}; choose from {', '.join([*shapes.SHAPES, 'real'])}")
    if "real" in args.shapes and not args.gguf:
        ap.error("shape 'real' needs --gguf PATH")
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {"env": environment(), "smoke": args.smoke, "device": device, "models": {}}
    if device == "cuda":
        results["fp8_kernel_build_s"] = guarded("fp8_kernel_build", prebuild_fp8_kernel)
    results["bandwidth"] = measure.hbm_bandwidth(device, gib=0.25 if args.smoke else 2.0, reps=5 if args.smoke else 20)
    if not args.smoke:
        results["matmul"] = guarded("matmul", lambda: measure.matmul_tflops(device))
    save(results, out)
    tokenizer = load_bench_tokenizer(args)
    samples, seq_len = plan["calib"]
    max_budget = max(plan["budgets"] + (plan["gate"].get("agreement", {}).get("tokens", 65536),))
    data = {"calib": expanded_jsonl(ROOT / "calib_data/general_mix.jsonl", work / "data/calib.jsonl", tokenizer, samples * seq_len),
            "heldout": expanded_jsonl(ROOT / "calib_data/heldout_eval.jsonl", work / "data/heldout.jsonl", tokenizer, max_budget)}
    for shape in args.shapes:
        print(f"[bench] model {shape}", flush=True)
        entry: dict[str, Any] = {}
        results["models"][shape] = entry
        failed = guarded(f"model {shape}", lambda: run_model(shape, args, plan, tokenizer, data, work, results["bandwidth"]["bytes_per_s"],
                                                             device, entry, lambda: save(results, out)))
        if isinstance(failed, dict) and "error" in failed and failed is not entry:
            entry["error"] = failed["error"]
        save(results, out)
    print(report_md.render(results))
    return 0


def prebuild_fp8_kernel() -> dict[str, Any]:
    """ModelOpt JIT-compiles its FP8 fake-quant kernel on first use (once per machine, then
    cached under ~/.cache/torch_extensions); time it apart so it does not land in a stage."""
    import contextlib
    import io

    from modelopt.torch.quantization.extensions import get_cuda_ext_fp8

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        ext = get_cuda_ext_fp8(raise_if_failed=False)
    return {"seconds": time.perf_counter() - t0, "built": ext is not None}


def load_bench_tokenizer(args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    if args.tokenizer:
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    elif args.gguf:
        tok = AutoTokenizer.from_pretrained(str(Path(args.gguf).parent), gguf_file=Path(args.gguf).name)
    else:
        from qval.config import ModelConfig
        from qval.models import load_tokenizer

        tok = load_tokenizer(ModelConfig())
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


if __name__ == "__main__":
    sys.exit(main())
