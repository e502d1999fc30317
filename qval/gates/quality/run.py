"""Gate 2 — perplexity and BLEU/chrF.

Perplexity is measured over exactly the positions gate 1 scored (windowing "chunks": gate 1
stores both models' per-position NLL in `positions.npz`), or, for readers comparing with
published numbers, over HF-style sliding windows of the same text ("sliding"). The ratio
PPL_cand/PPL_ref = exp(mean(nll_c − nll_r)) takes its uncertainty from the paired differences.

BLEU and chrF: both models answer the prompts of `bleu_dataset` greedily (batched, KV cache,
stopping at EOS); sacrebleu scores each language group against the dataset's references with
that language's tokenizer ("zh" for Chinese). The gate is on the drop, reference − candidate,
per language, with a paired bootstrap interval; BLEU of the candidate against the reference's
own generations says how much the text changed. The reference's generations come from the
shared cache (qval.reference), so a second candidate never regenerates them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...config import GateConfig
from ...data import dataset_identity, load_dataset, token_stream
from ...errors import DataError
from ...metrics.estimate import Estimate
from ...progress import SILENT
from ...reference import GenerationSettings, paired_generations, render_prompts
from ...verdict import GateResult
from ..base import GateContext, GateSpec
from .judge import enabled, perplexity_part, thresholds
from .metrics import QUALITY
from .result import QualityDetails


def _positions(ctx: GateContext) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Both models' per-position NLL, and how the positions were chosen."""
    g = ctx.config.gates.quality
    if g.windowing == "sliding":
        return sliding_nll(ctx)
    upstream = ctx.upstream.get("agreement")
    if upstream is None:
        raise DataError("gate 2 reads gate 1's scored positions, and gate 1 did not run before it: enable "
                        "gates.agreement (it runs before gate 2 in `qval gate`), or set gates.quality.windowing: sliding.")
    with np.load(upstream.file("positions.npz")) as z:
        nll_ref, nll_cand = z["nll_ref"], z["nll_cand"]
    a = ctx.config.gates.agreement
    info = {"windowing": "chunks", "source": "gate 1 scored positions", "dataset": a.dataset, "ctx": a.ctx,
            "description": f"disjoint chunks of {a.ctx} tokens, second half of each scored (gate 1's positions)"}
    return nll_ref, nll_cand, info


def sliding_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """HF's strided-perplexity windows as (begin, end, scored): the model reads ids[begin:end]
    and only the last `scored` targets count, so every token is scored exactly once with up to
    `window` tokens of context. The first window scores all its predictable positions.

    >>> sliding_windows(10, 4, 2)
    [(0, 4, 4), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
    """
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n_tokens:
            break
    return out


def sliding_nll(ctx: GateContext) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Per-token NLL of both models over sliding windows of gate 1's text and token budget."""
    import torch

    from ...metrics.tokens import nll_of_targets

    a, g = ctx.config.gates.agreement, ctx.config.gates.quality
    stride = g.stride or a.ctx // 2
    ds = load_dataset(a.dataset, ctx.config.resolve(a.dataset))
    ids = token_stream(ds.texts(), ctx.tokenizer, ctx.tokenizer.eos_token_id)[: a.tokens]
    if len(ids) < 2:
        raise DataError(f"{a.dataset}: {len(ids)} tokens is too little text to score.")
    spans = sliding_windows(len(ids), a.ctx, stride)
    ref_parts, cand_parts = [], []
    with (ctx.progress or SILENT).task("gate 2: sliding-window perplexity", len(spans)) as advance:
        for begin, end, scored in spans:
            x = torch.tensor([ids[begin:end]])
            first = max(end - scored, begin + 1)  # a window's first token has no prediction
            # logits at position t predict token t+1: targets ids[first:end] come from logits[first-1:end-1]
            lo, hi = first - 1 - begin, end - 1 - begin
            target = x[0, first - begin : end - begin]
            ref_parts.append(nll_of_targets(ctx.reference.logits(x)[0, lo:hi], target).numpy())
            cand_parts.append(nll_of_targets(ctx.candidate.logits(x)[0, lo:hi], target).numpy())
            advance(1)
    info = {"windowing": "sliding", "dataset": a.dataset, "window": a.ctx, "stride": stride, "windows": len(spans),
            "description": f"sliding windows of {a.ctx} tokens, stride {stride}: each token scored once, "
                           f"the last {stride} of each window (Hugging Face strided-perplexity convention)"}
    return np.concatenate(ref_parts), np.concatenate(cand_parts), info


