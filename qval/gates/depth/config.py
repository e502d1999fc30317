"""Gate 1 at depth's config section (`gates.depth`): the long documents, the context, the depth buckets and its
limits (the rows of `DEPTH`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from ...config_base import Strict, sets_a_threshold
from .metrics import DEPTH


def _depth_edges(ctx: int) -> list[int]:
    """Default depth buckets: 0–512, 512–1k, 1k–2k, … doubling up to ctx (its last edge).

    >>> _depth_edges(2048), _depth_edges(3000), _depth_edges(512)
    ([512, 1024, 2048], [512, 1024, 2048, 3000], [512])
    """
    edges, e = [], 512
    while e < ctx:
        edges.append(e)
        e *= 2
    return edges + [ctx]


class DepthGate(Strict):
    """Gate 1 at depth: long held-out documents scored at a long `ctx`, piece by piece through
    the KV cache (as decoding fills it); top-1/KLD/Δp per depth bucket, every limit applied to
    every bucket, and the depth at which the candidate starts to diverge."""

    enabled: bool = True  # gate 1 at depth
    dataset: str = "calib_data/longctx_docs.jsonl"  # long held-out documents
    ctx: int = Field(2048, ge=64)  # the long context: chunks of this many tokens, every position scored
    tokens: int = Field(4096, gt=0)  # tokens of text scored: chunks of ctx
    piece: int = Field(512, gt=0)  # the KV cache is filled this many tokens at a time
    #: upper edges of the depth buckets (positions in the context window); default: 512, 1024, … ctx
    buckets: list[int] | None = None
    window: int = Field(128, gt=0)  # the per-depth series (and the divergence depth) in windows of this many positions
    min_top1: Annotated[float, Field(ge=0, le=1)] | None = None
    max_mean_kld: Annotated[float, Field(ge=0)] | None = None
    max_p99_kld: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _fits(self) -> "DepthGate":
        if self.tokens < self.ctx:
            raise ValueError(f"tokens ({self.tokens}) is less than one chunk of ctx ({self.ctx})")
        if self.buckets is not None:
            b = self.buckets
            if not b or any(x <= 0 for x in b) or any(y <= x for x, y in zip(b, b[1:])):
                raise ValueError(f"buckets must be increasing positive depths, got {b}")
            if b[-1] > self.ctx:
                raise ValueError(f"the last bucket edge ({b[-1]}) is deeper than ctx ({self.ctx})")
        return sets_a_threshold(self, DEPTH)

    @property
    def edges(self) -> list[int]:
        """Bucket upper edges, the last one at ctx − 1 positions scored per chunk at most."""
        return list(self.buckets) if self.buckets else _depth_edges(self.ctx)
