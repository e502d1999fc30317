"""Gate 3's teacher-forced passes: both models over the reference's continuation, the reference over
the candidate's (the judge), through each engine's KV cache `piece` tokens at a time, as decoding
fills it — several rows at once on a GPU (`rows_at_once`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..metrics.tokens import nll_of_targets, token_stats
from .base import GateContext


def rows_at_once(ctx: GateContext) -> int:
    """How many sequences one teacher-forced forward carries. On a GPU, the gate's batch: a
    `piece`-token forward of one sequence is too little work for an 8B model's kernels (the
    launches of its ~1,300 kernels take longer than the GPU needs for them: RESULTS.md §14), so
    8 rows go through together. On a CPU one row, as always: a CPU forward is bound by its
    arithmetic (rows gain nothing there) and its figures, and the snapshot entries keyed by
    these calls, stay what they were. Decided by the reference's device alone: a sequential run's
    reference phase (the candidate a stand-in on the reference's device) and its candidate phase
    must ask the snapshot the same calls."""
    gpu = str(ctx.reference.device).startswith("cuda")
    return ctx.config.gates.longgen.batch_size if gpu else 1


def _pieces(engine: Any, seqs: list[list[int]], piece: int, pad: int) -> Any:
    """[len(seqs), width] logits piece by piece; rows right-padded (causal attention: a real
    position never sees the padding after it, and each row's pieces start where a lone row's do)."""
    width = max(len(x) for x in seqs)
    return engine.logits_pieces(torch.tensor([x + [pad] * (width - len(x)) for x in seqs]), piece)


def _pad_id(ctx: GateContext) -> int:
    pad = getattr(ctx.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else 0  # never read: only padding positions see it


def _spans(prompts: list[list[int]], conts: list[list[int]]) -> list[tuple[list[int], int, int]]:
    """Per row: its ids, and the logits rows [first, last) that predict its continuation tokens."""
    return [(p + c, len(p) - 1, len(p) + len(c) - 1) for p, c in zip(prompts, conts)]


def teacher_forced_rows(ctx: GateContext, prompts: list[list[int]], conts: list[list[int]], piece: int) -> list[dict[str, np.ndarray]]:
    """Per row, per continuation position: KLD(ref‖cand), top-1 agreement, both NLLs, finiteness.

    Logits at position t predict token t+1, so continuation token j (at t = len(prompt) + j)
    is scored from the logits at t − 1. Both engines walk the rows in the same pieces.
    """
    spans = _spans(prompts, conts)
    parts: list[dict[str, list[np.ndarray]]] = [{} for _ in spans]
    seqs = [ids for ids, _, _ in spans]
    pad = _pad_id(ctx)
    start = 0
    for lr, lc in zip(_pieces(ctx.reference, seqs, piece, pad), _pieces(ctx.candidate, seqs, piece, pad)):
        end = start + lr.shape[1]
        cut = [(row, lo - start, hi - start, ids[lo + 1 : hi + 1]) for row, (ids, first, last) in enumerate(spans)
               if (lo := max(start, first)) < (hi := min(end, last))]
        if len(cut) > 1 and isinstance(lr, torch.Tensor) and isinstance(lc, torch.Tensor):
            # every row's positions of this piece in one call: the statistics are per position,
            # so one call over the rows stacked is the calls row by row, with one launch sequence
            st = token_stats(torch.cat([lr[r, a:b] for r, a, b, _ in cut]), torch.cat([lc[r, a:b] for r, a, b, _ in cut]),
                             torch.tensor([t for *_, tg in cut for t in tg]))
            bounds = np.cumsum([0] + [b - a for _, a, b, _ in cut])
            for i, (r, *_rest) in enumerate(cut):
                for k, v in st.items():
                    parts[r].setdefault(k, []).append(v[bounds[i] : bounds[i + 1]].numpy())
        else:
            for r, a, b, tg in cut:
                for k, v in token_stats(lr[r, a:b], lc[r, a:b], torch.tensor(tg)).items():
                    parts[r].setdefault(k, []).append(v.numpy())
        start = end
        del lr, lc
    return [{k: np.concatenate(v) for k, v in p.items()} for p in parts]


def teacher_forced(ctx: GateContext, prompt: list[int], cont: list[int], piece: int) -> dict[str, np.ndarray]:
    """`teacher_forced_rows` of one sequence."""
    return teacher_forced_rows(ctx, [prompt], [cont], piece)[0]


def judge_nll_rows(ctx: GateContext, prompts: list[list[int]], conts: list[list[int]], piece: int) -> list[np.ndarray]:
    """The reference's NLL of each token of each `cont` after its `prompt` (the "judge" of a text)."""
    spans = _spans(prompts, conts)
    out: list[list[np.ndarray]] = [[] for _ in spans]
    start = 0
    for logits in _pieces(ctx.reference, [ids for ids, _, _ in spans], piece, _pad_id(ctx)):
        end = start + logits.shape[1]
        for row, (ids, first, last) in enumerate(spans):
            lo, hi = max(start, first), min(end, last)
            if lo < hi:
                out[row].append(nll_of_targets(logits[row, lo - start : hi - start], torch.tensor(ids[lo + 1 : hi + 1])).numpy())
        start = end
    return [np.concatenate(o) if o else np.zeros(0) for o in out]


def judge_nll(ctx: GateContext, prompt: list[int], cont: list[int], piece: int) -> np.ndarray:
    """`judge_nll_rows` of one text."""
    return judge_nll_rows(ctx, [prompt], [cont], piece)[0]
