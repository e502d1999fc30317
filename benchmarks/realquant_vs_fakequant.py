"""realquant against fakequant: how far the deployed kernels' outputs are from the simulated ones, and
each from the reference.

    python3 benchmarks/lib/nojit.py benchmarks/realquant_vs_fakequant.py --format fp8 --tokens 32768 --out DIR/realquant_fp8.json   # a GPU

Both candidates are built from one calibration of the built-in model (qval's calibrate stage, cached
under --work): `fakequant` (ModelOpt simulated quantization, weights folded) and `realquant`
(mtq.compress: FP8 weights in float8_e4m3fn; on Hopper, FP8 GEMMs through torch._scaled_mm). Both
score the same held-out chunks teacher-forced (gate 1's convention: ctx-token chunks, second half
scored); per scored position: top-1 agreement and KLD(fakequant ‖ realquant), and each model's KLD
against the reference. It also times one pass of each and writes each engine's description (which
GEMM every quantized linear ran), so a fallback to emulation cannot pass for a real FP8 result. The
JSON holds every figure with its standard error. (`qval gate` with `engine: {backend: realquant}` is
the gate itself on the same model.)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def kld(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = p_logits.float().log_softmax(-1), q_logits.float().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def estimate(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "stderr": float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan"),
            "p99": float(np.quantile(x, 0.99)), "max": float(x.max()), "n": int(x.size)}


def build_pair(cfg_data: dict, work: str) -> tuple:
    """One calibration of `cfg_data` (the calibrate stage, cached under `work`) and the two
    candidates built from it by qval's pipeline: (reference, {"fakequant": engine, "realquant": engine})."""
    from qval import pipeline
    from qval.config import parse_config
    from qval.models import load_model
    from qval.progress import Progress

    ref = load_model(parse_config(cfg_data, "<benchmark>").model)
    built = {}
    for backend in ("fakequant", "realquant"):
        cfg = parse_config({**cfg_data, "engine": {"backend": backend}}, "<benchmark>")
        s = pipeline.Session.open(cfg, work, Progress(), loader=lambda: ref)
        built[backend] = pipeline.build(s, pipeline.calibrate(s))
    return ref, built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", default="fp8", choices=["fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4"])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=64, help="calibration samples of 512 tokens")
    ap.add_argument("--work", default="reports/bench-realquant")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from qval.data import chunk, load_dataset, token_stream

    root = Path(__file__).resolve().parent.parent
    cfg_data = {"name": f"bench-{args.format}", "model": {"source": "default", "dtype": "float16"},
                "quant": {"format": args.format, "kv_cache": "fp16"} | ({"awq_block_size": 64} if "awq" in args.format else {}),
                "calibration": {"dataset": str(root / "calib_data/general_mix.jsonl"), "samples": args.samples, "seq_len": 512},
                "gates": {"agreement": {"enabled": False}}, "diagnostics": {"enabled": False}}
    ref, built = build_pair(cfg_data, args.work)

    ds = load_dataset(str(root / "calib_data/heldout_eval.jsonl"))
    ids = token_stream(ds.texts(), ref.tokenizer, ref.tokenizer.eos_token_id)
    chunks = chunk(ids, args.ctx, limit=args.tokens // args.ctx)
    half = args.ctx // 2
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("top1", "kld_fq_rq", "kld_ref_fq", "kld_ref_rq")}
    seconds = {"fakequant": 0.0, "realquant": 0.0}
    with torch.no_grad():
        for b0 in range(0, len(chunks), args.batch):
            x = torch.tensor(chunks[b0 : b0 + args.batch], device=ref.device)
            r = ref.model(input_ids=x, use_cache=False).logits[:, half:-1]
            out = {}
            for name, eng in built.items():
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out[name] = eng.logits(x)[:, half:-1]
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds[name] += time.perf_counter() - t0
            fq, rq = out["fakequant"], out["realquant"]
            rows["top1"].append((fq.argmax(-1) == rq.argmax(-1)).float().flatten().cpu().numpy())
            rows["kld_fq_rq"].append(kld(fq, rq).flatten().cpu().numpy())
            rows["kld_ref_fq"].append(kld(r, fq).flatten().cpu().numpy())
            rows["kld_ref_rq"].append(kld(r, rq).flatten().cpu().numpy())
    figures = {k: estimate(np.concatenate(v)) for k, v in rows.items()}
    result = {"format": args.format, "device": ref.device, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "model": ref.describe(), "scored_positions": figures["top1"]["n"], "figures": figures,
              "forward_seconds": {k: round(v, 3) for k, v in seconds.items()},
              "realquant": built["realquant"].describe(), "fakequant": built["fakequant"].describe()}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
