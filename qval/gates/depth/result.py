"""Gate 1 at depth's typed details: per-depth buckets and where the candidate departs."""

from __future__ import annotations

from ...results.base import Block, EstimateDict, Num
from ..agreement.result import DeltaPSummary, KldSummary, Scored


class Bucket(Block):
    """One depth bucket [lo, hi) of the scored positions."""

    label: str
    lo: int
    hi: int
    positions: int
    top1: EstimateDict
    kld: KldSummary
    delta_p: DeltaPSummary
    nll_ref: Num
    nll_cand: Num


class Window(Block):
    """Mean KLD and top-1 over one window of depth (mean over chunks)."""

    start: int
    end: int
    kld: Num
    top1: Num


class Divergence(Block):
    """`first_difference`: the first depth at which any chunk's KLD exceeds `judge.SAME_KLD`
    (None: the candidate reproduces the reference everywhere); `series`: the per-window means."""

    first_difference: int | None
    window: int
    series: list[Window]


class DepthDetails(Scored):
    """Gate 1 at depth: both models fill their KV caches `piece` tokens at a time; every position scored."""

    piece: int | None = None  # absent in reports written before it was recorded
    records: int | None = None
    buckets: list[Bucket]
    divergence: Divergence


#: the gate's details type (`qval.results.TYPES`)
DETAILS = DepthDetails
