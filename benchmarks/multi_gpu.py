"""Several GPUs: the reference spread over them (model.placement) against one GPU, and the per-GPU
parallel sweep against the same sweep in turn.

    python benchmarks/multi_gpu.py --tokenizer .tok --out $OUT

(`bash benchmarks/device.sh multi_gpu` runs it with lib/nojit.py's switch in a sitecustomize on
PYTHONPATH, so the sweep's worker processes skip ModelOpt's CUDA-extension build too)

1. A random-weight 8B layout (benchmarks/lib/shapes.py, seed 0) saved as a safetensors folder, then
   gated twice at small budgets (gate 1, gate 3, gate 1 at depth; diagnostics off): on one GPU
   (placement single) and spread over every visible GPU (placement spread, accelerate
   device_map). Records where the layers went, the peak memory of each GPU, and whether the two
   runs' figures are identical.
2. `qval sweep --parallel auto` of two candidates (FP8 with an FP16 and an FP8 KV cache) on that
   folder, one worker per GPU, and the same sweep in turn: seconds of each and the ranking.
Writes $OUT/multi_gpu.json. Random weights: figures are for identity and timing, not quality.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def config(name: str, folder: Path, reports: Path, placement: str, kv: str = "fp16") -> dict:
    data = ROOT / "calib_data"
    return {"name": name, "model": {"source": "path", "path": str(folder), "dtype": "bfloat16", "placement": placement},
            "quant": {"format": "fp8", "kv_cache": kv},
            "calibration": {"dataset": str(data / "general_mix.jsonl"), "samples": 16, "seq_len": 256},
            "gates": {"agreement": {"dataset": str(data / "heldout_eval.jsonl"), "tokens": 4096, "ctx": 512, "min_top1": 0.0,
                                    "max_mean_kld": 1e9},
                      "longgen": {"enabled": True, "max_prompts": 2, "new_tokens": 128, "window": 32, "edge": 32,
                                  "piece": 64, "min_late_top1": 0.0},
                      "depth": {"enabled": True, "dataset": str(data / "longctx_docs.jsonl"), "ctx": 2048, "tokens": 2048,
                                "piece": 512, "min_top1": 0.0}},
            "diagnostics": {"enabled": False}, "report": {"dir": str(reports)}}


def figures(report: dict) -> dict:
    return {f"{g}.{k}": e.get("value") for g, r in report["gates"].items() for k, e in (r.get("measurements") or {}).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    from lib import shapes
    from qval import pipeline
    from qval.config import parse_config
    from qval.memory import free_memory
    from qval.models import load_model
    from qval.progress import Progress

    out: dict = {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    path = Path(args.out) / "multi_gpu.json"
    work = Path("/tmp/multigpu")
    folder = work / "model8b"
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    t0 = time.perf_counter()
    loaded = shapes.random_llama("8b", tok, "cuda:0", torch.bfloat16, folder)
    loaded.model.save_pretrained(folder)
    out["saved_s"] = round(time.perf_counter() - t0, 1)
    del loaded
    free_memory()
    runs = {}
    for placement in ("single", "spread"):
        try:
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)
            cfg = parse_config(config(f"place-{placement}", folder, work / f"reports-{placement}", placement), f"<{placement}>")
            t1 = time.perf_counter()
            reference = load_model(cfg.model)  # loaded here so that where accelerate put the layers can be read
            devices_used = sorted(set(map(str, getattr(reference.model, "hf_device_map", {}).values())))
            r = pipeline.run_gate(cfg, Progress(False), reference=reference)
            del reference
            runs[placement] = {"seconds": round(time.perf_counter() - t1, 1), "decision": r.report["verdict"]["decision"],
                               "devices_used": devices_used, "notes": r.report["model"].get("notes"),
                               "peak_gb_per_gpu": [round(torch.cuda.max_memory_allocated(i) / 1e9, 1)
                                                   for i in range(torch.cuda.device_count())],
                               "figures": figures(r.report)}
            del r
            free_memory()
        except Exception as err:  # noqa: BLE001 - keep the other measurements
            runs[placement] = {"error": f"{type(err).__name__}: {err}"}
        out["placement"] = runs
        path.write_text(json.dumps(out, indent=1, default=str))
        print(json.dumps(runs[placement], indent=1, default=str)[:3000], flush=True)
    if all("figures" in runs.get(p, {}) for p in ("single", "spread")):
        a, b = runs["single"]["figures"], runs["spread"]["figures"]
        out["spread_vs_single_differing"] = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
    # the parallel sweep, then the same sweep in turn
    files = []
    for name, kv in (("sw-fp16kv", "fp16"), ("sw-fp8kv", "fp8")):
        p = work / f"{name}.yaml"
        p.write_text(yaml.safe_dump(config(name, folder, work / "unused", "single", kv)))
        files.append(str(p))
    for mode, extra in (("parallel", ["--parallel", "auto"]), ("in_turn", [])):
        t1 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "qval", "sweep", *files, "--out",
                               str(work / f"sweep-{mode}"), "-q", *extra], capture_output=True, text=True)
        res = {"seconds": round(time.perf_counter() - t1, 1), "exit": proc.returncode, "tail": proc.stdout[-1500:] + proc.stderr[-1500:]}
        sj = work / f"sweep-{mode}" / "sweep.json"
        if sj.is_file():
            s = json.loads(sj.read_text())
            res["ranking"] = [(e["name"], e["status"], e.get("seconds")) for e in s["ranking"]]
            res["reference"] = s["reference"]
        out[f"sweep_{mode}"] = res
        path.write_text(json.dumps(out, indent=1, default=str))
        print(mode, json.dumps({k: v for k, v in res.items() if k != "tail"}, default=str), flush=True)


if __name__ == "__main__":
    main()
