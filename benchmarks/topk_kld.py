"""KLD from a candidate known only by its top K (a served engine's answer) against the full KLD.

Each check's candidate is calibrated and built as `qval gate` builds it, in this process, so its full
logits are at hand: gate 1's chunks (at the check's size) are scored by the reference and the
candidate once, and for every K the candidate's answer is cut to what a server's prompt
log-probabilities give (its top K and the actual token: `qval.logits.from_topk`). Per K: the mean and
p99 of the estimate (`qval/metrics/topk.py`, the figure the gates compare with their limits) and of
its strict lower bound, each against the exact figure; the fraction of positions where the estimate
is below the exact KLD; the reference's unseen mass; whether the lower bound held at every position.

    python benchmarks/topk_kld.py checks/fp8_kvfp16.yaml checks/int8_sq.yaml [--k 20 64 128] [--tokens N] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]


def k_table(ref: Any, cand: Any, cfg: Any, tok: Any, ks: list[int], name: str) -> dict[str, Any]:
    import numpy as np
    import torch

    from qval.gates.agreement import chunks_for
    from qval.logits import from_topk
    from qval.metrics.tokens import token_stats

    g = cfg.gates.agreement
    chunks, _ = chunks_for(cfg, tok)
    half = g.ctx // 2
    exact: list[np.ndarray] = []
    got: dict[int, dict[str, list[np.ndarray]]] = {k: {"kld": [], "kld_lower": [], "unseen_mass": []} for k in ks}
    t0 = time.perf_counter()
    for b0 in range(0, len(chunks), g.batch_size):
        x = torch.tensor(chunks[b0 : b0 + g.batch_size])
        lr, lc = ref.logits(x), cand.logits(x)
        v = lr.shape[-1]
        rows_r, rows_c = lr[:, half:-1].reshape(-1, v).float(), lc[:, half:-1].reshape(-1, v).float()
        tgt = x[:, half + 1 :].reshape(-1)
        exact.append(token_stats(rows_r, rows_c, tgt)["kld"].numpy())
        lp = torch.log_softmax(rows_c, dim=-1)
        for k in ks:
            top = lp.topk(k, dim=-1)
            served = from_topk(v, top.indices, top.values, tgt, lp.gather(1, tgt.unsqueeze(1)).squeeze(1),
                               torch.isfinite(rows_c).all(dim=-1))
            s = token_stats(rows_r, served, tgt)
            for f in got[k]:
                got[k][f].append(s[f].numpy())
    ek = np.concatenate(exact)
    row: dict[str, Any] = {"name": name, "positions": int(ek.size), "mean_kld_exact": float(ek.mean()),
                           "p99_kld_exact": float(np.quantile(ek, 0.99)), "seconds": round(time.perf_counter() - t0, 1),
                           "by_k": {}}
    print(f"{name}: {ek.size} positions, exact mean KLD {ek.mean():.6f}, p99 {np.quantile(ek, 0.99):.5f}")
    for k in ks:
        est, low, unseen = (np.concatenate(got[k][f]) for f in ("kld", "kld_lower", "unseen_mass"))
        r = {"mean_relative": float(est.mean() / ek.mean() - 1), "p99_relative": float(np.quantile(est, 0.99) / np.quantile(ek, 0.99) - 1),
             "lower_mean_relative": float(low.mean() / ek.mean() - 1),
             "lower_p99_relative": float(np.quantile(low, 0.99) / np.quantile(ek, 0.99) - 1),
             "estimate_below_exact": float((est < ek).mean()), "mean_unseen_mass": float(unseen.mean()),
             "p99_unseen_mass": float(np.quantile(unseen, 0.99)), "lower_bound_holds": bool((low <= ek + 1e-5).all()),
             "largest_lower_excess": float((low - ek).max())}
        row["by_k"][str(k)] = r
        print(f"  K={k:4d}: estimate mean {100 * r['mean_relative']:+.1f} % p99 {100 * r['p99_relative']:+.1f} %; lower bound "
              f"mean {100 * r['lower_mean_relative']:+.1f} % p99 {100 * r['lower_p99_relative']:+.1f} % (holds everywhere: "
              f"{r['lower_bound_holds']}); estimate < exact at {100 * r['estimate_below_exact']:.0f} % of positions; unseen "
              f"mass mean {r['mean_unseen_mass']:.3f} p99 {r['p99_unseen_mass']:.3f}")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="+")
    ap.add_argument("--k", type=int, nargs="+", default=[20, 64, 128])
    ap.add_argument("--tokens", type=int, default=None, help="gate 1's tokens (default: the check's)")
    ap.add_argument("--out", default="reports/topk_kld", help="run folder for the calibrations")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config
    from qval.stages import RunDir

    rows = []
    with quiet_libraries():
        for path, (cfg, alpha) in [(p, ca) for p in args.checks for ca in pipeline.expand_alphas(load_config(p))]:
            if args.tokens:
                cfg = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={
                    "agreement": cfg.gates.agreement.model_copy(update={"tokens": args.tokens})})})
            s = pipeline.Session(config=cfg, run=RunDir(Path(args.out), cfg.name), progress=pipeline.SILENT)
            cand = pipeline.build(s, pipeline.calibrate(s, alpha))
            rows.append({"check": path, **k_table(s.ref_engine, cand, cfg, s.tokenizer, args.k, cfg.name)})
            del cand, s
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
