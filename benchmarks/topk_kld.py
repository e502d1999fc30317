"""KLD from a candidate known only by its top K (a served engine's answer) against the full KLD.

Each check's candidate is calibrated and built as `qval gate` builds it, in this process, so its full
logits are at hand: gate 1's chunks (at the check's size) are scored by the reference and the
candidate once, and for every K the candidate's answer is cut to what a server's prompt
log-probabilities give (its top K and the actual token: `qval.logits.from_topk`). Per K: the mean and
p99 of the gated figure (`qval/metrics/topk.py`: the estimate plus its gain from the top K/2 to the top
K, both served from the top K/4), of the plain estimate and of the strict lower bound, each against the exact figure; the fraction of
positions where the gated figure and where the plain estimate are below the exact KLD; the reference's unseen mass; whether the lower bound held at every position.
Three sides are cut (`--sides`): `cand`, the candidate served against the full reference; `ref`, the
reference served (its top K and the actual token) against the candidate's full logits; `both`, both served.

    python benchmarks/topk_kld.py checks/fp8_kvfp16.yaml checks/int8_sq.yaml [--k 20 64 128] [--sides cand ref both] [--tokens N] [--json F]
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


SIDES = ("cand", "ref", "both")  # which side is cut to its top K


def k_table(ref: Any, cand: Any, cfg: Any, tok: Any, ks: list[int], name: str, sides: tuple[str, ...] = ("cand",)) -> dict[str, Any]:
    import numpy as np
    import torch

    from qval.gates.agreement.run import chunks_for
    from qval.logits import from_topk
    from qval.metrics.tokens import token_stats

    g = cfg.gates.agreement
    chunks, _ = chunks_for(cfg, tok)
    half = g.ctx // 2
    exact: list[np.ndarray] = []
    got: dict[tuple[str, int], dict[str, list[np.ndarray]]] = {(side, k): {"kld": [], "kld_estimate": [], "kld_lower": [], "unseen_mass": []}
                                                               for side in sides for k in ks}

    def served_rows(rows: Any, tgt: Any, k: int) -> Any:
        lp = torch.log_softmax(rows, dim=-1)
        top = lp.topk(k, dim=-1)
        return from_topk(rows.shape[-1], top.indices, top.values, tgt, lp.gather(1, tgt.unsqueeze(1)).squeeze(1),
                         torch.isfinite(rows).all(dim=-1))

    t0 = time.perf_counter()
    for b0 in range(0, len(chunks), g.batch_size):
        x = torch.tensor(chunks[b0 : b0 + g.batch_size])
        lr, lc = ref.logits(x), cand.logits(x)
        v = lr.shape[-1]
        rows_r, rows_c = lr[:, half:-1].reshape(-1, v).float(), lc[:, half:-1].reshape(-1, v).float()
        tgt = x[:, half + 1 :].reshape(-1)
        exact.append(token_stats(rows_r, rows_c, tgt)["kld"].numpy())
        for k in ks:
            cut_r, cut_c = served_rows(rows_r, tgt, k), served_rows(rows_c, tgt, k)
            pairs = {"cand": (rows_r, cut_c), "ref": (cut_r, rows_c), "both": (cut_r, cut_c)}
            for side in sides:
                s = token_stats(*pairs[side], tgt)
                for f in got[side, k]:
                    got[side, k][f].append(s[f].numpy())
    ek = np.concatenate(exact)
    row: dict[str, Any] = {"name": name, "positions": int(ek.size), "mean_kld_exact": float(ek.mean()),
                           "p99_kld_exact": float(np.quantile(ek, 0.99)), "seconds": round(time.perf_counter() - t0, 1),
                           **{("by_k" if side == "cand" else f"by_k_{side}"): {} for side in sides}}
    print(f"{name}: {ek.size} positions, exact mean KLD {ek.mean():.6f}, p99 {np.quantile(ek, 0.99):.5f}")
    for side, k in got:
        est, plain, low, unseen = (np.concatenate(got[side, k][f]) for f in ("kld", "kld_estimate", "kld_lower", "unseen_mass"))

        def rel(a: Any, q: float | None = None) -> float:
            return float(a.mean() / ek.mean() - 1) if q is None else float(np.quantile(a, q) / np.quantile(ek, q) - 1)

        r = {"mean_relative": rel(est), "p99_relative": rel(est, 0.99), "estimate_mean_relative": rel(plain),
             "estimate_p99_relative": rel(plain, 0.99), "lower_mean_relative": rel(low), "lower_p99_relative": rel(low, 0.99),
             "gated_below_exact": float((est < ek).mean()), "estimate_below_exact": float((plain < ek).mean()),
             "mean_unseen_mass": float(unseen.mean()), "p99_unseen_mass": float(np.quantile(unseen, 0.99)),
             "lower_bound_holds": bool((low <= ek + 1e-5).all()), "largest_lower_excess": float((low - ek).max())}
        row["by_k" if side == "cand" else f"by_k_{side}"][str(k)] = r
        print(f"  {side} served, K={k:4d}: gated mean {100 * r['mean_relative']:+.1f} % p99 {100 * r['p99_relative']:+.1f} % "
              f"(< exact at {100 * r['gated_below_exact']:.0f} % of positions); plain estimate mean "
              f"{100 * r['estimate_mean_relative']:+.1f} % p99 {100 * r['estimate_p99_relative']:+.1f} % (< exact at "
              f"{100 * r['estimate_below_exact']:.0f} %); lower bound mean {100 * r['lower_mean_relative']:+.1f} % p99 "
              f"{100 * r['lower_p99_relative']:+.1f} % (holds everywhere: {r['lower_bound_holds']}); unseen mass mean "
              f"{r['mean_unseen_mass']:.3f} p99 {r['p99_unseen_mass']:.3f}")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="+")
    ap.add_argument("--k", type=int, nargs="+", default=[20, 64, 128])
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=["cand"], help="which side(s) a server's answer stands for")
    ap.add_argument("--tokens", type=int, default=None, help="gate 1's tokens (default: the check's)")
    ap.add_argument("--out", default="reports/topk_kld", help="run folder for the calibrations")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config

    rows = []
    with quiet_libraries():
        for path, (cfg, alpha) in [(p, ca) for p in args.checks for ca in pipeline.expand_alphas(load_config(p))]:
            if args.tokens:
                cfg = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={
                    "agreement": cfg.gates.agreement.model_copy(update={"tokens": args.tokens})})})
            s = pipeline.Session.open(cfg, args.out)
            cand = pipeline.build(s, pipeline.calibrate(s, alpha))
            rows.append({"check": path, **k_table(s.ref.engine, cand, cfg, s.ref.tokenizer, args.k, cfg.name, tuple(args.sides))})
            del cand, s
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
