"""qval vs lm-evaluation-harness: the same perplexity, the same windows, one process.

lm-eval's `HFLM.loglikelihood_rolling` cuts each document into disjoint windows of
`max_length` predicted tokens, each window's input starting with the token before it (the
first with the prefix token). qval scores the same positions with its own pieces:
`quality.sliding_windows` over [prefix] + document with window W+1 and stride W (each window
reads W+1 tokens and scores its last W, the first of which sits on the previous window's last
token; a document's last, short window right-aligned to a full window of context, as lm-eval
does), `HFEngine.logits` batched over windows, and `nll_of_targets`. Same model object, same
token ids (taken from lm-eval's own `tok_encode`), so the figures must agree to rounding.

Both tools also time against the bare forward passes of the same windows at the same batch
size: the ratio a tool can reach over another is bounded by how much of its time is the model.

    python3 benchmarks/peer_lmeval.py --max-tokens 8192 --window 512 --batch 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent


def documents(path: Path, tok_encode: Any, max_tokens: int) -> tuple[list[str], list[list[int]]]:
    """Whole documents of the held-out set, in order, until `max_tokens` tokens."""
    from qval.data import load_dataset

    texts, ids, total = [], [], 0
    for t in load_dataset(str(path), path).texts():
        toks = tok_encode(t)
        if not toks:
            continue
        texts.append(t)
        ids.append(toks)
        total += len(toks)
        if total >= max_tokens:
            break
    return texts, ids


def qval_windows(docs: list[list[int]], prefix: int, window: int) -> list[tuple[list[int], int]]:
    """(input ids, tokens scored at its end) for every window of every document, qval's
    sliding windows with window W+1, stride W over [prefix] + document."""
    from qval.gates.quality import sliding_windows

    out = []
    for toks in docs:
        ids = [prefix] + toks
        for begin, end, scored in sliding_windows(len(ids), window + 1, window):
            first = max(end - scored, begin + 1)
            # lm-eval right-aligns a document's last, short window so that it reads a full
            # window of context; qval's strided windows start it at the stride. Match lm-eval.
            begin = max(0, end - (window + 1))
            out.append((ids[begin:end], end - first))
    return out


def qval_nll(engine: Any, windows: list[tuple[list[int], int]], batch: int, pad: int) -> torch.Tensor:
    """Per-token NLL of every scored position, batched; right padding cannot change the
    logits of earlier positions (causal attention), so each row is scored as if alone."""
    from qval.metrics.tokens import nll_of_targets

    parts = []
    for b0 in range(0, len(windows), batch):
        group = windows[b0 : b0 + batch]
        width = max(len(w) for w, _ in group)
        x = torch.tensor([w + [pad] * (width - len(w)) for w, _ in group])
        logits = engine.logits(x)
        for row, (w, scored) in enumerate(group):
            n = len(w)
            # logits at t predict token t+1: targets w[n-scored:] come from rows n-scored-1 .. n-2
            parts.append(nll_of_targets(logits[row, n - scored - 1 : n - 1], torch.tensor(w[n - scored :])))
    return torch.cat(parts)


def forward_only(engine: Any, windows: list[tuple[list[int], int]], batch: int, pad: int) -> None:
    for b0 in range(0, len(windows), batch):
        group = windows[b0 : b0 + batch]
        width = max(len(w) for w, _ in group)
        engine.logits(torch.tensor([w + [pad] * (width - len(w)) for w, _ in group]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(ROOT / "calib_data/heldout_eval.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="peer_out")
    args = ap.parse_args(argv)

    import importlib.metadata as md

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from qval.config import ModelConfig
    from qval.engines.hf import HFEngine
    from qval.metrics import perplexity
    from qval.models import load_model

    loaded = load_model(ModelConfig())
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=args.batch, max_length=args.window,
              device=str(loaded.device))
    texts, docs = documents(Path(args.dataset), lm.tok_encode, args.max_tokens)
    n_tokens = sum(len(d) for d in docs)
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i) for i, t in enumerate(texts)]
    engine = HFEngine(loaded.model, loaded.tokenizer)
    windows = qval_windows(docs, lm.prefix_token_id, args.window)
    assert sum(s for _, s in windows) == n_tokens, "qval's windows must score every token exactly once"
    pad = loaded.tokenizer.pad_token_id

    def run_lmeval() -> float:
        return float(sum(lm.loglikelihood_rolling(requests, disable_tqdm=True)))

    def run_qval() -> torch.Tensor:
        return qval_nll(engine, windows, args.batch, pad)

    times: dict[str, list[float]] = {"lm_eval": [], "qval": [], "forward_only": []}
    results: dict[str, Any] = {}
    run_qval()  # warm-up (first-call allocations) for everyone: same model, same shapes
    for _ in range(args.reps):  # interleaved, so a change of machine load hits all three alike
        t0 = time.perf_counter()
        results["lm_eval_loglik"] = run_lmeval()
        times["lm_eval"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        nll = run_qval()
        times["qval"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        forward_only(engine, windows, args.batch, pad)
        times["forward_only"].append(time.perf_counter() - t0)
    ppl_lm = math.exp(-results["lm_eval_loglik"] / n_tokens)
    ppl_q = perplexity(nll.numpy()).value
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(), "device": str(loaded.device)},
        "versions": {p: md.version(p) for p in ("lm_eval", "torch", "transformers")},
        "model": loaded.name, "dtype": loaded.compute_dtype, "documents": len(docs), "tokens": n_tokens,
        "window": args.window, "batch": args.batch, "windows": len(windows), "reps": args.reps,
        "ppl_lm_eval": ppl_lm, "ppl_qval": ppl_q, "rel_diff": abs(ppl_q - ppl_lm) / ppl_lm,
        "seconds": times, "median_s": med, "speed_ratio_qval_over_lm_eval": med["lm_eval"] / med["qval"],
        "lm_eval_over_forward": med["lm_eval"] / med["forward_only"], "qval_over_forward": med["qval"] / med["forward_only"],
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    from qval.io import atomic_write_json

    atomic_write_json(Path(args.out) / "peer.json", out)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
