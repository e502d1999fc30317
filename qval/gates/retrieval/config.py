"""The retrieval matrix's config section (`gates.retrieval`): the haystacks, lengths, depths and trials, and its
margins (the rows of `RETRIEVAL`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from ...config_base import Strict, sets_a_threshold
from .metrics import RETRIEVAL


class RetrievalGate(Strict):
    """The retrieval matrix: haystacks of shipped prose, a needle with a random pass code at a
    depth, the question after the haystack; both models answer greedily (exact match), paired
    per trial. Non-inferiority per context length and overall; a length the reference cannot
    solve is reported uninformative, never passed silently."""

    enabled: bool = True  # the retrieval matrix
    haystack: str = "calib_data/longctx_docs.jsonl"  # prose the haystacks are cut from
    lengths: list[int] = Field(default_factory=lambda: [512, 1024, 2048])  # prompt tokens, approximately
    depths: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # needle position, fraction of the haystack
    trials: int = Field(2, gt=0)  # per cell, each with its own key and haystack offset
    #: non-inferiority margins on the accuracy drop (reference − candidate, a fraction): per length, and pooled
    margin: Annotated[float, Field(gt=0, le=1)] | None = None
    margin_overall: Annotated[float, Field(gt=0, le=1)] | None = None  # pooled over the whole matrix
    alpha: float = Field(0.05, gt=0, lt=0.5)  # one-sided level of the drop's upper bound
    beta: float = Field(0.2, gt=0, lt=0.5)  # for the detectable drop printed beside each check
    #: a length whose reference accuracy is below this is uninformative (it cannot show a loss)
    min_reference_accuracy: float = Field(0.5, gt=0, le=1)
    max_answer_kld: Annotated[float, Field(ge=0)] | None = None  # mean KLD on the answer tokens (teacher-forced)

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if not v or any(x < 64 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"lengths must be distinct token counts >= 64, got {v}")
        return sorted(v)

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: list[float]) -> list[float]:
        if not v or any(not 0.0 <= x <= 1.0 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"depths must be distinct fractions in [0, 1], got {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _can_fail(self) -> "RetrievalGate":
        return sets_a_threshold(self, RETRIEVAL)
