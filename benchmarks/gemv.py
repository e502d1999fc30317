"""A decode step's matrix products alone at batch 1 and 8, as the 8B layout lays them out (issue 15).

    python3 benchmarks/nojit.py benchmarks/gemv.py --out DIR        # a GPU; ~1 minute

The matmul kernels of a batch-1 decode step take ×1.28 the roofline on the H200 (RESULTS §14.2):
cuBLAS's skinny products read the weights at ~3.2 TB/s against the copy's ~4.2. This measures,
in one process, every layer's products in sequence (32 layers of distinct weights, 15 GB: no L2
reuse, as in a real step) replayed from one CUDA graph, for:

- `cublas`: `F.linear` per projection (q, k, v, o, gate, up, down, lm_head), as transformers calls them;
- `cublas_fused`: q/k/v as one product and gate/up as one (the weights concatenated row-wise);
- `triton` (batch 1 only): a GEMV kernel (each program a block of output rows, the whole input
  dimension, float32 accumulation), its block shape chosen per weight shape by timing here, on the
  same two layouts.

Each against the weights' bytes ÷ the copy bandwidth measured at the start. Also the largest
relative difference of each kernel's output from float64 (the kernels sum in different orders).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 4096, 14336, 32, 8, 128, 32, 128256


def layouts(fused: bool) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of one layer's products, in call order."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    if fused:
        return [("qkv", q + 2 * kv, HIDDEN), ("o", HIDDEN, q), ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)]
    return [("q", q, HIDDEN), ("k", kv, HIDDEN), ("v", kv, HIDDEN), ("o", HIDDEN, q), ("gate", INTER, HIDDEN),
            ("up", INTER, HIDDEN), ("down", HIDDEN, INTER)]


def triton_gemv() -> Callable[..., torch.Tensor] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(w_ptr, x_ptr, y_ptr, n, k, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BN + tl.arange(0, BN)
        cols = tl.arange(0, BK)
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        live = rows[:, None] < n
        for k0 in range(0, k, BK):
            w = tl.load(w_ptr + rows[:, None] * k + (k0 + cols)[None, :], mask=live, other=0.0)
            x = tl.load(x_ptr + k0 + cols)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < n)

    def gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bn: int, bk: int, warps: int, stages: int) -> torch.Tensor:
        n, k = w.shape
        kernel[(triton.cdiv(n, bn),)](w, x, out, n, k, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
        return out

    return gemv


CONFIGS = [(bn, bk, w, s) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024) for w in (4, 8) for s in (1, 3)
           if bn * bk <= 8192]


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


def run(out: Path, layers: int = LAYERS) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    bw = measure.hbm_bandwidth(dev)
    res: dict[str, Any] = {"bandwidth": bw, "layers": layers}
    gemv = triton_gemv()
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
        if gemv is not None:
            x1 = {k: torch.randn(k, dtype=dt, device=dev) for k in {HIDDEN, INTER, HEADS * HEAD_DIM}}
            shapes_ = sorted({tuple(w.shape) for w in weights[0]} | {tuple(head.shape)})
            best: dict[str, Any] = {}
            for shp in shapes_:
                ws = [w for layer in weights for w in layer if tuple(w.shape) == shp] if shp != tuple(head.shape) else [head]
                y = torch.empty(shp[0], dtype=dt, device=dev)
                ref = F.linear(x1[shp[1]].double()[None], ws[0].double())[0]
                cub = graph_time(lambda: [F.linear(x1[shp[1]][None], w) for w in ws])
                cands = []
                for cfg in CONFIGS:
                    if shp[1] % cfg[1]:
                        continue
                    try:
                        t = graph_time(lambda: [gemv(x1[shp[1]], w, y, *cfg) for w in ws], reps=5)
                    except Exception as err:  # noqa: BLE001 - a config this GPU cannot run
                        print(f"[gemv] {shp} {cfg}: {type(err).__name__}", flush=True)
                        continue
                    cands.append((t, cfg))
                t, cfg = min(cands)
                got = gemv(x1[shp[1]], ws[0], y, *cfg).double()
                mine = F.linear(x1[shp[1]][None], ws[0])[0].double()
                scale = ref.abs().max().item()
                b = sum(w.numel() * 2 for w in ws)
                best["x".join(map(str, shp))] = {"config": cfg, "triton_tb_per_s": b / t / 1e12, "cublas_tb_per_s": b / cub / 1e12,
                                                 "triton_rel_err": (got - ref).abs().max().item() / scale,
                                                 "cublas_rel_err": (mine - ref).abs().max().item() / scale}
                print(f"[gemv] {shp}: triton {b / t / 1e12:.2f} TB/s {cfg}, cublas {b / cub / 1e12:.2f} TB/s", flush=True)
            row["triton_per_shape"] = best

            def tri() -> None:
                for ws in weights:
                    for w in ws:
                        cfg = best["x".join(map(str, w.shape))]["config"]
                        gemv(x1[w.shape[1]], w, torch.empty(w.shape[0], dtype=dt, device=dev), *cfg)
                cfg = best["x".join(map(str, head.shape))]["config"]
                gemv(x1[HIDDEN], head, torch.empty(VOCAB, dtype=dt, device=dev), *cfg)

            t = graph_time(tri)
            row["triton_m1"] = {"ms": 1000 * t, "x_floor": t / floor, "tb_per_s": nbytes / t / 1e12}
            print(f"[gemv] {name} triton m=1: {1000 * t:.3f} ms (x{t / floor:.3f} floor)", flush=True)
        res[name] = row
        del weights, head
        torch.cuda.empty_cache()
        (out / "gemv.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=LAYERS)
    args = ap.parse_args()
    res = run(Path(args.out), args.layers)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "triton_per_shape"} if isinstance(v, dict) else v
                      for k, v in res.items()}, default=str))


if __name__ == "__main__":
    main()
