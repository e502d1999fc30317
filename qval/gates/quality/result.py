"""Gate 2's typed details: how the perplexity positions were chosen with their paired NLL figures, and
BLEU/chrF per language group."""

from __future__ import annotations

from typing import Any

from ...results.base import Block, Details, EstimateDict, Num


class Perplexity(Block):
    """The perplexity's positions: gate 1's chunks (`windowing: chunks`, `source`, `ctx`) or sliding
    windows (`window`, `stride`, `windows`), and the paired per-position NLL figures. `sigma_nll_diff`
    sizes a sized `max_ppl_ratio`."""

    windowing: str
    source: str | None = None
    dataset: str
    ctx: int | None = None
    window: int | None = None
    stride: int | None = None
    windows: int | None = None
    description: str
    positions: int
    mean_nll_ref: EstimateDict
    mean_nll_cand: EstimateDict
    mean_nll_diff: EstimateDict
    sigma_nll_diff: Num


class LangGroup(Block):
    """BLEU/chrF of one language: both models against the references, the candidate against the
    reference's generations, the paired-bootstrap drops, and the per-sentence σ a sized drop uses."""

    lang: str
    sentences: int
    bleu_ref: Num
    bleu_cand: Num
    bleu_cand_vs_ref: Num
    chrf_ref: Num
    chrf_cand: Num
    chrf_cand_vs_ref: Num
    bleu_drop: EstimateDict
    chrf_drop: EstimateDict
    bleu_sentence_sigma: Num
    chrf_sentence_sigma: Num
    signatures: dict[str, str]

    def sentence_sigma(self, score: str) -> float:
        """σ of `score` ("bleu" or "chrf") per sentence of the reference's generations."""
        return {"bleu": self.bleu_sentence_sigma, "chrf": self.chrf_sentence_sigma}[score]


class Sample(Block):
    """One prompt's texts shown in the report."""

    id: str
    lang: str
    reference: str
    ref_model: str
    candidate: str


class Bleu(Block):
    dataset: str
    prompts: int
    rendering: str
    max_new_tokens: int
    decoding: str
    #: the reference's generations: cached or generated in this run (the reference store's entry: reference.CachedGeneration.describe())
    reference_generation: dict[str, Any]
    candidate_generation_seconds: Num | None = None  # absent in reports written before it was recorded
    generated_side_by_side: bool | None = None
    groups: dict[str, LangGroup]
    samples: list[Sample] = []


class QualityDetails(Details):
    """Gate 2: perplexity, and BLEU/chrF on the translation prompts."""

    ppl: Perplexity
    bleu: Bleu | None = None


#: the gate's details type (`qval.results.TYPES`)
DETAILS = QualityDetails
