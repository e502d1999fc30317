"""A decode step's kernels alone, as the static decoder runs them on the 8B layout: its matrix
products and its attention, each against its floor, with the configuration sweeps that chose the
shipped tables.

`products`: every layer's products in sequence (32 layers of distinct weights, 15 GB: no L2 reuse, as
in a real step) and the lm_head, replayed from one CUDA graph, at 1 and 8 rows:
- `cublas`: `F.linear` per projection (q, k, v, o, gate, up, down, lm_head), as transformers calls them;
- `cublas_fused`: q/k/v as one product and gate/up as one (the weights concatenated row-wise);
- `triton`: qval/engines/gemv.py's kernels as the static decoder's step launches them (q/k/v in one
  launch, o, gate/up with SiLU·mul, down, lm_head), at the block shapes of its table (`shipped`) and
  at the best of a sweep of block shapes per launch (at one row only with `--sweep1`);
each against the weights' bytes ÷ the copy bandwidth measured at the start, and each launch's largest
relative difference from float64.

`attention`: 32 layers of distinct K/V caches, one bfloat16 query token per row, left-padded rows (a
boolean mask), one CUDA graph, at batch 8 and 1 and several attended lengths:
- `sdpa_cudnn`: decode_attention.py's sdpa call (groups folded, filled slots, the mask), cuDNN's
  attention allowed (torch's default);
- `sdpa_no_cudnn`: the same with cuDNN's attention off, as qval's deterministic mode runs it;
- `kernel`: qval/engines/decode_kernel.py's split-KV kernel at its shipped configuration, and the best
  of a sweep of (slots per inner step, warps, stages);
each against its floor (the K/V bytes the step reads ÷ the copy bandwidth), with each output's largest
difference from float64 attention and whether two launches give the same bits.

    python3 benchmarks/lib/nojit.py benchmarks/decode_kernels.py --out DIR [--only products,attention] [--sweep1]   # a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from lib import measure  # noqa: E402

from qval.engines import decode_kernel, gemv  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB, GROUP = 4096, 14336, 32, 8, 128, 32, 128256, 4


def layouts(fused: bool) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of one layer's products, in call order."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    if fused:
        return [("qkv", q + 2 * kv, HIDDEN), ("o", HIDDEN, q), ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)]
    return [("q", q, HIDDEN), ("k", kv, HIDDEN), ("v", kv, HIDDEN), ("o", HIDDEN, q), ("gate", INTER, HIDDEN),
            ("up", INTER, HIDDEN), ("down", HIDDEN, INTER)]


# one row: gemv.py's one-row kernels (the sweep that chose its one-row table); 2 to 16 rows: its tensor-core kernels
CONFIGS = {1: [(bn, bk, w, s) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024) for w in (4, 8) for s in (1, 3)
               if bn * bk <= 8192],
           8: [(bn, bk, w, s) for bn in (16, 32, 64) for bk in (64, 128, 256) for w in ((4, 8) if bn == 64 else (4,))
               for s in (2, 3, 4) if bn * bk <= 8192]}


def launches(split: list[list[torch.Tensor]], head: torch.Tensor) -> dict[str, list[tuple[str, list[torch.Tensor]]]]:
    """The step's launches as fused_step.py makes them, by kind: (function, weights) per layer."""
    return {"qkv": [("grouped", ws[0:3]) for ws in split], "o": [("grouped", ws[3:4]) for ws in split],
            "gate_up": [("gate_up", ws[4:6]) for ws in split], "down": [("grouped", ws[6:7]) for ws in split],
            "lm_head": [("grouped", [head])]}


def call(fn: str, x: torch.Tensor, ws: list[torch.Tensor], cfg: tuple[int, int, int, int] | None) -> Any:
    return gemv.grouped(x, ws, cfg) if fn == "grouped" else gemv.gate_up_silu(x, ws[0], ws[1], cfg)


