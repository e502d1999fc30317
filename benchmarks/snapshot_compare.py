"""Every shipped check with the reference snapshot and with both models in memory, at small
budgets (benchmarks/refactor_compare.py's `shrink`): the same verdict, and how far each figure moved.

    python benchmarks/snapshot_compare.py --out DIR [--modes memory snapshot second sequential] [checks ...]
        [--device cuda --dtype float32] [--deadline SECONDS]

`memory`: snapshot.enabled false (KLD from the full reference logits, as before the snapshot);
`snapshot`: the default (the snapshot filled in this run); `second`: the same check again under
another name against the filled snapshot (no reference pass); `sequential`: snapshot.sequential
(one model in memory at a time) in its own folder. Prints, per check, whether each mode's verdict
equals `memory`'s and every figure that differs with its relative difference; DIR/compare.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def figures(report: dict) -> dict:
    out = {}
    for g, res in report["gates"].items():
        for k, e in (res.get("measurements") or {}).items():
            out[f"{g}.{k}"] = e.get("value") if isinstance(e, dict) else e
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", nargs="+", default=["memory", "snapshot"])
    ap.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"], help="the model's device (default: the check's)")
    ap.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"], help="the model's dtype (default: the check's)")
    ap.add_argument("--deadline", type=float, default=None, help="start no check after this many seconds")
    ap.add_argument("checks", nargs="*", default=[str(p) for p in sorted((ROOT / "checks").glob("*.yaml"))])
    args = ap.parse_args()

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
                row = {"check": cfg.name, "modes": {}}
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
                    m["differing"] = {k: {"memory": a, "this": b, "relative": (b - a) / a if isinstance(a, float) and isinstance(b, float) and a else None}
                                      for k, (a, b) in diff.items()}
                    same = m["decision"] == base_m.get("decision")
                    print(f"  {mode}: {m['decision']} (same verdict as memory: {same}), {m['seconds']} s, "
                          f"reference passes {m['reference_forward_calls']}, figures differing {len(diff)} of {len(m['figures'])}")
                    for k, d in m["differing"].items():
                        rel = f" ({100 * d['relative']:+.3f} %)" if d["relative"] is not None else ""
                        print(f"     {k}: {d['memory']} vs {d['this']}{rel}")
                rows.append(row)
                (out / "compare.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
