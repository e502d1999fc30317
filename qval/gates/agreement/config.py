"""Gate 1's config section (`gates.agreement`): its held-out text, its chunking and its limits (the rows of
`AGREEMENT`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from ...config_base import Strict, sets_a_threshold
from .metrics import AGREEMENT


class AgreementGate(Strict):
    enabled: bool = True  # gate 1: logits agreement, teacher-forced on held-out text
    dataset: str = "calib_data/heldout_eval.jsonl"  # held-out text, cut into disjoint chunks of ctx tokens
    tokens: int = Field(65536, gt=0)  # tokens of text read (chunks × ctx)
    ctx: int = Field(512, ge=8)  # chunk length, even: the second half of each chunk is scored
    batch_size: int = Field(4, gt=0)  # chunks per forward
    min_top1: Annotated[float, Field(ge=0, le=1)] | None = None
    max_mean_kld: Annotated[float, Field(ge=0)] | None = None
    max_p99_kld: Annotated[float, Field(ge=0)] | None = None

    @field_validator("ctx")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"ctx must be even (the second half of each chunk is scored); got {v}")
        return v

    @model_validator(mode="after")
    def _can_fail(self) -> "AgreementGate":
        return sets_a_threshold(self, AGREEMENT)
