"""How many log-probabilities the reference snapshot must keep: gate 1's KLD from the snapshot's
compact form (qval/snapshot/compact.py) against the KLD from the full reference logits, for
several k, on the same chunks, in one pass.

    python benchmarks/snapshot_k.py checks/fp8_kvfp16.yaml checks/int4_awq.yaml [--k 16 32 64 128 256]

For each check: its candidate is calibrated and built as `qval gate` builds it (the run folder
goes under --out), gate 1's chunks are scored by both models once, and for every k the compact
reference is made from the same logits. Printed per k: mean KLD (exact / snapshot / relative
difference), p99 KLD both ways, mean of the upper bound, top-1 (identical by construction), and
bytes per position, and the per-position error's quantiles. Written as JSON to --json when given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checks", nargs="+")
    ap.add_argument("--k", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--tokens", type=int, default=None, help="gate 1 tokens (default: the check's)")
    ap.add_argument("--out", default="/tmp/qval-snapshot-k")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np
    import torch

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config
    from qval.gates.agreement import chunks_for
    from qval.metrics.tokens import token_stats
    from qval.snapshot.compact import TAIL_POINTS, compress, stats
    from qval.stages import RunDir

    results = []
    with quiet_libraries():
        for path, (cfg, alpha) in [(p, ca) for p in args.checks for ca in pipeline.expand_alphas(load_config(p))]:
            if args.tokens:
                cfg = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={
                    "agreement": cfg.gates.agreement.model_copy(update={"tokens": args.tokens})})})
            s = pipeline.Session(config=cfg, run=RunDir(Path(args.out), cfg.name), progress=pipeline.SILENT)
            calib = pipeline.calibrate(s, alpha)
            cand = pipeline.build(s, calib)
            ref = s.ref_engine
            g = cfg.gates.agreement
            chunks, _ = chunks_for(cfg, s.reference.tokenizer)
            half = g.ctx // 2
            exact: dict[str, list] = {"kld": [], "top1": []}
            snap: dict[int, dict[str, list]] = {k: {"kld": [], "kld_upper": [], "top1": []} for k in args.k}
            t0 = time.perf_counter()
            for b0 in range(0, len(chunks), g.batch_size):
                x = torch.tensor(chunks[b0 : b0 + g.batch_size])
                lr, lc = ref.logits(x), cand.logits(x)
                v = lr.shape[-1]
                rows_r, rows_c = lr[:, half:-1].reshape(-1, v), lc[:, half:-1].reshape(-1, v)
                tgt = x[:, half + 1 :].reshape(-1)
                e = token_stats(rows_r, rows_c, tgt)
                exact["kld"].append(e["kld"].numpy()), exact["top1"].append(e["top1"].numpy())
                for k in args.k:
                    c = stats(compress(rows_r, tgt, k), rows_c, tgt)
                    for f in ("kld", "kld_upper", "top1"):
                        snap[k][f].append(c[f].numpy())
            ek = np.concatenate(exact["kld"])
            row = {"check": path, "name": cfg.name, "positions": int(ek.size), "vocab": int(v), "mean_kld_exact": float(ek.mean()),
                   "p99_kld_exact": float(np.quantile(ek, 0.99)), "top1_exact": float(np.concatenate(exact["top1"]).mean()),
                   "seconds": round(time.perf_counter() - t0, 1), "by_k": {}}
            print(f"{cfg.name}: {row['positions']} positions, vocab {v}, exact mean KLD {row['mean_kld_exact']:.6f}, "
                  f"p99 {row['p99_kld_exact']:.5f}, top-1 {row['top1_exact']:.5f}")
            for k in args.k:
                sk = np.concatenate(snap[k]["kld"])
                up = np.concatenate(snap[k]["kld_upper"])
                t1 = float(np.concatenate(snap[k]["top1"]).mean())
                per_pos = 8 * k + 8 * TAIL_POINTS + 4 * 4  # top k (logp f32 + id i32), the tail points, 4 scalars
                err = np.abs(sk - ek)
                rel_err = err / np.maximum(ek, 1e-6)
                r = {"mean_kld": float(sk.mean()), "relative": float(sk.mean() / ek.mean() - 1), "p99_kld": float(np.quantile(sk, 0.99)),
                     "p99_relative": float(np.quantile(sk, 0.99) / np.quantile(ek, 0.99) - 1), "mean_upper": float(up.mean()),
                     "top1": t1, "bytes_per_position": per_pos,
                     "per_position_relative_error": {q: float(np.quantile(rel_err, float(q))) for q in ("0.5", "0.9", "0.99")},
                     "max_abs_error": float(err.max()),
                     "positions_above_upper_bound": int(np.sum(ek > up + 1e-5 * (1 + ek)))}
                row["by_k"][k] = r
                print(f"  k={k:4d}: mean KLD {r['mean_kld']:.6f} ({100 * r['relative']:+.3f} %), p99 {r['p99_kld']:.5f} "
                      f"({100 * r['p99_relative']:+.2f} %), per position |error|/KLD p50/p90/p99 "
                      f"{' / '.join(f'{v:.3f}' for v in r['per_position_relative_error'].values())}, largest {r['max_abs_error']:.4f}, "
                      f"mean upper bound {r['mean_upper']:.4f}, top-1 {t1:.5f}, "
                      f"{per_pos} B/position")
            results.append(row)
            del cand, s
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
