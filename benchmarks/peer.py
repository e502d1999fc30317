"""Peer: qval against lm-evaluation-harness — the same perplexity, the same windows, one process.

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
With `--candidate`, qval's gate-1 pass too (reference and FP8 candidate, KLD/top-1/NLL in the same
pass) against both models' bare forwards.

    python3 benchmarks/peer.py --max-tokens 8192 --window 512 --batch 4 --out DIR                 # the built-in model, CPU
    python3 benchmarks/peer.py --shape 8b --tokenizer .tok --candidate --max-tokens 32768 --window 1024 --batch 8 --out DIR   # a GPU
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
    """Whole documents of the held-out set, in order, until `max_tokens` tokens (the set repeated
    when it holds fewer)."""
    from qval.data import load_dataset

    texts, ids, total = [], [], 0
    every = [(t, toks) for t in load_dataset(str(path), path).texts() if (toks := tok_encode(t))]
    while every and total < max_tokens:  # past the set's end: its documents again, in order (a speed run's budget)
        for t, toks in every:
            texts.append(t)
            ids.append(toks)
            total += len(toks)
            if total >= max_tokens:
                break
    return texts, ids


def qval_windows(docs: list[list[int]], prefix: int, window: int) -> list[tuple[list[int], int]]:
    """(input ids, tokens scored at its end) for every window of every document, qval's
    sliding windows with window W+1, stride W over [prefix] + document."""
    from qval.gates.quality.run import sliding_windows

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


def gate1_pass(ref: Any, cand: Any, windows: list[tuple[list[int], int]], batch: int, pad: int) -> torch.Tensor:
    """qval's gate-1 figures over the same windows: reference and candidate logits of each batch,
    KLD(ref‖cand), top-1 agreement and both NLLs of every scored position in the same pass
    (`token_stats`, as gate 1 computes them). Returns the reference's NLLs (its perplexity)."""
    from qval.metrics.tokens import token_stats

    parts = []
    for b0 in range(0, len(windows), batch):
        group = windows[b0 : b0 + batch]
        width = max(len(w) for w, _ in group)
        x = torch.tensor([w + [pad] * (width - len(w)) for w, _ in group])
        lr, lc = ref.logits(x), cand.logits(x)
        for row, (w, scored) in enumerate(group):
            n = len(w)
            s = token_stats(lr[row, n - scored - 1 : n - 1], lc[row, n - scored - 1 : n - 1], torch.tensor(w[n - scored :]))
            parts.append(s["nll_ref"])
        del lr, lc
    return torch.cat(parts)


def compare(model: Any, tokenizer: Any, *, name: str, dtype: str, dataset: Path, max_tokens: int, window: int, batch: int,
            reps: int, candidate: Any = None) -> dict[str, Any]:
    """lm-eval's `loglikelihood_rolling` and qval's windows on one model object, interleaved
    `reps` times with the bare forwards of the same windows; with `candidate` (an Engine), also
    qval's gate-1 pass (reference + candidate, KLD/top-1 in the same pass) over the same windows."""
    import importlib.metadata as md

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from qval.engines.hf import HFEngine
    from qval.metrics import perplexity

    device = str(next(model.parameters()).device)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch, max_length=window, device=device)
    texts, docs = documents(dataset, lm.tok_encode, max_tokens)
    n_tokens = sum(len(d) for d in docs)
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i) for i, t in enumerate(texts)]
    engine = HFEngine(model, tokenizer)
    windows = qval_windows(docs, lm.prefix_token_id, window)
    assert sum(s for _, s in windows) == n_tokens, "qval's windows must score every token exactly once"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def run_lmeval() -> float:
        return float(sum(lm.loglikelihood_rolling(requests, disable_tqdm=True)))

    jobs: dict[str, Any] = {"lm_eval": run_lmeval, "qval": lambda: qval_nll(engine, windows, batch, pad),
                            "forward_only": lambda: forward_only(engine, windows, batch, pad)}
    if candidate is not None:
        jobs["qval_gate1_pass"] = lambda: gate1_pass(engine, candidate, windows, batch, pad)
        jobs["forward_only_both"] = lambda: (forward_only(engine, windows, batch, pad), forward_only(candidate, windows, batch, pad))
    times: dict[str, list[float]] = {k: [] for k in jobs}
    results: dict[str, Any] = {}
    for fn in jobs.values():  # warm-up (first-call allocations, kernel selection) for everyone: same model, same shapes
        fn()
    for _ in range(reps):  # interleaved, so a change of machine load hits all of them alike
        for k, fn in jobs.items():
            sync()
            t0 = time.perf_counter()
            results[k] = fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    ppl_lm = math.exp(-results["lm_eval"] / n_tokens)
    ppl_q = perplexity(results["qval"].numpy()).value
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(), "device": device,
                    "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None},
        "versions": {p: md.version(p) for p in ("lm_eval", "torch", "transformers")},
        "model": name, "dtype": dtype, "documents": len(docs), "tokens": n_tokens,
        "window": window, "batch": batch, "windows": len(windows), "reps": reps,
        "ppl_lm_eval": ppl_lm, "ppl_qval": ppl_q, "rel_diff": abs(ppl_q - ppl_lm) / ppl_lm,
        "seconds": times, "median_s": med, "speed_ratio_qval_over_lm_eval": med["lm_eval"] / med["qval"],
        "lm_eval_over_forward": med["lm_eval"] / med["forward_only"], "qval_over_forward": med["qval"] / med["forward_only"],
    }
    if candidate is not None:
        ppl_g = perplexity(results["qval_gate1_pass"].numpy()).value
        out.update(ppl_qval_gate1_pass=ppl_g, rel_diff_gate1_pass=abs(ppl_g - ppl_lm) / ppl_lm,
                   speed_ratio_gate1_pass_over_lm_eval=med["lm_eval"] / med["qval_gate1_pass"],
                   gate1_pass_over_both_forwards=med["qval_gate1_pass"] / med["forward_only_both"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(ROOT / "calib_data/heldout_eval.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="peer_out")
    ap.add_argument("--shape", default="real", help="real: the built-in model (default); 8b, 1b: a random-weight layout (a GPU)")
    ap.add_argument("--tokenizer", help="tokenizer folder for a random layout (default: the built-in model's)")
    ap.add_argument("--candidate", action="store_true", help="also qval's gate-1 pass with an FP8 fake-quant candidate")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from lib import setup

    import qval.pipeline  # noqa: F401  (import order, as the other scripts)

    dev, work = setup.device(), Path(args.out) / "work"
    tok = setup.load_tokenizer(args.tokenizer) if args.shape != "real" else None
    loaded, spec = setup.load_shape(args.shape, tok, dev, work)
    cand = None
    if args.candidate:
        plan = setup.FULL
        data = setup.bench_data(plan, loaded.tokenizer, work, 2048)
        cand = setup.calibrate_and_build(loaded, setup.gate_config("peer", spec, data, work / "reports", plan)).candidate
    out = compare(loaded.model, loaded.tokenizer, name=loaded.name, dtype=loaded.compute_dtype, dataset=Path(args.dataset),
                  max_tokens=args.max_tokens, window=args.window, batch=args.batch, reps=args.reps, candidate=cand)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    from qval.io import atomic_write_json

    atomic_write_json(Path(args.out) / "peer.json", out)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
