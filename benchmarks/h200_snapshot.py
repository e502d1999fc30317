"""Issue 14 on the H200: the reference snapshot's KLD against the full computation on an 8B-shaped
model, and a model whose reference and candidate do not fit the GPU together gated end to end in
sequential mode (one model in memory at a time), with every gate at reduced budgets.

    python benchmarks/nojit.py benchmarks/h200_snapshot.py --tokenizer .tok --out $OUT [--only k e2e]

`k`: benchmarks/snapshot_k.py's measurement on the random 8B layout (FP8 candidate, gate 1's
chunks): mean/p99 KLD from the snapshot for several k against the full-logit KLD. `e2e`: the 57B
layout (shapes.py) through `pipeline.run_gate` with snapshot.sequential, the reference reloaded
from its seed each time a phase needs it; per stage: seconds and peak CUDA memory. Random weights:
the figures time and size the run, they say nothing of quality. Writes $OUT/h200_snapshot.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def gates(data: Path) -> dict:
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


def measure_k(tok, out: dict, ks: list[int], shape: str = "8b", device: str = "cuda") -> None:  # noqa: ANN001
    import numpy as np
    import torch

    import shapes
    from qval import pipeline
    from qval.config import parse_config
    from qval.gates.agreement import chunks_for
    from qval.metrics.tokens import token_stats
    from qval.snapshot.compact import compress, stats
    from qval.stages import RunDir

    work = Path(f"/tmp/snapk-{shape}")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loaded = shapes.random_llama(shape, tok, device, dtype, work / "model")
    cfg = parse_config({"name": "k8b", "model": {"source": "path", "path": str(work / "model"), "dtype": "bfloat16"},
                        "quant": {"format": "fp8"}, "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"),
                                                                   "samples": 16, "seq_len": 256},
                        "gates": {"agreement": gates(ROOT / "calib_data")["agreement"] | {"tokens": 8192, "batch_size": 4}},
                        "report": {"dir": str(work / "reports")}}, "<k8b>")
    s = pipeline.Session(config=cfg, run=RunDir(work / "reports", cfg.name), progress=pipeline.SILENT, _reference=loaded)
    cand = pipeline.build(s, pipeline.calibrate(s))
    ref, g = s.ref_engine, cfg.gates.agreement
    chunks, _ = chunks_for(cfg, tok)
    half = g.ctx // 2
    exact, by_k = [], {k: [] for k in ks}
    for b0 in range(0, len(chunks), g.batch_size):
        x = torch.tensor(chunks[b0 : b0 + g.batch_size])
        lr, lc = ref.logits(x), cand.logits(x)
        v = lr.shape[-1]
        rr, rc, tgt = lr[:, half:-1].reshape(-1, v), lc[:, half:-1].reshape(-1, v), x[:, half + 1 :].reshape(-1)
        exact.append(token_stats(rr, rc, tgt)["kld"].numpy())
        for k in ks:
            by_k[k].append(stats(compress(rr, tgt, k), rc, tgt)["kld"].numpy())
    e = np.concatenate(exact)
    out[f"k_{shape}"] = {"positions": int(e.size), "mean_kld_exact": float(e.mean()), "p99_kld_exact": float(np.quantile(e, 0.99)),
                   "by_k": {k: {"mean_kld": float(np.concatenate(v).mean()), "relative": float(np.concatenate(v).mean() / e.mean() - 1),
                                "p99_relative": float(np.quantile(np.concatenate(v), 0.99) / np.quantile(e, 0.99) - 1)}
                            for k, v in by_k.items()}}
    print(json.dumps(out[f"k_{shape}"], indent=1), flush=True)
    del s, cand, ref, loaded
    pipeline.free_memory()


def e2e(tok, out: dict, shape: str, device: str = "cuda", sequential: bool = True) -> None:  # noqa: ANN001
    import torch

    import shapes
    from qval import pipeline
    from qval.config import parse_config
    from qval.progress import Progress

    work = Path(f"/tmp/snap-{shape}")
    loads: list[float] = []

    def loader():  # noqa: ANN202 - the reference, from its seed (the same weights every time)
        t0 = time.perf_counter()
        m = shapes.random_llama(shape, tok, device, torch.bfloat16 if device == "cuda" else torch.float32, work / "model")
        loads.append(round(time.perf_counter() - t0, 2))
        return m

    loader_probe = loader()  # the folder (config + tokenizer) the config names; its size for the record
    out["e2e"] = {"shape": shape, "parameters": shapes.parameters(loader_probe.model),
                  "weight_gb": shapes.weight_bytes_per_step(loader_probe.model) / 1e9,
                  "gpu_total_gb": torch.cuda.get_device_properties(0).total_memory / 1e9 if device == "cuda" else None}
    del loader_probe
    pipeline.free_memory()
    loads.clear()
    cfg = parse_config({"name": f"seq-{shape}", "model": {"source": "path", "path": str(work / "model"), "dtype": "bfloat16"},
                        "quant": {"format": "fp8", "kv_cache": "fp16"},
                        "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 16, "seq_len": 256},
                        "gates": gates(ROOT / "calib_data"), "diagnostics": {"enabled": False},
                        "snapshot": {"sequential": sequential}, "report": {"dir": str(work / "reports")}}, f"<seq {shape}>")
    t0 = time.perf_counter()
    r = pipeline.run_gate(cfg, Progress(False), loader=loader)
    rep = r.report
    out["e2e"].update({
        "seconds": round(time.perf_counter() - t0, 1), "reference_loads_s": loads, "decision": rep["verdict"]["decision"],
        "stages": rep["stages"], "fill": rep["model"].get("snapshot_fill"), "snapshot": rep["model"].get("snapshot"),
        "gate_status": {k: v["status"] for k, v in rep["gates"].items()},
        "gate_snapshot": {k: v["details"].get("snapshot") for k, v in rep["gates"].items()},
        "peak_cuda_gb_overall": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None})
    print(json.dumps(out["e2e"], indent=1, default=str), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="+", default=["k", "e2e"])
    ap.add_argument("--shape", default="57b")
    ap.add_argument("--k", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--k-shape", default="8b")
    ap.add_argument("--both-in-memory", action="store_true", help="e2e without snapshot.sequential (the control: it must not fit)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (--shape smoke --k-shape smoke)")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    out: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "torch": torch.__version__}
    path = Path(args.out) / ("h200_snapshot_both.json" if args.both_in_memory else "h200_snapshot.json")
    for name, fn in (("k", lambda: measure_k(tok, out, args.k, args.k_shape, args.device)),
                     ("e2e", lambda: e2e(tok, out, args.shape, args.device, not args.both_in_memory))):
        if name not in args.only:
            continue
        try:
            fn()
        except Exception:  # noqa: BLE001 - keep what the other part measured
            out[f"{name}_error"] = traceback.format_exc()
            print(out[f"{name}_error"], flush=True)
        path.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
