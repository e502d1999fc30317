"""Gate 1 — logits agreement, teacher-forced: both models see exactly the same tokens.

The validation text is cut into disjoint chunks of `ctx` tokens and only the second half of
each chunk is scored, so every scored position has at least ctx/2 tokens of context (the
llama.cpp KL-divergence convention). Per scored position: top-1 agreement, KLD(ref‖cand),
Δp of the true next token, and both models' NLL (gate 2's perplexity reuses them).
Memory is O(batch × ctx × vocab): logits live for one batch of chunks, then only per-position
figures (a few floats each) are kept; the metrics of a batch's scored halves are computed in one
call, so their float32 temporaries are O(batch × ctx/2 × vocab) too.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from ...config import GateConfig
from ...data import chunk, load_dataset, token_stream
from ...errors import DataError
from ...progress import SILENT
from ...shortfall import shortfall
from ...metrics.agreement import BOUND_FIELDS
from ...metrics.tokens import first_nonfinite, token_stats
from ...verdict import GateResult
from ..base import GateContext, GateSpec, chunked_data_check, save_positions, section_inputs
from .judge import enabled, summarize, thresholds
from .metrics import AGREEMENT

FIELDS = ("kld", "top1", "p_ref", "p_cand", "nll_ref", "nll_cand")


def leading_tokens(texts: list[str], tokenizer: Any, separator: int | None, budget: int) -> tuple[list[int], bool]:
    """`token_stream` of the leading documents that hold `budget` tokens, and whether documents
    were left unread: the chunks cut from it are the same as from the whole set, and a large
    data set is not tokenized past what the gate scores (it was a fixed cost of every run)."""
    ids: list[int] = []
    for i, text in enumerate(texts):
        ids.extend(token_stream([text], tokenizer, separator))
        if len(ids) >= budget:
            return ids, i + 1 < len(texts)
    return ids, False


def scored_chunks(ctx: GateContext) -> tuple[list[list[int]], dict[str, Any]]:
    return chunks_for(ctx.config, ctx.tokenizer)


def chunks_for(cfg: GateConfig, tokenizer: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """The gate's chunks from its dataset and the tokenizer alone (qval validate runs it too)."""
    g = cfg.gates.agreement
    return whole_chunks(cfg, "agreement", tokenizer, "give more text or a smaller ctx.",
                        lambda ds: {"scored_per_chunk": g.ctx - g.ctx // 2 - 1})


def whole_chunks(cfg: GateConfig, gate: str, tokenizer: Any, too_short: str, facts: Callable[[Any], dict[str, Any]],
                 ) -> tuple[list[list[int]], dict[str, Any]]:
    """The leading `tokens // ctx` whole chunks of `ctx` tokens of the gate's data set (`gates.<gate>`: `dataset`,
    `tokens`, `ctx`), tokenizing no more of it than they need, and what the report says of them (`facts` of the data
    set added after `ctx`, then the notes: the data set not read to its end, a shortfall of the tokens asked)."""
    g = getattr(cfg.gates, gate)
    ds = load_dataset(g.dataset, cfg.resolve(g.dataset))
    ids, more = leading_tokens(ds.texts(), tokenizer, tokenizer.eos_token_id, g.tokens // g.ctx * g.ctx)
    chunks = chunk(ids, g.ctx, limit=g.tokens // g.ctx)
    if not chunks:
        raise DataError(f"{g.dataset}: {len(ids)} tokens is less than one chunk of ctx={g.ctx}; {too_short}")
    info = {"dataset": g.dataset, "dataset_tokens": len(ids), "tokens_requested": g.tokens, "chunks": len(chunks),
            "ctx": g.ctx, **facts(ds)}
    if more:
        info["dataset_tokens_note"] = "tokenized up to the requested tokens; the rest of the data set was not read"
    if note := shortfall(f"gates.{gate}.tokens", g.tokens, len(chunks) * g.ctx, f"tokens in whole chunks of {g.ctx}",
                         cfg.max_shortfall):
        info["shortfall"] = note
    return chunks, info


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    g = ctx.config.gates.agreement
    chunks, info = scored_chunks(ctx)
    half = g.ctx // 2
    parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    bad_ref = bad_cand = None
    with (ctx.progress or SILENT).task("gate 1: logits agreement", len(chunks)) as advance:
        for b0 in range(0, len(chunks), g.batch_size):
            x = torch.tensor(chunks[b0 : b0 + g.batch_size])
            lr = ctx.reference.logits(x)
            lc = ctx.candidate.logits(x)
            # logits at position t predict token t+1; score t in [half, ctx-1). One metrics call
            # for the whole batch (rows are independent): a quarter of the launches and host syncs
            per = g.ctx - half - 1
            s = token_stats(lr[:, half:-1].reshape(-1, lr.shape[-1]), lc[:, half:-1].reshape(-1, lc.shape[-1]),
                            x[:, half + 1 :].reshape(-1).to(lr.device))
            offset = sum(len(p) for p in parts["kld"])
            if bad_ref is None and (i := first_nonfinite(s["finite_ref"])) is not None:
                bad_ref = (b0 + i // per, half + i % per, offset + i)
            if bad_cand is None and (i := first_nonfinite(s["finite_cand"])) is not None:
                bad_cand = (b0 + i // per, half + i % per, offset + i)
            for f in FIELDS + BOUND_FIELDS:
                if f in s:
                    parts.setdefault(f, []).append(s[f].numpy())
            del lr, lc, s
            advance(x.shape[0])
    arrays = {f: np.concatenate(v) for f, v in parts.items()}
    save_positions(ctx.folder, arrays)
    info["scored_positions"] = int(arrays["kld"].size)
    if bad_ref is not None:
        c, t, n = bad_ref
        return GateResult("agreement", "error", details=info, seconds=time.perf_counter() - t0,
                          error=f"the REFERENCE produced non-finite logits at chunk {c}, position {t} (scored position {n}); the reference itself is broken")
    if bad_cand is not None:
        c, t, n = bad_cand
        return GateResult("agreement", "nonfinite", details=info, seconds=time.perf_counter() - t0,
                          error=f"the candidate produced non-finite logits first at chunk {c}, position {t} (scored position {n})")
    return summarize(arrays, info, time.perf_counter() - t0)


def inputs(cfg: GateConfig) -> dict[str, Any]:
    return section_inputs(cfg, cfg.gates.agreement, AGREEMENT, cfg.gates.agreement.dataset)


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    return chunked_data_check(cfg, cfg.gates.agreement.dataset, tokenizer, chunks_for)


SPEC = GateSpec("agreement", run, thresholds, inputs, enabled,
                context=lambda c: ("gates.agreement.ctx", c.gates.agreement.ctx), check=check)