@dataclass(frozen=True)
class LangScores:
    """BLEU/chrF of one language group: both models against the dataset's references, the
    candidate against the reference's generations, and the paired-bootstrap drops."""

    key: str  # the language as a metric-name suffix ("en", "zh_cn")
    lang: str
    sentences: int
    scores: dict[str, float]  # bleu_ref, bleu_cand, bleu_cand_vs_ref, chrf_ref, chrf_cand, chrf_cand_vs_ref
    drops: dict[str, Estimate]  # bleu, chrf: reference − candidate
    sentence_sigma: dict[str, float]  # bleu, chrf: per-sentence std of the reference's scores
    signatures: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"lang": self.lang, "sentences": self.sentences, **self.scores,
                **{f"{m}_drop": e.to_dict() for m, e in self.drops.items()},
                **{f"{m}_sentence_sigma": v for m, v in self.sentence_sigma.items()}, "signatures": self.signatures}


def _metric(kind: str, tokenize: str, sentence: bool = False) -> Any:
    from sacrebleu.metrics import BLEU, CHRF

    if kind == "chrf":
        return CHRF()
    return BLEU(tokenize=tokenize, effective_order=sentence)  # effective order: sacrebleu's advice for one sentence


def paired_bootstrap_drop(metric: Any, refs: list[str], ref_hyps: list[str], cand_hyps: list[str],
                          resamples: int, seed: int) -> Estimate:
    """Corpus score(ref_hyps) − score(cand_hyps) with a paired bootstrap over sentences (both
    systems resampled with the same indices, as sacrebleu's paired test does): stderr is the
    std of the resampled drops, the interval their 2.5/97.5 percentiles."""
    ref_stats = np.asarray(metric._extract_corpus_statistics(ref_hyps, [refs]))
    cand_stats = np.asarray(metric._extract_corpus_statistics(cand_hyps, [refs]))
    def score(stats: np.ndarray) -> float:
        return float(metric._compute_score_from_stats(list(stats)).score)

    value = score(ref_stats.sum(0)) - score(cand_stats.sum(0))
    n = len(refs)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    drops = np.array([score(ref_stats[i].sum(0)) - score(cand_stats[i].sum(0)) for i in idx])
    lo, hi = np.percentile(drops, [2.5, 97.5])
    return Estimate(value, float(np.std(drops, ddof=1)), float(lo), float(hi), n)


def score_language(lang: str, refs: list[str], ref_hyps: list[str], cand_hyps: list[str], *, resamples: int, seed: int) -> LangScores:
    from ...metrics import bleu, bleu_tokenizer_for, chrf

    tok = bleu_tokenizer_for(lang)
    scores, drops, sigma, sigs = {}, {}, {}, {}
    for kind, corpus in (("bleu", lambda h, r: bleu(h, r, tokenize=tok)), ("chrf", chrf)):
        scores[f"{kind}_ref"], sigs[kind] = corpus(ref_hyps, refs)
        scores[f"{kind}_cand"], _ = corpus(cand_hyps, refs)
        scores[f"{kind}_cand_vs_ref"], _ = corpus(cand_hyps, ref_hyps)
        drops[kind] = paired_bootstrap_drop(_metric(kind, tok), refs, ref_hyps, cand_hyps, resamples, seed)
        one = _metric(kind, tok, sentence=True)
        per = [one.sentence_score(h, [r]).score for h, r in zip(ref_hyps, refs)]
        sigma[kind] = float(np.std(per, ddof=1)) if len(per) > 1 else float("nan")
    key = re.sub(r"[^a-z0-9]+", "_", lang.strip().lower()).strip("_") or "unknown"
    return LangScores(key, lang, len(refs), scores, drops, sigma, sigs)


def bleu_records(ctx: GateContext) -> list[dict[str, str]]:
    return records_for(ctx.config)


def records_for(cfg: GateConfig) -> list[dict[str, str]]:
    """The BLEU prompts, each with prompt, reference and lang; no model needed (qval validate runs it too)."""
    g = cfg.gates.quality
    ds = load_dataset(g.bleu_dataset, cfg.resolve(g.bleu_dataset))
    for i, r in enumerate(ds.records):
        bad = [k for k in ("prompt", "reference", "lang") if not isinstance(r.get(k), str) or not r[k].strip()]
        if bad:
            raise DataError(f"{g.bleu_dataset}: record {i} needs non-empty string fields prompt, reference and lang; "
                            f"missing or empty: {', '.join(bad)}.")
    return ds.records


