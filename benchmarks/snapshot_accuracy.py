"""The reference snapshot's estimator: how close its KLD is to the full computation, and whether every
shipped check gives the same verdict with it as with both models in memory.

`k`: gate 1's KLD from the snapshot's compact form (`qval/metrics/compact.py`) against the KLD from
the full reference logits, for several k, on the same chunks, in one pass. Each check's candidate is
calibrated and built as `qval gate` builds it, gate 1's chunks (at the check's size) are scored by
both models once, and for every k the compact reference is made from the same logits. Per k: mean
and p99 KLD both ways, the mean upper bound, top-1 (identical by construction), bytes per position,
the per-position error's quantiles. `--shape 8b` runs it on a random-weight layout's FP8 candidate
instead of the checks (a GPU; random weights give near-uniform distributions, the hard case).

`verdicts`: every shipped check at small budgets (`refactor_compare.shrink`) in several modes —
`memory` (snapshot.enabled false: the KLD from the full reference logits), `snapshot` (the default,
filled in this run), `second` (the same check again under another name against the filled snapshot:
no reference pass), `sequential` (one model in memory at a time) — and, per mode, whether its verdict
equals `memory`'s and every figure that differs, with its relative difference.

    python benchmarks/snapshot_accuracy.py k checks/fp8_kvfp16.yaml checks/int4_awq.yaml [--k 16 32 64 128 256] [--json F]
    python benchmarks/lib/nojit.py benchmarks/snapshot_accuracy.py k --shape 8b --tokenizer .tok --json F     # a GPU
    python benchmarks/snapshot_accuracy.py verdicts --out DIR [--modes memory snapshot second sequential] [checks ...]
        [--device cuda --dtype float32] [--deadline SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def k_table(ref: Any, cand: Any, cfg: Any, tok: Any, ks: list[int], name: str) -> dict[str, Any]:
    """Gate 1's chunks through both models once; the exact KLD and, per k, the snapshot's."""
    import numpy as np
    import torch

    from qval.gates.agreement.run import chunks_for
    from qval.metrics.tokens import token_stats
    from qval.metrics.compact import TAIL_POINTS, compress, stats

    g = cfg.gates.agreement
    chunks, _ = chunks_for(cfg, tok)
    half = g.ctx // 2
    exact: dict[str, list] = {"kld": [], "top1": []}
    snap: dict[int, dict[str, list]] = {k: {"kld": [], "kld_upper": [], "top1": []} for k in ks}
    t0 = time.perf_counter()
    v = 0
    for b0 in range(0, len(chunks), g.batch_size):
        x = torch.tensor(chunks[b0 : b0 + g.batch_size])
        lr, lc = ref.logits(x), cand.logits(x)
        v = lr.shape[-1]
        rows_r, rows_c = lr[:, half:-1].reshape(-1, v), lc[:, half:-1].reshape(-1, v)
        tgt = x[:, half + 1 :].reshape(-1)
        e = token_stats(rows_r, rows_c, tgt)
        exact["kld"].append(e["kld"].float().cpu().numpy()), exact["top1"].append(e["top1"].float().cpu().numpy())
        for k in ks:
            c = stats(compress(rows_r, tgt, k), rows_c, tgt)
            for f in ("kld", "kld_upper", "top1"):
                snap[k][f].append(c[f].float().cpu().numpy())
    ek = np.concatenate(exact["kld"])
    row: dict[str, Any] = {"name": name, "positions": int(ek.size), "vocab": int(v), "mean_kld_exact": float(ek.mean()),
                           "p99_kld_exact": float(np.quantile(ek, 0.99)), "top1_exact": float(np.concatenate(exact["top1"]).mean()),
                           "seconds": round(time.perf_counter() - t0, 1), "by_k": {}}
    print(f"{name}: {row['positions']} positions, vocab {v}, exact mean KLD {row['mean_kld_exact']:.6f}, "
          f"p99 {row['p99_kld_exact']:.5f}, top-1 {row['top1_exact']:.5f}")
    for k in ks:
        sk, up = np.concatenate(snap[k]["kld"]), np.concatenate(snap[k]["kld_upper"])
        t1 = float(np.concatenate(snap[k]["top1"]).mean())
        per_pos = 8 * k + 8 * TAIL_POINTS + 4 * 4  # top k (logp f32 + id i32), the tail points, 4 scalars
        err = np.abs(sk - ek)
        rel_err = err / np.maximum(ek, 1e-6)
        r = {"mean_kld": float(sk.mean()), "relative": float(sk.mean() / ek.mean() - 1), "p99_kld": float(np.quantile(sk, 0.99)),
             "p99_relative": float(np.quantile(sk, 0.99) / np.quantile(ek, 0.99) - 1), "mean_upper": float(up.mean()),
             "top1": t1, "bytes_per_position": per_pos,
             "per_position_relative_error": {q: float(np.quantile(rel_err, float(q))) for q in ("0.5", "0.9", "0.99")},
             "max_abs_error": float(err.max()), "positions_above_upper_bound": int(np.sum(ek > up + 1e-5 * (1 + ek)))}
        row["by_k"][k] = r
        print(f"  k={k:4d}: mean KLD {r['mean_kld']:.6f} ({100 * r['relative']:+.3f} %), p99 {r['p99_kld']:.5f} "
              f"({100 * r['p99_relative']:+.2f} %), per position |error|/KLD p50/p90/p99 "
              f"{' / '.join(f'{x:.3f}' for x in r['per_position_relative_error'].values())}, largest {r['max_abs_error']:.4f}, "
              f"mean upper bound {r['mean_upper']:.4f}, top-1 {t1:.5f}, {per_pos} B/position")
    return row


def k_checks(checks: list[str], ks: list[int], tokens: int | None, out: Path) -> list[dict[str, Any]]:
    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config

    results = []
    with quiet_libraries():
        for path, (cfg, alpha) in [(p, ca) for p in checks for ca in pipeline.expand_alphas(load_config(p))]:
            if tokens:
                cfg = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={
                    "agreement": cfg.gates.agreement.model_copy(update={"tokens": tokens})})})
            s = pipeline.Session.open(cfg, out)
            cand = pipeline.build(s, pipeline.calibrate(s, alpha))
            results.append({"check": path, **k_table(s.ref.engine, cand, cfg, s.ref.tokenizer, ks, cfg.name)})
            del cand, s
    return results


def k_random(shape: str, tokenizer: str | None, ks: list[int], out: Path) -> list[dict[str, Any]]:
    """The same on a random-weight layout's FP8 candidate, gate 1 at 8,192 tokens."""
    from lib import setup

    from qval.config import parse_config

    dev = setup.device()
    tok = setup.load_tokenizer(tokenizer)
    loaded, spec = setup.load_shape(shape, tok, dev, out)
    cfg = parse_config({"name": f"k-{shape}", "model": spec, "quant": {"format": "fp8"},
                        "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 16, "seq_len": 256},
                        "gates": {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 8192, "ctx": 512,
                                                "batch_size": 4, "min_top1": 0.0, "max_mean_kld": 1e9}},
                        "report": {"dir": str(out / "reports")}}, f"<k {shape}>")
    built = setup.calibrate_and_build(loaded, cfg)
    return [k_table(built.reference, built.candidate, cfg, tok, ks, f"random Llama layout {shape}")]


