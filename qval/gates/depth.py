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

from ..config import GateConfig
from ..data import chunk, dataset_identity, load_dataset, read_texts
from ..errors import DataError
from ..gate_metrics import DEPTH
from ..io import atomic_write
from ..metrics import delta_p_summary, kld_summary, mean_estimate, proportion, quantiles
from ..metrics.agreement import BOUND_FIELDS, kld_bound_details
from ..metrics.estimate import Estimate
from ..metrics.tokens import first_nonfinite, token_stats
from ..progress import SILENT
from ..shortfall import shortfall
from ..verdict import GateResult, Threshold
from .base import GateContext, GateSpec, context_problem, max_positions
from .agreement import leading_tokens

FIELDS = ("kld", "top1", "p_ref", "p_cand", "nll_ref", "nll_cand")
#: a position whose KLD is at most this is "the same distribution" (float rounding of one model)
SAME_KLD = 1e-6


def bucket_spans(edges: list[int], scored: int) -> list[tuple[int, int]]:
    """[lo, hi) position ranges of the depth buckets, clipped to the `scored` positions a chunk has.

    >>> bucket_spans([512, 1024, 2048], 2047)
    [(0, 512), (512, 1024), (1024, 2047)]
    >>> bucket_spans([512, 1024], 700)
    [(0, 512), (512, 700)]
    """
    out, lo = [], 0
    for e in edges:
        hi = min(e, scored)
        if hi > lo:
            out.append((lo, hi))
        lo = e
        if lo >= scored:
            break
    return out


def bucket_label(lo: int, hi: int) -> str:
    """The name a bucket's metrics carry: `top1@512-1024`."""
    return f"{lo}-{hi}"


def scored_chunks(ctx: GateContext) -> tuple[list[list[int]], dict[str, Any]]:
    return chunks_for(ctx.config, ctx.tokenizer)