def bleu_part(ctx: GateContext) -> tuple[dict[str, Estimate], dict[str, Any], int | None]:
    """Scores per language, details for the report, and the first prompt (if any) where the
    candidate's logits held a NaN/Inf while it answered."""
    g = ctx.config.gates.quality
    records = bleu_records(ctx)
    prompts, rendering = render_prompts(ctx.tokenizer, [r["prompt"] for r in records])
    settings = GenerationSettings(new_tokens=g.bleu_max_new_tokens, suppress_eos=False, batch_size=g.batch_size)
    ref, cand, paired = paired_generations(ctx, prompts, settings, "gate 2 (BLEU prompts)")

    def text(tokens: list[int]) -> str:
        return ctx.tokenizer.decode(tokens, skip_special_tokens=True).strip()

    ref_texts, cand_texts = [text(t) for t in ref.generation.tokens], [text(t) for t in cand.tokens]
    measurements: dict[str, Estimate] = {}
    groups: dict[str, Any] = {}
    for lang in sorted({r["lang"] for r in records}):
        idx = [i for i, r in enumerate(records) if r["lang"] == lang]
        s: LangScores = score_language(lang, [records[i]["reference"] for i in idx], [ref_texts[i] for i in idx],
                                       [cand_texts[i] for i in idx], resamples=g.bootstrap, seed=ctx.config.seed)
        measurements[f"bleu_drop_{s.key}"] = s.drops["bleu"]
        measurements[f"chrf_drop_{s.key}"] = s.drops["chrf"]
        groups[s.key] = s.to_dict()
    details = {"dataset": g.bleu_dataset, "prompts": len(records), "rendering": rendering, "max_new_tokens": g.bleu_max_new_tokens,
               "decoding": "greedy, batched, stops at EOS", "reference_generation": ref.describe(),
               "candidate_generation_seconds": paired["candidate_seconds"], "generated_side_by_side": paired["side_by_side"], "groups": groups,
               "samples": [{"id": r.get("id", str(i)), "lang": r["lang"], "reference": r["reference"], "ref_model": ref_texts[i],
                            "candidate": cand_texts[i]} for i, r in enumerate(records[:6])]}
    bad = next((i for i, step in enumerate(cand.first_nonfinite_step) if step is not None), None)
    return measurements, details, bad


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    nll_ref, nll_cand, ppl_info = _positions(ctx)
    if not np.all(np.isfinite(nll_ref)):
        i = int(np.flatnonzero(~np.isfinite(nll_ref))[0])
        return GateResult("quality", "error", details={"ppl": ppl_info}, seconds=time.perf_counter() - t0,
                          error=f"the REFERENCE has a non-finite NLL at scored position {i}; the reference itself is broken")
    if not np.all(np.isfinite(nll_cand)):
        i = int(np.flatnonzero(~np.isfinite(nll_cand))[0])
        return GateResult("quality", "nonfinite", details={"ppl": ppl_info}, seconds=time.perf_counter() - t0,
                          error=f"the candidate's NLL is non-finite first at scored position {i} ({ppl_info['windowing']} windowing)")
    measurements, ppl_details = perplexity_part(nll_ref, nll_cand)
    bleu_m, bleu_details, bad = bleu_part(ctx)
    measurements.update(bleu_m)
    details = QualityDetails.model_validate({"ppl": {**ppl_info, **ppl_details}, "bleu": bleu_details})
    if bad is not None:
        return GateResult("quality", "nonfinite", measurements, details, seconds=time.perf_counter() - t0,
                          error=f"the candidate produced non-finite logits while answering BLEU prompt {bad}")
    return GateResult("quality", "ok", measurements, details, seconds=time.perf_counter() - t0)


def inputs(cfg: GateConfig) -> dict[str, Any]:
    g = cfg.gates.quality
    out: dict[str, Any] = {"gate": g.model_dump(mode="json", exclude=QUALITY.cache_exclude()),
                           "bleu_data": dataset_identity(g.bleu_dataset, cfg.resolve(g.bleu_dataset))}
    if g.windowing == "sliding":
        a = cfg.gates.agreement
        out["ppl_data"] = dataset_identity(a.dataset, cfg.resolve(a.dataset))
        out["window"] = {"ctx": a.ctx, "tokens": a.tokens}
    return out


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    records_for(cfg)
    return None


SPEC = GateSpec("quality", run, thresholds, inputs, enabled, needs=("agreement",),
                check=check)
