"""Issue 15: the static decode step against its memory floor, as the context grows.

    python3 benchmarks/nojit.py benchmarks/h200_decode.py --tokenizer .tok --out $OUT [--shape 8b]

On a random-weight Llama of the named layout (bf16), for the static path attending over the whole
cache (before, `HFEngine.static_filled = False`) and over the filled slots with K/V read once per
GQA group (after, the default; qval/engines/decode_attention.py), in one process:

- batch 1, 256 new tokens: ms per step against the roofline (weight bytes ÷ the copy bandwidth
  measured at the start of this run);
- batch 8, `--new-tokens` (gate 3's 2,048): ms per step in segments of 256 steps (CUDA events,
  no sync inside), each against its floor: weight bytes plus the K/V bytes a step of that
  segment must read (the slots filled so far, every row), ÷ bandwidth;
- whether the two paths' greedy tokens agree with each other and with the plain path
  (transformers' `generate`) at batch 8 over 256 tokens: first divergence per row;
- the kernel profile of the after path's step at batch 8 (benchmarks/measure.py's step_profile).

Random weights: the figures time the step; the tokens say nothing of quality. $OUT/h200_decode.json.
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

import measure  # noqa: E402
import shapes  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (import order, as bench.py)

SEGMENT = 256


def kv_bytes_per_slot(cfg) -> int:  # noqa: ANN001 - a transformers config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head * 2  # K and V, bf16


def with_floors(t: dict, weight_bytes: int, batch: int, per_slot: int, bytes_per_s: float) -> dict:
    """A `timeline`'s segments against their floors: (weight bytes + every row's K/V slots a step
    of the segment reads, on average) ÷ bandwidth; and the whole generation's ratio."""
    for s in t["segments"]:
        seen = (s["context"][0] + s["context"][1]) / 2
        floor = 1000 * (weight_bytes + batch * seen * per_slot) / bytes_per_s
        s.update(floor_ms=floor, x_floor=s["ms_per_step"] / floor)
    total_floor = sum(s["floor_ms"] * (s["steps"][1] - s["steps"][0]) for s in t["segments"])
    total = sum(s["ms_per_step"] * (s["steps"][1] - s["steps"][0]) for s in t["segments"])
    t["x_floor_overall"] = total / total_floor
    return t


def timeline(engine, group: list[list[int]], new_tokens: int) -> dict:  # noqa: ANN001
    """One warm run (captures every bucket's graph), then a timed one with an event per segment."""
    import torch

    engine.generate(group, new_tokens, suppress_eos=True, batch_size=len(group))
    dec = engine._decoder
    events: list[tuple[int, torch.cuda.Event]] = []

    def mark(done: int) -> None:
        if done % SEGMENT == 0 or done == new_tokens:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            events.append((done, e))

    dec.on_step = mark
    start = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    gen = engine.generate(group, new_tokens, suppress_eos=True, batch_size=len(group))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    dec.on_step = None
    width = max(len(p) for p in group)
    segments, prev_done, prev = [], 1, start
    for done, e in events:
        ms = prev.elapsed_time(e) / max(done - prev_done, 1)
        segments.append({"steps": [prev_done, done], "context": [width + prev_done, width + done], "ms_per_step": ms})
        prev_done, prev = done, e
    return {"batch": len(group), "new_tokens": new_tokens, "prompt_width": width, "wall_s": wall,
            "graphs": sorted(dec.graphs), "segments": segments, "tokens": gen.tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from qval.engines.hf import HFEngine
    from qval.reference import render_prompts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": args.shape}

    def save() -> None:
        (out / "h200_decode.json").write_text(json.dumps(res, indent=1, default=str))

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    bw = measure.hbm_bandwidth("cuda")
    res["bandwidth"] = bw
    loaded = shapes.random_llama(args.shape, tok, "cuda", torch.bfloat16, out / "work" / f"model_{args.shape}")
    model = loaded.model
    wbytes = shapes.weight_bytes_per_step(model)
    per_slot = kv_bytes_per_slot(model.config)
    res.update(weight_bytes=wbytes, kv_bytes_per_slot_per_row=per_slot, roofline_ms=1000 * wbytes / bw["bytes_per_s"])
    records = [json.loads(line) for line in (ROOT / "calib_data/longgen_prompts.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts, _ = render_prompts(tok, [r["prompt"] for r in records])
    group = [prompts[i % len(prompts)] for i in range(args.batch)]
    engine = HFEngine(model, tok, decode="static")
    tokens: dict[str, list] = {}
    for name, filled in (("whole_cache", False), ("filled_slots", True)):
        engine.static_filled, engine._decoder = filled, None
        row: dict = {}
        try:
            one = measure.decode_speed(engine, prompts[:1], 1, 256, 3, "static")
            one["x_roofline"] = one["ms_per_step"] / res["roofline_ms"]
            row["batch1"] = one
            engine.decode = "static"
            t = timeline(engine, group, args.new_tokens)
            tokens[name] = t.pop("tokens")
            with_floors(t, wbytes, args.batch, per_slot, bw["bytes_per_s"])
            row["batch8"] = t
        except Exception as err:  # keep what was measured
            row["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
        res[name] = row
        save()
        print(name, json.dumps({k: v for k, v in row.items() if k != "batch8"}, default=str)[:400], flush=True)
        if "batch8" in row:
            print("  batch 8:", [(s["context"][1], round(s["ms_per_step"], 2), round(s["x_floor"], 2)) for s in row["batch8"]["segments"]],
                  f"overall x{row['batch8']['x_floor_overall']:.2f} of the floor, {row['batch8']['wall_s']:.1f} s", flush=True)
    if len(tokens) == 2:
        a, b = tokens["whole_cache"], tokens["filled_slots"]
        res["whole_vs_filled_first_divergence"] = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), None) for r, s in zip(a, b)]
    try:
        engine.static_filled, engine._decoder = True, None
        res["identity_plain_vs_filled"] = measure.greedy_identity(engine, prompts, args.batch, 256)
        engine.static_filled, engine._decoder = False, None
        res["identity_plain_vs_whole"] = measure.greedy_identity(engine, prompts, args.batch, 256)
        engine.static_filled, engine._decoder = True, None
        res["profile_filled_batch8"] = measure.step_profile(engine, prompts, args.batch, 256, wbytes, bw["bytes_per_s"])
    except Exception as err:
        res["identity_error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
    save()
    print(json.dumps({k: res.get(k) for k in ("whole_vs_filled_first_divergence", "identity_plain_vs_filled", "identity_plain_vs_whole")},
                     default=str)[:1500])
    prof = res.get("profile_filled_batch8") or {}
    print("profile:", json.dumps({k: prof.get(k) for k in ("wall_ms_per_step", "device_busy_ms_per_step", "by_kind", "top_kernels")}, default=str)[:2500])


if __name__ == "__main__":
    main()
