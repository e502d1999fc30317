"""End to end: the whole gate's wall time, where its seconds go, and the memory of a model too large
to hold twice.

- `e2e`: `run_gate` (what `qval gate` runs, minus argument parsing) for an FP8 fake-quant candidate of
  a random-weight layout (`--shape 8b`, bf16) with gates 1–3 at their default budgets (65,536 gate-1
  tokens, the BLEU set, 8 prompts × 2,048 new tokens), 512 × 512 calibration tokens, diagnostics on
  (`--diagnostics off` to leave them out), the reference's generations computed in the run, thresholds
  loose so a rejected candidate's extra work never runs. The reference is already in memory (random
  weights: no file to load). Per stage: seconds and peak memory from the report. With `--spans`, named
  functions of the gate timed inclusively, the GPU synced at each edge (`lib/spans.py`; the syncs cost
  a little time, so the figure of record is a run without them);
- `sequential`: every gate on at reduced budgets for a layout whose reference and candidate do not
  fit one GPU together (`--seq-shape 57b`: 111.6 GB of bf16 weights), with `snapshot.sequential`, the
  reference reloaded from its seed each time a phase needs it; per stage: seconds and peak CUDA
  memory; `--both-in-memory` runs the same config without it (the control: it must not fit).

    python3 benchmarks/end_to_end.py --tokenizer .tok --out DIR [--spans]                 # a GPU
    python3 benchmarks/lib/nojit.py benchmarks/end_to_end.py --only sequential --tokenizer .tok --out DIR
    python3 benchmarks/end_to_end.py --smoke --out DIR                                    # anywhere, toy shape

ModelOpt's FP8 kernel is JIT-built once per machine before the run and timed apart (`lib/nojit.py`
skips it). Random weights: the figures time and size the run; the gates' figures mean nothing.
DIR/end_to_end.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from lib import setup, shapes, spans  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (import order, as the other scripts)

STEPS = "e2e,sequential"


def reduced_gates(data: Path) -> dict[str, Any]:
    """Every gate on, budgets reduced, thresholds loose (the weights are random: we size and time)."""
    heldout, docs = str(data / "heldout_eval.jsonl"), str(data / "longctx_docs.jsonl")
    return {
        "agreement": {"dataset": heldout, "tokens": 2048, "ctx": 512, "batch_size": 2, "min_top1": 0.0, "max_mean_kld": 1e9},
        "quality": {"max_ppl_ratio": 1e9, "bleu_max_new_tokens": 16, "batch_size": 8, "max_bleu_drop": 100.0},
        "longgen": {"max_prompts": 2, "new_tokens": 128, "window": 32, "edge": 32, "piece": 64, "min_late_top1": 0.0,
                    "max_late_drift": 1e9},
        "depth": {"dataset": docs, "ctx": 2048, "tokens": 2048, "piece": 512, "min_top1": 0.0, "max_mean_kld": 1e9},
        "retrieval": {"haystack": docs, "lengths": [512, 1024], "depths": [0.0, 1.0], "trials": 1, "margin": 1.0},
        "tasks": {"suites": [{"builtin": "recall", "size": 8, "margin": 1.0}, {"builtin": "cloze", "size": 8, "margin": 1.0},
                             {"builtin": "choice", "size": 8, "margin": 1.0}]},
    }


def e2e(loaded: Any, cfg: Any, with_spans: bool) -> dict[str, Any]:
    if not with_spans:
        return setup.end_to_end(loaded, cfg)
    with spans.recording(spans.GATE_SPANS) as rec:
        facts = setup.end_to_end(loaded, cfg)
    facts["spans"] = rec.table()
    return facts


def sequential(tok: Any, shape: str, dev: str, work: Path, sequential: bool) -> dict[str, Any]:
    import torch

    from qval import pipeline
    from qval.config import parse_config
    from qval.progress import Progress

    loads: list[float] = []

    def loader() -> Any:  # the reference, from its seed (the same weights every time)
        t0 = time.perf_counter()
        m = shapes.random_llama(shape, tok, dev, torch.bfloat16 if dev == "cuda" else torch.float32, work / "model_seq")
        loads.append(round(time.perf_counter() - t0, 2))
        return m

    probe = loader()  # the folder (config + tokenizer) the config names; its size for the record
    out: dict[str, Any] = {"shape": shape, "sequential": sequential, "parameters": shapes.parameters(probe.model),
                           "weight_gb": shapes.weight_bytes_per_step(probe.model) / 1e9,
                           "gpu_total_gb": torch.cuda.get_device_properties(0).total_memory / 1e9 if dev == "cuda" else None}
    del probe
    setup.free(dev)
    loads.clear()
    cfg = parse_config({"name": f"seq-{shape}", "model": {"source": "path", "path": str(work / "model_seq"), "dtype": "bfloat16"},
                        "quant": {"format": "fp8", "kv_cache": "fp16"},
                        "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 16, "seq_len": 256},
                        "gates": reduced_gates(ROOT / "calib_data"), "diagnostics": {"enabled": False},
                        "snapshot": {"sequential": sequential}, "report": {"dir": str(work / "reports_seq")}}, f"<seq {shape}>")
    t0 = time.perf_counter()
    rep = pipeline.run_gate(cfg, Progress(False), loader=loader).report
    out.update({"seconds": round(time.perf_counter() - t0, 1), "reference_loads_s": loads, "decision": rep["verdict"]["decision"],
                "stages": rep["stages"], "fill": rep["model"].get("snapshot_fill"), "snapshot": rep["model"].get("snapshot"),
                "gate_status": {k: v["status"] for k, v in rep["gates"].items()},
                "gate_snapshot": {k: v["details"].get("snapshot") for k, v in rep["gates"].items()},
                "peak_cuda_gb_overall": torch.cuda.max_memory_allocated() / 1e9 if dev == "cuda" else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    setup.common_args(ap, "e2e", "end_to_end_out")
    ap.add_argument("--spans", action="store_true", help="e2e: time the gate's stages and the engines' work inside them")
    ap.add_argument("--diagnostics", choices=("on", "off"), default="on", help="e2e: the diagnostics stage (default on, as shipped)")
    ap.add_argument("--seq-shape", default="57b", help="sequential: the layout (57b: does not fit an H200 twice)")
    ap.add_argument("--both-in-memory", action="store_true", help="sequential without snapshot.sequential (the control)")
    ap.add_argument("--nojit", action="store_true", help="do not JIT-build ModelOpt's FP8 kernel first (lib/nojit.py does that)")
    args = ap.parse_args(argv)
    dev = setup.device()
    if args.deterministic:
        from qval import determinism

        determinism.configure(dev)
    plan = setup.SMOKE if args.smoke else setup.FULL
    shape = "smoke" if args.smoke else args.shape
    out = Path(args.out)
    work = out / "work"
    run = setup.Run(out / "end_to_end.json", args.only, args.deadline)
    if dev == "cuda" and not args.nojit:
        run.step("e2e:fp8_kernel_build", 0, setup.prebuild_fp8_kernel)
    tok = setup.load_tokenizer(args.tokenizer, args.gguf if shape == "real" else None)
    if run.wants("e2e"):
        loaded, spec = setup.load_shape(shape, tok, dev, work, args.gguf)
        run.results["model"] = {"name": loaded.name, "parameters": shapes.parameters(loaded.model)}
        data = setup.bench_data(plan, tok, work, plan["gate"].get("agreement", {}).get("tokens", 65536))
        cfg = setup.gate_config(f"e2e-{shape}", spec, data, work / "reports_e2e", plan, diagnostics=args.diagnostics)
        run.step("e2e", 60, lambda: e2e(loaded, cfg, args.spans))
        del loaded
        setup.free(dev)
    run.step("sequential", 60, lambda: sequential(tok, "smoke" if args.smoke else args.seq_shape, dev, work, not args.both_in_memory))
    print({k: (v.get("wall_s") or v.get("seconds") or v.get("error")) if isinstance(v, dict) else v
           for k, v in run.results.items() if k in ("e2e", "sequential")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
