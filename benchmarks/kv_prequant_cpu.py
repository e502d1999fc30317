"""FP8 KV cache on CPU: ModelOpt's whole-cache re-quantization per step against qval's
quantization on cache entry (qval/engines/kvcache.py). Same candidate, same prompts, greedy:

    python benchmarks/kv_prequant_cpu.py --new-tokens 1024 --batch 8

Prints the wall time of each path's generation and whether their tokens are identical.
`--device cuda` runs the same comparison on a GPU (benchmarks/h200_realquant.sh kvpre).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the same comparison on a GPU (both engines forced onto the plain decode path, "
                         "the one that uses the cache quantized on entry)")
    args = ap.parse_args()

    from qval.config import parse_config
    from qval.data import load_dataset
    from qval.engines import ENGINES, BuildContext
    from qval.engines.fakequant import FakeQuantEngine
    from qval.pipeline import Session, calibrate
    from qval.progress import Progress
    from qval.reference import render_prompts
    from qval.stages import RunDir

    root = Path(__file__).resolve().parent.parent
    data = {"name": "bench-kvpre", "model": {"source": "default", "device": args.device}, "quant": {"format": "fp8", "kv_cache": "fp8"},
            "calibration": {"dataset": str(root / "calib_data/general_mix.jsonl"), "samples": 64, "seq_len": 512},
            "gates": {"agreement": {"enabled": False}}, "diagnostics": {"enabled": False}}
    cfg = parse_config(data, "<benchmark>")
    work = Path(tempfile.mkdtemp(prefix="qval-kvpre-"))
    s = Session(config=cfg, run=RunDir(work, cfg.name), progress=Progress())
    stage = calibrate(s)
    ref = s.reference
    entry = ENGINES.get("fakequant")(BuildContext(cfg, ref, stage.path / "quant_state.pt", work))
    modelopt = FakeQuantEngine(entry.model, entry.tokenizer)  # no entry quantization: ModelOpt's path
    entry.decode = modelopt.decode = "plain"
    if args.device == "cuda":
        entry.prequantize_kv(on_gpu=True)  # qval does not on a GPU (this comparison is why)
    ds = load_dataset(str(root / "calib_data/longgen_prompts.jsonl"))
    prompts, _ = render_prompts(ref.tokenizer, [r["prompt"] for r in ds.records[: args.batch]])  # gate 3's prompts and rendering
    out = {"device": args.device, "notes": entry.describe()["notes"], "threads": torch.get_num_threads(), "batch": len(prompts), "new_tokens": args.new_tokens,
           "entry_layers": len(entry.kv_quantizers)}
    runs = [("entry", entry), ("modelopt", modelopt)]
    if args.device == "cuda":  # control: is ModelOpt's own path deterministic from run to run there?
        runs.append(("modelopt_again", modelopt))
    for name, eng in runs:
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = eng.generate(prompts, args.new_tokens, suppress_eos=True, batch_size=len(prompts))
        if args.device == "cuda":
            torch.cuda.synchronize()
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
        out[f"{name}_tokens"] = g.tokens
    if args.device == "cuda":
        again = out.pop("modelopt_again_tokens")
        out["modelopt_rerun_identical_tokens"] = again == out["modelopt_tokens"]
    first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(out["entry_tokens"], out["modelopt_tokens"])]
    out["first_differing_token_per_prompt"] = first
    out["identical_tokens"] = out.pop("entry_tokens") == out.pop("modelopt_tokens")
    out["speedup"] = round(out["modelopt_seconds"] / out["entry_seconds"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