def graph_time(fn: Callable[[], None], reps: int = 10) -> float:
    """Seconds per call of `fn` replayed from a CUDA graph (median of `reps` replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1000)
    del g
    return statistics.median(out)


def products(out: Path, layers: int = LAYERS, sweep1: bool = False) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    bw = measure.hbm_bandwidth(dev)
    res: dict[str, Any] = {"bandwidth": bw, "layers": layers, "configs": {m: len(c) for m, c in CONFIGS.items()}}
    for fused in (False, True):
        lay = layouts(fused)
        weights = [[torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _, n, k in lay] for _ in range(layers)]
        head = torch.randn(VOCAB, HIDDEN, dtype=dt, device=dev) * 0.02
        nbytes = sum(w.numel() * 2 for ws in weights for w in ws) + head.numel() * 2
        floor = nbytes / bw["bytes_per_s"]
        name = "fused" if fused else "split"
        row: dict[str, Any] = {"weight_bytes": nbytes, "floor_ms": 1000 * floor}
        for m in (1, 8):
            xs = {k: torch.randn(m, k, dtype=dt, device=dev) for k in {HIDDEN, INTER, HEADS * HEAD_DIM}}

            def cublas() -> None:
                for ws in weights:
                    for w in ws:
                        F.linear(xs[w.shape[1]], w)
                F.linear(xs[HIDDEN], head)

            t = graph_time(cublas)
            row[f"cublas_m{m}"] = {"ms": 1000 * t, "x_floor": t / floor, "tb_per_s": nbytes / t / 1e12}
            print(f"[gemv] {name} cublas m={m}: {1000 * t:.3f} ms (x{t / floor:.3f} floor)", flush=True)
            if fused or not gemv.usable(xs[HIDDEN], [head]):
                continue  # the kernels take the model's own (split) weights
            per: dict[str, Any] = {}
            for kind, calls in launches(weights, head).items():
                b = sum(w.numel() * 2 for _, ws in calls for w in ws)
                k = calls[0][1][0].shape[1]
                x = xs[k]
                ref = F.linear(x.double(), calls[0][1][0].double())
                cands = []
                for cfg in ([None] + CONFIGS[m] if (m > 1 or sweep1) else [None]):
                    if cfg is not None and k % cfg[1]:
                        continue
                    try:
                        t = graph_time(lambda: [call(fn, x, ws, cfg) for fn, ws in calls], reps=5)
                    except Exception as err:  # noqa: BLE001 - a block shape this GPU cannot compile
                        print(f"[gemv] m={m} {kind} {cfg}: {type(err).__name__}", flush=True)
                        continue
                    cands.append((t, cfg))
                shipped = next(t for t, c in cands if c is None)
                t, cfg = min(cands, key=lambda c: c[0])
                fn0, ws0 = calls[0]
                got = call(fn0, x, ws0, None)
                got = got[0] if isinstance(got, list) else got
                if fn0 == "gate_up":
                    want = F.silu(ref.to(dt)).double() * F.linear(x.double(), ws0[1].double()).to(dt).double()
                else:
                    want = ref
                err = ((got.double() - want).abs().max() / want.abs().max()).item()
                per[kind] = {"shipped_config": gemv.block(sum(w.shape[0] for w in ws0) if fn0 == "grouped" else 2 * ws0[0].shape[0], k, m),
                             "shipped_tb_per_s": b / shipped / 1e12, "best_config": cfg or "shipped", "best_tb_per_s": b / t / 1e12,
                             "rel_err_vs_float64": err}
                print(f"[gemv] m={m} {kind}: shipped {b / shipped / 1e12:.2f} TB/s, best {b / t / 1e12:.2f} TB/s {cfg}", flush=True)

            def shipped_step() -> None:
                for kind, calls in launches(weights, head).items():
                    for fn, ws in calls:
                        call(fn, xs[ws[0].shape[1]], ws, None)

            t = graph_time(shipped_step)
            row[f"triton_m{m}"] = {"ms": 1000 * t, "x_floor": t / floor, "tb_per_s": nbytes / t / 1e12, "per_launch": per}
            print(f"[gemv] triton m={m} (shipped table): {1000 * t:.3f} ms (x{t / floor:.3f} floor)", flush=True)
        res[name] = row
        del weights, head
        torch.cuda.empty_cache()
        (out / "products.json").write_text(json.dumps(res, indent=1, default=str))
    return res


ATTN_SWEEP = [(blk, w, s) for blk in (32, 64, 128) for w in (4, 8) for s in (1, 2, 3)]
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


def attention(out: Path, layers: int = LAYERS) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    assert decode_kernel.missing() is None, decode_kernel.missing()
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
        for cfg in [None] + ATTN_SWEEP:
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
        (out / "attention.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="products,attention", help="comma list of products, attention")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--sweep1", action="store_true", help="products: also sweep the one-row kernels' block shapes")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    if "products" in only:
        print(json.dumps(products(Path(args.out), args.layers, args.sweep1), default=str)[:4000])
    if "attention" in only:
        print(json.dumps(attention(Path(args.out), args.layers), default=str)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
