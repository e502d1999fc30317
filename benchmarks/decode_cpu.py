"""Decode on a CPU: two models side by side, and an FP8 KV cache quantized on entry.

`side_by_side`: decoding (8 prompts × `--new-tokens`, batch 8) and a prefill (1,024 tokens through
the KV cache in pieces of 256) of the built-in model and a copy of it, timed one model with all
threads, one with a share, two in turn and two side by side (`qval/engines/concurrent.py`), and
whether the numbers agree. Stop other heavy processes first: two processes on two cores distort
every figure.

`kv_entry`: an FP8-KV candidate's greedy generation (gate 3's first `--batch` prompts), ModelOpt's
whole-cache re-quantization per step against qval's quantization on cache entry
(`qval/engines/kvcache.py`): the wall time of each and whether their tokens are identical.
`--device cuda` runs the same comparison on a GPU (both engines forced onto the plain decode path,
the one that uses the cache quantized on entry), with a control: ModelOpt's path run twice.

    python benchmarks/decode_cpu.py --only side_by_side --new-tokens 96
    python benchmarks/decode_cpu.py --only kv_entry --new-tokens 1024 --batch 8
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(f: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def side_by_side(new: int) -> dict[str, Any]:
    import torch

    from qval.config import load_config
    from qval.engines.concurrent import side_by_side as paired_run
    from qval.engines.hf import HFEngine
    from qval.models import load_model

    lm = load_model(load_config(ROOT / "checks/fp8_kvfp16.yaml").model)
    a, b = HFEngine(lm.model, lm.tokenizer), HFEngine(copy.deepcopy(lm.model), lm.tokenizer)
    total = torch.get_num_threads()
    ids = torch.randint(0, int(lm.model.config.vocab_size), (1, 1024), generator=torch.Generator().manual_seed(0))
    prompts = [lm.tokenizer(f"Tell me a story about number {i}.")["input_ids"] for i in range(8)]

    def prefill(e: Any) -> Any:
        return [x.sum().item() for x in e.logits_pieces(ids, 256)]

    def decode(e: Any) -> Any:
        return e.generate(prompts, new, suppress_eos=True, batch_size=8).tokens

    out = {"threads": total}
    for name, job in (("prefill_1024", prefill), (f"decode_8x{new}", decode)):
        t_all, r_all = timed(lambda: job(a))
        torch.set_num_threads(max(1, total // 2))
        t_share, r_share = timed(lambda: job(a))
        torch.set_num_threads(total)
        t_pair, (r_pair, paired) = timed(lambda: paired_run([lambda: job(a), lambda: job(b)], [a, b]))
        out[name] = {"one_all_threads_s": t_all, "one_share_s": t_share, "two_in_turn_s": 2 * t_all, "two_side_by_side_s": t_pair,
                     "paired": paired, "side_by_side_equals_alone_with_same_threads": r_pair[0] == r_share and r_pair[1] == r_share,
                     "share_equals_all_threads": r_share == r_all}
        print(f"{name}: one model, {total} threads {t_all:.2f} s; one model, {max(1, total // 2)} thread(s) {t_share:.2f} s; "
              f"two in turn {2 * t_all:.2f} s; two side by side {t_pair:.2f} s (paired: {paired})", flush=True)
    return out


def kv_entry(new_tokens: int, batch: int, device: str) -> dict[str, Any]:
    import torch

    from qval import pipeline
    from qval.config import parse_config
    from qval.data import load_dataset
    from qval.progress import Progress
    from qval.reference import render_prompts

    data = {"name": "bench-kvpre", "model": {"source": "default", "device": device}, "quant": {"format": "fp8", "kv_cache": "fp8"},
            "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 64, "seq_len": 512},
            "gates": {"agreement": {"enabled": False}}, "diagnostics": {"enabled": False}}
    cfg = parse_config(data, "<benchmark>")
    work = Path(tempfile.mkdtemp(prefix="qval-kvpre-"))
    s = pipeline.Session.open(cfg, work, Progress())
    entry = pipeline.build(s, pipeline.calibrate(s))  # quantizes the KV cache on entry (on a CPU)
    modelopt = type(entry)(entry.model, entry.tokenizer)  # no entry quantization: ModelOpt's path
    entry.decode = modelopt.decode = "plain"
    if device == "cuda":
        entry.prequantize_kv(on_gpu=True)  # qval does not on a GPU (this comparison is why)
    ds = load_dataset(str(ROOT / "calib_data/longgen_prompts.jsonl"))
    prompts, _ = render_prompts(s.ref.tokenizer, [r["prompt"] for r in ds.records[:batch]])  # gate 3's prompts and rendering
    out: dict[str, Any] = {"device": device, "notes": entry.describe()["notes"], "threads": torch.get_num_threads(), "batch": len(prompts),
                           "new_tokens": new_tokens, "entry_layers": len(entry.kv_quantizers)}
    runs = [("entry", entry), ("modelopt", modelopt)] + ([("modelopt_again", modelopt)] if device == "cuda" else [])
    for name, eng in runs:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = eng.generate(prompts, new_tokens, suppress_eos=True, batch_size=len(prompts))
        if device == "cuda":
            torch.cuda.synchronize()
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
        out[f"{name}_tokens"] = g.tokens
    if device == "cuda":
        out["modelopt_rerun_identical_tokens"] = out.pop("modelopt_again_tokens") == out["modelopt_tokens"]
    out["first_differing_token_per_prompt"] = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                                               for x, y in zip(out["entry_tokens"], out["modelopt_tokens"])]
    out["identical_tokens"] = out.pop("entry_tokens") == out.pop("modelopt_tokens")
    out["speedup"] = round(out["modelopt_seconds"] / out["entry_seconds"], 2)
    print(json.dumps(out, indent=2), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="side_by_side,kv_entry", help="comma list of side_by_side, kv_entry")
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens per prompt (default: 96 side by side, 1024 kv_entry)")
    ap.add_argument("--batch", type=int, default=8, help="kv_entry: prompts decoded together")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="kv_entry: cuda runs the same comparison on a GPU")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args(argv)
    only, out = set(args.only.split(",")), {}
    if "side_by_side" in only:
        out["side_by_side"] = side_by_side(args.new_tokens or 96)
    if "kv_entry" in only:
        out["kv_entry"] = kv_entry(args.new_tokens or 1024, args.batch, args.device)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
