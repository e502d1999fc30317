"""A decode step's matrix products alone at batch 1 and 8, as the 8B layout lays them out (issue 15).

    python3 benchmarks/nojit.py benchmarks/gemv.py --out DIR [--sweep1]     # a GPU; ~2 minutes

The matmul kernels of a decode step take ×1.26 the weights' floor on the H200 through cuBLAS
(RESULTS §14.3: its skinny products read the weights at ~3.2 TB/s against the copy's ~4.1). This
measures, in one process, every layer's products in sequence (32 layers of distinct weights, 15 GB:
no L2 reuse, as in a real step) replayed from one CUDA graph, for:

- `cublas`: `F.linear` per projection (q, k, v, o, gate, up, down, lm_head), as transformers calls them;
- `cublas_fused`: q/k/v as one product and gate/up as one (the weights concatenated row-wise);
- `triton`: qval/engines/gemv.py's kernels as the static decoder's step launches them (q/k/v in one
  launch, o, gate/up with SiLU·mul, down, lm_head), at the block shapes of its table (`shipped`)
  and at the best of a sweep of block shapes per launch (the sweep that chose the table; at one row
  only with `--sweep1`: RESULTS §14.3 ran it).

Each against the weights' bytes ÷ the copy bandwidth measured at the start. Also the largest
relative difference of each launch's output from float64 (the kernels sum in different orders).
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import measure  # noqa: E402

from qval.engines import gemv  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 4096, 14336, 32, 8, 128, 32, 128256


def layouts(fused: bool) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of one layer's products, in call order."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    if fused:
        return [("qkv", q + 2 * kv, HIDDEN), ("o", HIDDEN, q), ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)]
    return [("q", q, HIDDEN), ("k", kv, HIDDEN), ("v", kv, HIDDEN), ("o", HIDDEN, q), ("gate", INTER, HIDDEN),
            ("up", INTER, HIDDEN), ("down", HIDDEN, INTER)]


# one row: gemv.py's one-row kernels (RESULTS §14.3's sweep); 2 to 16 rows: its tensor-core kernels
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


def run(out: Path, layers: int = LAYERS, sweep1: bool = False) -> dict[str, Any]:
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
        (out / "gemv.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--sweep1", action="store_true", help="also sweep the one-row kernels' block shapes")
    args = ap.parse_args()
    res = run(Path(args.out), args.layers, args.sweep1)
    print(json.dumps(res, default=str)[:4000])


if __name__ == "__main__":
    main()
