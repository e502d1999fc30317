"""Gate 1 at depth — logits agreement deep in a long context.

Gate 1 scores 512-token chunks, so damage that starts past position 512 (a positional encoding
that changes beyond some length, KV-cache scales that clip only once the cache is long) never
reaches it. This gate scores long held-out documents in chunks of a long `ctx`, piece by piece
through each engine's KV cache, the way decoding fills it (a quantized KV cache is exercised as
deployed), and reports top-1 / KLD / Δp per depth bucket (0–512, 512–1k, 1–2k, …): every limit
applies to every bucket. It also names the depth where the candidate starts to diverge: the
first position it departs from the reference at all, and the first window whose figures cross
the gate's limits.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ...config import GateConfig
from ...errors import DataError
from ...metrics.agreement import BOUND_FIELDS
from ...metrics.tokens import first_nonfinite, token_stats
from ...progress import SILENT
from ...verdict import GateResult
from ..base import GateContext, GateSpec, chunked_data_check, context_problem, max_positions, save_positions, section_inputs
from ..agreement.run import whole_chunks
from .judge import enabled, summarize, thresholds
from .metrics import DEPTH

FIELDS = ("kld", "top1", "p_ref", "p_cand", "nll_ref", "nll_cand")


def scored_chunks(ctx: GateContext) -> tuple[list[list[int]], dict[str, Any]]:
    return chunks_for(ctx.config, ctx.tokenizer)


def chunks_for(cfg: GateConfig, tokenizer: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """The gate's long chunks from its dataset and the tokenizer alone (qval validate runs it too)."""
    g = cfg.gates.depth
    return whole_chunks(cfg, "depth", tokenizer, "give longer documents or a smaller gates.depth.ctx.",
                        lambda ds: {"piece": g.piece, "records": len(ds.records)})


def score_chunk(ctx: GateContext, ids: list[int], piece: int) -> dict[str, np.ndarray]:
    """Per position t (predicting token t+1) of one chunk: token_stats, both engines walking it
    in the same pieces through their KV caches."""
    x = torch.tensor([ids])
    parts: dict[str, list[np.ndarray]] = {}
    start = 0
    for lr, lc in zip(ctx.reference.logits_pieces(x, piece), ctx.candidate.logits_pieces(x, piece)):
        end = start + lr.shape[1]
        hi = min(end, len(ids) - 1)  # the last position has no next token
        if start < hi:
            s = token_stats(lr[0, : hi - start], lc[0, : hi - start], torch.tensor(ids[start + 1 : hi + 1]))
            for k, v in s.items():
                parts.setdefault(k, []).append(v.numpy())
        start = end
        del lr, lc
    return {k: np.concatenate(v) for k, v in parts.items()}


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    g = ctx.config.gates.depth
    if (problem := context_problem(SPEC, ctx.config, max_positions(ctx))) is not None:
        raise DataError(problem)
    chunks, info = scored_chunks(ctx)
    rows: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    with (ctx.progress or SILENT).task(f"gate 1 at depth: {len(chunks)} × {g.ctx} tokens", len(chunks)) as advance:
        for c, ids in enumerate(chunks):
            s = score_chunk(ctx, ids, g.piece)
            if (t := first_nonfinite(torch.from_numpy(s["finite_ref"]))) is not None:
                return GateResult("depth", "error", details=info, seconds=time.perf_counter() - t0,
                                  error=f"the REFERENCE produced non-finite logits at chunk {c}, depth {t}; the reference itself is broken")
            if (t := first_nonfinite(torch.from_numpy(s["finite_cand"]))) is not None:
                return GateResult("depth", "nonfinite", details=info, seconds=time.perf_counter() - t0,
                                  error=f"the candidate produced non-finite logits first at chunk {c}, depth {t}")
            for f in FIELDS + BOUND_FIELDS:
                if f in s:
                    rows.setdefault(f, []).append(s[f])
            advance(1)
    arrays = {f: np.stack(v) for f, v in rows.items()}  # [chunks, ctx − 1]
    save_positions(ctx.folder, arrays)
    return summarize(ctx.config, arrays, info, time.perf_counter() - t0)


def inputs(cfg: GateConfig) -> dict[str, Any]:
    return section_inputs(cfg, cfg.gates.depth, DEPTH, cfg.gates.depth.dataset)


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    return chunked_data_check(cfg, cfg.gates.depth.dataset, tokenizer, chunks_for)


SPEC = GateSpec("depth", run, thresholds, inputs, enabled,
                context=lambda c: ("gates.depth.ctx", c.gates.depth.ctx), check=check)
