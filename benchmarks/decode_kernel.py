"""A decode step's attention alone, as the static decoder runs it on the 8B layout (issue 15).

    python3 benchmarks/nojit.py benchmarks/decode_kernel.py --out DIR     # a GPU; ~1 minute

32 layers of distinct K/V caches (no L2 reuse, as in a real step), one bfloat16 query token per row,
left-padded rows (a boolean mask), replayed from one CUDA graph, at batch 8 and batch 1 and several
attended lengths, for:

- `sdpa_cudnn`: decode_attention.py's sdpa call (groups folded, filled slots, the mask) with cuDNN's
  attention allowed (torch's default);
- `sdpa_no_cudnn`: the same with cuDNN's attention off, as qval's deterministic mode runs it (the
  memory-efficient CUTLASS kernel);
- `kernel`: qval/engines/decode_kernel.py's split-KV kernel at its shipped configuration, and the best
  of a sweep of (slots per inner step, warps, stages), the sweep that chose `CONFIG`.

Each against its floor: the K/V bytes the step reads (rows × K/V heads × length × head dim × 2 × 2
bytes) ÷ the copy bandwidth measured at the start. Also each output's largest difference from float64
attention (relative to the output's largest value) and whether two launches give the same bits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import measure  # noqa: E402
from gemv import graph_time  # noqa: E402

from qval.engines import decode_kernel  # noqa: E402

KV_HEADS, GROUP, HEAD_DIM, LAYERS = 8, 4, 128, 32
SWEEP = [(blk, w, s) for blk in (32, 64, 128) for w in (4, 8) for s in (1, 2, 3)]
CASES = [(8, 256), (8, 1024), (8, 2048), (8, 2304), (1, 256), (1, 2048)]  # (rows, attended slots)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, length: int) -> torch.Tensor:
    """decode_attention.attention's sdpa branch."""
    b, hq, _, d = q.shape
    out = F.scaled_dot_product_attention(q.reshape(b, KV_HEADS, GROUP, d), k[:, :, :length], v[:, :, :length],
                                         attn_mask=mask[..., :length], scale=d ** -0.5)
    return out.reshape(b, hq, 1, d).transpose(1, 2).contiguous()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, length: int) -> torch.Tensor:
    kk = k[:, :, :length].double().repeat_interleave(GROUP, 1)
    vv = v[:, :, :length].double().repeat_interleave(GROUP, 1)
    sc = (q.double() @ kk.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return (sc.masked_fill(~mask[..., :length], float("-inf")).softmax(-1) @ vv).transpose(1, 2)


def run(out: Path, layers: int = LAYERS) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    assert decode_kernel._load(), decode_kernel.missing()
    bw = measure.hbm_bandwidth(dev)
    res: dict[str, Any] = {"bandwidth": bw, "layers": layers, "shipped_config": decode_kernel.CONFIG, "cases": []}
    for rows, length in CASES:
        slots = length + 64
        ks = [torch.randn(rows, KV_HEADS, slots, HEAD_DIM, dtype=dt, device=dev) for _ in range(layers)]
        vs = [torch.randn(rows, KV_HEADS, slots, HEAD_DIM, dtype=dt, device=dev) for _ in range(layers)]
        q = torch.randn(rows, KV_HEADS * GROUP, 1, HEAD_DIM, dtype=dt, device=dev)
        mask = torch.zeros(rows, 1, 1, slots, dtype=torch.bool, device=dev)
        for r in range(rows):
            mask[r, ..., (37 * r) % 100 : length] = True  # left padding of 0–99 slots
        floor = layers * rows * KV_HEADS * length * HEAD_DIM * 2 * 2 / bw["bytes_per_s"]
        row: dict[str, Any] = {"rows": rows, "length": length, "floor_us": 1e6 * floor}
        want = reference(q, ks[0], vs[0], mask, length)
        scale = want.abs().max().item()

        def err(got: torch.Tensor) -> float:
            return ((got.double() - want).abs().max() / scale).item()

        before = torch.backends.cuda.cudnn_sdp_enabled()  # put back after: later steps run in the process's own mode
        for name, cudnn in (("sdpa_cudnn", True), ("sdpa_no_cudnn", False)):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            t = graph_time(lambda: [sdpa(q, k, v, mask, length) for k, v in zip(ks, vs)])
            row[name] = {"us": 1e6 * t, "x_floor": t / floor, "rel_err": err(sdpa(q, ks[0], vs[0], mask, length))}
        torch.backends.cuda.enable_cudnn_sdp(before)
        cands = []
        for cfg in [None] + SWEEP:
            try:
                t = graph_time(lambda: [decode_kernel.attend(q, k, v, mask, length, HEAD_DIM ** -0.5, cfg) for k, v in zip(ks, vs)],
                               reps=5)
            except Exception as e:  # noqa: BLE001 - a configuration this GPU cannot compile
                print(f"[attn] {rows}x{length} {cfg}: {type(e).__name__}", flush=True)
                continue
            cands.append((t, cfg))
        shipped = next(t for t, c in cands if c is None)
        best_t, best = min(cands, key=lambda c: c[0])
        a = decode_kernel.attend(q, ks[0], vs[0], mask, length, HEAD_DIM ** -0.5)
        b = decode_kernel.attend(q, ks[0], vs[0], mask, length, HEAD_DIM ** -0.5)
        row["kernel"] = {"us": 1e6 * shipped, "x_floor": shipped / floor, "rel_err": err(a), "same_bits_twice": bool(torch.equal(a, b)),
                         "pieces": decode_kernel.splits(rows, KV_HEADS, length, decode_kernel.CONFIG[0]),
                         "best_config": best or "shipped", "best_us": 1e6 * best_t, "best_x_floor": best_t / floor,
                         "all": {str(c): round(1e6 * t, 1) for t, c in cands}}
        print(f"[attn] {rows}x{length}: floor {1e6 * floor:.0f} us; sdpa cudnn {row['sdpa_cudnn']['us']:.0f}, no cudnn "
              f"{row['sdpa_no_cudnn']['us']:.0f}; kernel {1e6 * shipped:.0f} (best {1e6 * best_t:.0f} {best})", flush=True)
        res["cases"].append(row)
        del ks, vs
        torch.cuda.empty_cache()
        (out / "decode_kernel.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=LAYERS)
    args = ap.parse_args()
    res = run(Path(args.out), args.layers)
    print(json.dumps(res, default=str)[:3000])


if __name__ == "__main__":
    main()
