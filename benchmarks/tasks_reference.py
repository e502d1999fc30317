"""Gate 4 (tasks) on the built-in model, the reference against itself (identity): each built-in
suite's reference accuracy and chance, and the gate's seconds for reference + candidate — the
measurement behind the suites' default sizes. Usage:
python benchmarks/tasks_reference.py --sizes cloze=40 choice=40 arithmetic=40"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from qval.config import ModelConfig, parse_config
from qval.engines.hf import HFEngine
from qval.gates import GATES, GateContext
from qval.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["cloze=40", "choice=40", "arithmetic=40"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    lm = load_model(ModelConfig())
    ref, cand = HFEngine(lm.model, lm.tokenizer), HFEngine(lm.model, lm.tokenizer)
    total = 0.0
    for k, v in (s.split("=") for s in a.sizes):  # one gate run per suite, printed as it ends
        cfg = parse_config({"name": "tasks-bench", "quant": {"format": "none"}, "seed": a.seed,
                            "gates": {"agreement": {"enabled": False},
                                      "tasks": {"suites": [{"builtin": k, "size": int(v), "margin": 0.1}]}}})
        with tempfile.TemporaryDirectory() as tmp:
            r = GATES.get("tasks").run(GateContext(cfg, ref, cand, lm.tokenizer, Path(tmp), Path(tmp), lm.fingerprint))
        assert r.status == "ok", r.error
        total += r.seconds
        for s in r.details["suites"]:
            d = s["drop"]
            print(f"{s['suite']:<7} n={s['n']:<3} reference {d['ref_accuracy']:.3f} [{d['ref_interval'][0]:.3f}, "
                  f"{d['ref_interval'][1]:.3f}]  chance {s['chance']:.3f}  flips {s['counts']['ref_only'] + s['counts']['cand_only']}"
                  f"  {r.seconds:.1f} s (reference + candidate)", flush=True)
    print(f"gate total: {total:.1f} s")

if __name__ == "__main__":
    main()
