"""The reference's own accuracy, no candidate: the measurement behind the shipped sizes of the
retrieval matrix (which cells — context length × needle depth — the built-in model can solve) and of
gate 4's built-in suites (each suite's reference accuracy against chance, and the gate's seconds).

`retrieval`: every trial's prompt and true pass code through the built-in model's KV cache, marked as
the gate marks it (every code token the greedy choice, then the number ends); the accuracy per cell.
`tasks`: gate 4 with the reference against itself (identity), one suite at a time: its reference
accuracy with a Wilson interval, chance, flips (0 for the identity) and the seconds for reference +
candidate.

    python benchmarks/reference_accuracy.py retrieval --lengths 256 512 1024 2048 --trials 2
    python benchmarks/reference_accuracy.py tasks --sizes recall=40 cloze=40 choice=40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def retrieval(a: argparse.Namespace) -> None:
    import torch

    from qval.config import ModelConfig
    from qval.data import load_dataset, token_stream
    from qval.engines.hf import HFEngine
    from qval.gates.needles import build_trials
    from qval.gates.retrieval.run import mark
    from qval.models import load_model

    lm = load_model(ModelConfig())
    eng = HFEngine(lm.model, lm.tokenizer)
    stream = token_stream(load_dataset(a.haystack).texts(), lm.tokenizer, lm.tokenizer.eos_token_id)
    trials = build_trials(lm.tokenizer, stream, a.lengths, a.depths, a.trials, seed=0)
    rows = []
    for t in trials:
        t0 = time.perf_counter()
        ids = t.prompt + t.answer
        logits = torch.cat([p[0] for p in eng.logits_pieces(torch.tensor([ids]), a.piece)])
        right, wrong_at = mark(lm.tokenizer, logits[len(t.prompt) - 1 : len(ids) - 1], t)
        rows.append({**t.describe(), "right": right, "first_wrong": wrong_at, "seconds": round(time.perf_counter() - t0, 2)})
        print(json.dumps(rows[-1]), flush=True)
    print("cell accuracy (rows: length, columns: depth):")
    for length in a.lengths:
        cells = [sum(r["right"] for r in rows if r["length"] == length and r["depth"] == d) for d in a.depths]
        print(length, cells, f"of {a.trials} each;", f"{sum(cells)}/{a.trials * len(a.depths)}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


def tasks(a: argparse.Namespace) -> None:
    from qval.config import ModelConfig, parse_config
    from qval.engines.hf import HFEngine
    from qval.gates import GATES
    from qval.gates.base import GateContext
    from qval.models import load_model

    lm = load_model(ModelConfig())
    ref, cand = HFEngine(lm.model, lm.tokenizer), HFEngine(lm.model, lm.tokenizer)
    total = 0.0
    for k, v in (s.split("=") for s in a.sizes):  # one gate run per suite, printed as it ends
        cfg = parse_config({"name": "tasks-bench", "quant": {"format": "none"}, "seed": a.seed,
                            "gates": {"agreement": {"enabled": False},
                                      "tasks": {"suites": [{"builtin": k, "size": int(v), "margin": 0.1}]}}})
        with tempfile.TemporaryDirectory() as tmp:
            r = GATES.get("tasks").run(GateContext(cfg, ref, cand, lm.tokenizer, Path(tmp)))
        assert r.status == "ok", r.error
        total += r.seconds
        for s in r.to_dict()["details"]["suites"]:  # as report.json stores it
            d = s["drop"]
            print(f"{s['suite']:<7} n={s['n']:<3} reference {d['ref_accuracy']:.3f} [{d['ref_interval'][0]:.3f}, "
                  f"{d['ref_interval'][1]:.3f}]  chance {s['chance']:.3f}  flips {s['counts']['ref_only'] + s['counts']['cand_only']}"
                  f"  {r.seconds:.1f} s (reference + candidate)", flush=True)
    print(f"gate total: {total:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("retrieval", help="the reference's accuracy per retrieval cell")
    r.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    r.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    r.add_argument("--trials", type=int, default=2)
    r.add_argument("--haystack", default=str(ROOT / "calib_data/longctx_docs.jsonl"))
    r.add_argument("--piece", type=int, default=512)
    r.add_argument("--out", default=None, help="write every trial here (JSON)")
    t = sub.add_parser("tasks", help="each built-in suite's reference accuracy, the reference against itself")
    t.add_argument("--sizes", nargs="+", default=["recall=40", "cloze=40", "choice=40"], help="SUITE=ITEMS")
    t.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    (retrieval if args.what == "retrieval" else tasks)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
