"""Gate 1's typed details (logits agreement), and the KLD blocks that gate 1 at depth shares."""

from __future__ import annotations

from pydantic import Field

from ...results.base import Block, Details, EstimateDict, Num


class KldSummary(Block):
    """`metrics.kld_summary`: the mean with its standard error and the tail a mean hides."""

    mean: EstimateDict
    median: Num
    p90: Num
    p99: Num
    p99_9: Num = Field(alias="p99.9")
    max: Num


class DeltaPSummary(Block):
    """`metrics.delta_p_summary`: Δp = p_cand − p_ref of the true next token."""

    mean: EstimateDict
    rms: Num
    p1: Num
    p99: Num


class Histogram(Block):
    """Log-spaced histogram of the positive per-position KLDs (the HTML report's plot); `zeros`: KLD ≤ 0."""

    edges: list[Num] = []
    counts: list[int] = []
    zeros: int = 0


class KldBound(Block):
    """A snapshot reference's KLD: its estimate and the strict upper bound of the full-vocabulary mean."""

    mean_kld: Num
    mean_kld_upper: Num
    p99_kld_upper: Num
    note: str


class KldTopK(Block):
    """A side known by its top K: the gated figure, the plain estimate it is set from (absent in reports
    written before 2026-12-05), its strict lower bound and the unseen mass."""

    mean_kld: Num
    mean_kld_lower: Num
    p99_kld: Num
    p99_kld_lower: Num
    mean_unseen_mass: Num
    p99_unseen_mass: Num
    note: str
    mean_kld_estimate: Num | None = None
    p99_kld_estimate: Num | None = None


class KldAudit(Block):
    """A snapshot's KLD audited against the full reference logits computed in the same run."""

    mean_kld_exact: Num
    mean_kld_snapshot: Num
    relative_difference: Num


class Scored(Details):
    """What gates 1 and 1b share: the chunks of a data set they scored, and the KLD caveats."""

    dataset: str
    dataset_tokens: int | None = None  # absent in reports written before it was recorded
    tokens_requested: int | None = None
    chunks: int
    ctx: int
    scored_per_chunk: int | None = None
    dataset_tokens_note: str | None = None
    shortfall: str | None = None
    scored_positions: int
    kld_bound: KldBound | None = None
    kld_topk: KldTopK | None = None
    kld_audit: KldAudit | None = None


class AgreementDetails(Scored):
    """Gate 1: over every scored position, the KLD and Δp summaries and the KLD histogram."""

    kld: KldSummary
    delta_p: DeltaPSummary
    kld_histogram: Histogram


#: the gate's details type (`qval.results.TYPES`)
DETAILS = AgreementDetails
