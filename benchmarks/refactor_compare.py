"""Every shipped check at small budgets, whole report kept: the before/after evidence for a change
that must not change behaviour (issue 13: "every figure of every shipped check is identical").

Runs each check in checks/ (every gate it enables, its thresholds, diagnostics on) with the data
budgets shrunk so the whole set takes minutes on a CPU, and writes OUT/<check>/report.json. Run it
on the commit before the change and on the change, then compare each pair:

    python benchmarks/refactor_compare.py --out /tmp/before        # on the old commit
    python benchmarks/refactor_compare.py --out /tmp/after         # on the new one
    for d in /tmp/before/*/; do n=$(basename $d); python benchmarks/compare_reports.py \
        /tmp/before/$n/report.json /tmp/after/$n/report.json; done

A check that cannot run here (nvfp4 needs CUDA) is recorded as its one-line error, which must be
the same too. Budgets are shrunk, thresholds and every other setting kept: what is compared is
the code path of every gate, metric, threshold and report section each check reaches.
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


def shrink(cfg):  # noqa: ANN001, ANN201 - a GateConfig
    """The same check at budgets a CPU runs in a minute or two."""
    g = cfg.gates
    upd = lambda m, **kw: m.model_copy(update={k: v for k, v in kw.items() if k in type(m).model_fields})  # noqa: E731
    gates = {
        "agreement": upd(g.agreement, tokens=1024, ctx=256),
        "quality": upd(g.quality, bleu_max_new_tokens=16, bootstrap=100),
        "longgen": upd(g.longgen, max_prompts=2, new_tokens=96, window=32, edge=32, piece=64),
        "depth": upd(g.depth, ctx=256, tokens=512, piece=128, window=64, buckets=None),
        "retrieval": upd(g.retrieval, lengths=[256], depths=[0.0, 1.0], trials=1),
        "tasks": upd(g.tasks, suites=[upd(s, size=6) if s.builtin else upd(s, limit=4) for s in g.tasks.suites]),
    }
    return cfg.model_copy(update={
        "calibration": upd(cfg.calibration, samples=4, seq_len=128),
        "gates": g.model_copy(update=gates),
        "diagnostics": upd(cfg.diagnostics, batches=1),
    })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("checks", nargs="*", default=[str(p) for p in sorted((ROOT / "checks").glob("*.yaml"))])
    args = ap.parse_args()

    from qval import pipeline
    from qval.cli import quiet_libraries
    from qval.config import load_config
    from qval.errors import QvalError
    from qval.io import atomic_write_json

    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        stack.enter_context(quiet_libraries())
        for path in args.checks:
            cfg = shrink(load_config(path))
            for c, alpha in pipeline.expand_alphas(cfg):
                t0 = time.perf_counter()
                folder = out / c.name
                try:
                    r = pipeline.run_gate(c, out_dir=str(out / "runs"), alpha=alpha)
                    report = r.report
                except QvalError as e:
                    report = {"error": f"{type(e).__name__}: {e}"}
                atomic_write_json(folder / "report.json", json.loads(json.dumps(report, default=str)))
                print(f"{c.name}: {report.get('verdict', {}).get('decision', report.get('error'))} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
