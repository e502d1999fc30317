"""The reference's own retrieval accuracy per cell (context length × needle depth), no candidate:
the measurement behind the shipped retrieval matrix's sizes (which cells the built-in model can
solve). Usage: python benchmarks/retrieval_reference.py --lengths 256 512 1024 2048 --trials 2"""

from __future__ import annotations

import argparse
import json
import time

import torch

from qval.config import ModelConfig
from qval.data import load_dataset, token_stream
from qval.engines.hf import HFEngine
from qval.gates.needles import build_trials
from qval.gates.retrieval import mark
from qval.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--haystack", default="calib_data/longctx_docs.jsonl")
    ap.add_argument("--piece", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
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
    for L in a.lengths:
        cells = [sum(r["right"] for r in rows if r["length"] == L and r["depth"] == d) for d in a.depths]
        print(L, cells, f"of {a.trials} each;", f"{sum(cells)}/{a.trials * len(a.depths)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