def chunks_for(cfg: GateConfig, tokenizer: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """The gate's long chunks from its dataset and the tokenizer alone (qval validate runs it too)."""
    g = cfg.gates.depth
    ds = load_dataset(g.dataset, cfg.resolve(g.dataset))
    ids, more = leading_tokens(ds.texts(), tokenizer, tokenizer.eos_token_id, g.tokens // g.ctx * g.ctx)
    chunks = chunk(ids, g.ctx, limit=g.tokens // g.ctx)
    if not chunks:
        raise DataError(f"{g.dataset}: {len(ids)} tokens is less than one chunk of ctx={g.ctx}; give longer documents "
                        f"or a smaller gates.depth.ctx.")
    info = {"dataset": g.dataset, "dataset_tokens": len(ids), "tokens_requested": g.tokens, "chunks": len(chunks),
            "ctx": g.ctx, "piece": g.piece, "records": len(ds.records)}
    if more:
        info["dataset_tokens_note"] = "tokenized up to the requested tokens; the rest of the data set was not read"
    if note := shortfall("gates.depth.tokens", g.tokens, len(chunks) * g.ctx, f"tokens in whole chunks of {g.ctx}",
                         cfg.max_shortfall):
        info["shortfall"] = note
    return chunks, info


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
    atomic_write(ctx.folder / "positions.npz", lambda p: _save_npz(p, arrays))
    return summarize(ctx.config, arrays, info, time.perf_counter() - t0)


def _save_npz(path: Any, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def divergence(kld: np.ndarray, top1: np.ndarray, window: int) -> dict[str, Any]:
    """Where the candidate departs from the reference, from [chunks, positions] arrays.

    `first_difference`: the first depth at which any chunk's KLD exceeds SAME_KLD (None: the
    candidate reproduces the reference everywhere); `series`: mean KLD and top-1 per window of
    `window` positions (mean over chunks), which `first_beyond` reads against the limits.
    >>> k = np.zeros((2, 8)); k[:, 5:] = 0.5
    >>> d = divergence(k, k < 0.1, 2)
    >>> d["first_difference"], [w["kld"] for w in d["series"]]
    (5, [0.0, 0.0, 0.25, 0.5])
    """
    differs = np.nonzero((kld > SAME_KLD).any(axis=0))[0]
    series = []
    for s in range(0, kld.shape[1], window):
        e = min(s + window, kld.shape[1])
        series.append({"start": s, "end": e, "kld": float(kld[:, s:e].mean()), "top1": float(top1[:, s:e].mean())})
    return {"first_difference": int(differs[0]) if differs.size else None, "window": window, "series": series}


def first_beyond(series: list[dict[str, Any]], max_kld: float | None, min_top1: float | None) -> int | None:
    """Start of the first window whose mean KLD is above `max_kld` or top-1 below `min_top1`.

    >>> first_beyond([{"start": 0, "kld": 0.01, "top1": 0.9}, {"start": 128, "kld": 0.2, "top1": 0.9}], 0.05, None)
    128
    """
    for w in series:
        if (max_kld is not None and w["kld"] > max_kld) or (min_top1 is not None and w["top1"] < min_top1):
            return int(w["start"])
    return None


def where_it_diverges(cfg: GateConfig, result: GateResult | None) -> str:
    """'first departs from the reference at depth 601; windows beyond the limits from depth 640'."""
    if result is None or result.status != "ok":
        return ""
    g, d = cfg.gates.depth, result.details.get("divergence", {})
    first = d.get("first_difference")
    if first is None:
        return "the candidate reproduces the reference at every depth"
    beyond = first_beyond(d.get("series", []), g.max_mean_kld, g.min_top1)
    text = f"the candidate first departs from the reference at depth {first}"
    return text + (f"; windows of {d.get('window')} beyond the limits from depth {beyond}" if beyond is not None
                   else "; no window of it crosses the limits")


def summarize(cfg: GateConfig, a: dict[str, np.ndarray], info: dict[str, Any], seconds: float) -> GateResult:
    g = cfg.gates.depth
    scored = a["kld"].shape[1]
    measurements: dict[str, Estimate] = {}
    buckets = []
    for lo, hi in bucket_spans(g.edges, scored):
        label = bucket_label(lo, hi)
        k, t = a["kld"][:, lo:hi].reshape(-1), a["top1"][:, lo:hi].reshape(-1)
        dp = (a["p_cand"][:, lo:hi] - a["p_ref"][:, lo:hi]).reshape(-1)
        kld = kld_summary(k)
        measurements[f"top1@{label}"] = proportion(t)
        measurements[f"mean_kld@{label}"] = kld["mean"]
        measurements[f"p99_kld@{label}"] = Estimate(value=quantiles(k, [0.99])["p99"], n=int(k.size))
        buckets.append({"label": label, "lo": lo, "hi": hi, "positions": int(k.size), "top1": proportion(t).to_dict(),
                        "kld": {key: (v.to_dict() if hasattr(v, "to_dict") else v) for key, v in kld.items()},
                        "delta_p": {key: (v.to_dict() if hasattr(v, "to_dict") else v) for key, v in delta_p_summary(dp).items()},
                        "nll_ref": float(a["nll_ref"][:, lo:hi].mean()), "nll_cand": float(a["nll_cand"][:, lo:hi].mean())})
    allk = a["kld"].reshape(-1)
    measurements["top1"] = proportion(a["top1"].reshape(-1))
    measurements["mean_kld"] = mean_estimate(allk)
    details = {**info, **kld_bound_details(a), "scored_positions": int(allk.size), "scored_per_chunk": scored, "buckets": buckets,
               "divergence": divergence(a["kld"], a["top1"], g.window)}
    return GateResult("depth", "ok", measurements=measurements, details=details, seconds=seconds)


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    g = cfg.gates.depth
    out = []
    said = where_it_diverges(cfg, result)
    for lo, hi in bucket_spans(g.edges, g.ctx - 1):
        label, where = bucket_label(lo, hi), f"at context depths {lo}–{hi}" + (f" ({said})" if said else "")
        out += [Threshold("depth", f"{m.key}@{label}", m.op, limit, m.describe(where=where), on=m.on)
                for m in DEPTH.metrics if (limit := getattr(g, m.field)) is not None]
    return out


def inputs(cfg: GateConfig) -> dict[str, Any]:
    g = cfg.gates.depth
    return {"gate": g.model_dump(mode="json", exclude=DEPTH.cache_exclude()),
            "data": dataset_identity(g.dataset, cfg.resolve(g.dataset))}


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    g = cfg.gates.depth
    if tokenizer is None:
        read_texts(g.dataset, cfg.resolve(g.dataset))
        return None
    return chunks_for(cfg, tokenizer)[1].get("shortfall")


SPEC = GateSpec("depth", run, thresholds, inputs, lambda c: c.gates.depth.enabled,
                context=lambda c: ("gates.depth.ctx", c.gates.depth.ctx), check=check)