def figures(report: dict) -> dict:
    out = {}
    for g, res in report["gates"].items():
        for k, e in (res.get("measurements") or {}).items():
            out[f"{g}.{k}"] = e.get("value") if isinstance(e, dict) else e
    return out


def verdicts(args: argparse.Namespace) -> None:
    from refactor_compare import shrink

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config
    from qval.errors import QvalError

    out = Path(args.out)
    settings = {"memory": ({"enabled": False}, "memory"), "snapshot": ({}, "snap"), "second": ({}, "snap"),
                "sequential": ({"sequential": True}, "seq")}
    rows = []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(quiet_libraries())
        for path in args.checks:
            if args.deadline is not None and time.perf_counter() - started > args.deadline:
                print(f"{path}: not started (deadline of {args.deadline:g} s passed)", flush=True)
                continue
            base = shrink(load_config(path))
            model = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v}
            base = base.model_copy(update={"model": base.model.model_copy(update=model)})
            for cfg, alpha in pipeline.expand_alphas(base):
                row: dict[str, Any] = {"check": cfg.name, "modes": {}}
                for mode in args.modes:
                    snap, folder = settings[mode]
                    c = cfg.model_copy(update={"name": f"{cfg.name}-{mode}", "snapshot": cfg.snapshot.model_copy(update=snap)})
                    t0 = time.perf_counter()
                    try:
                        r = pipeline.run_gate(c, out_dir=str(out / folder), alpha=alpha)
                        s = r.report["model"].get("snapshot") or {}
                        row["modes"][mode] = {"decision": r.report["verdict"]["decision"], "figures": figures(r.report),
                                              "seconds": round(time.perf_counter() - t0, 1),
                                              "reference_forward_calls": s.get("reference_forward_calls"),
                                              "candidate_dependent_calls": s.get("candidate_dependent_calls")}
                    except QvalError as e:
                        row["modes"][mode] = {"error": f"{type(e).__name__}: {e}"}
                base_m = row["modes"].get("memory", {})
                print(f"{cfg.name}:", flush=True)
                for mode, m in row["modes"].items():
                    if "error" in m:
                        print(f"  {mode}: {m['error'].splitlines()[0]}")
                        continue
                    diff = {k: (v, m["figures"].get(k)) for k, v in base_m.get("figures", {}).items() if m["figures"].get(k) != v}
                    m["differing"] = {k: {"memory": a, "this": b,
                                          "relative": (b - a) / a if isinstance(a, float) and isinstance(b, float) and a else None}
                                      for k, (a, b) in diff.items()}
                    print(f"  {mode}: {m['decision']} (same verdict as memory: {m['decision'] == base_m.get('decision')}), "
                          f"{m['seconds']} s, reference passes {m['reference_forward_calls']}, figures differing {len(diff)} of {len(m['figures'])}")
                    for k, d in m["differing"].items():
                        rel = f" ({100 * d['relative']:+.3f} %)" if d["relative"] is not None else ""
                        print(f"     {k}: {d['memory']} vs {d['this']}{rel}")
                rows.append(row)
                out.mkdir(parents=True, exist_ok=True)
                (out / "compare.json").write_text(json.dumps(rows, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    k = sub.add_parser("k", help="the snapshot's KLD against the full computation, for several k")
    k.add_argument("checks", nargs="*", help="shipped checks (default: none; give checks or --shape)")
    k.add_argument("--shape", help="a random-weight layout instead of checks (8b: a GPU)")
    k.add_argument("--tokenizer", help="--shape: tokenizer folder (default: the built-in model's)")
    k.add_argument("--k", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    k.add_argument("--tokens", type=int, default=None, help="gate 1 tokens (default: the check's)")
    k.add_argument("--out", default="/tmp/qval-snapshot-k", help="run folders")
    k.add_argument("--json", default=None, help="write the table here")
    v = sub.add_parser("verdicts", help="every shipped check with the snapshot and with both models in memory")
    v.add_argument("--out", required=True)
    v.add_argument("--modes", nargs="+", default=["memory", "snapshot"], choices=["memory", "snapshot", "second", "sequential"])
    v.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"], help="the model's device (default: the check's)")
    v.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"], help="the model's dtype (default: the check's)")
    v.add_argument("--deadline", type=float, default=None, help="start no check after this many seconds")
    v.add_argument("checks", nargs="*", default=[str(p) for p in sorted((ROOT / "checks").glob("*.yaml"))])
    args = ap.parse_args(argv)
    if args.what == "verdicts":
        verdicts(args)
        return 0
    if not args.checks and not args.shape:
        ap.error("k: give shipped checks or --shape")
    rows = k_random(args.shape, args.ref.tokenizer, args.k, Path(args.out)) if args.shape else k_checks(args.checks, args.k, args.tokens, Path(args.out))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
