"""Gate 2's config section (`gates.quality`): perplexity's windowing, the BLEU/chrF data, and its limits, each
checked by its row of `QUALITY` (`check_limit`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ...config_base import Limit, Strict, check_limit, sets_a_threshold
from .metrics import QUALITY


class QualityGate(Strict):
    """Gate 2: perplexity over gate 1's scored positions (windowing "chunks") or HF-style
    sliding windows over the same text ("sliding"), and BLEU/chrF of greedy generations."""

    enabled: bool = True  # gate 2: perplexity and BLEU/chrF
    windowing: Literal["chunks", "sliding"] = "chunks"  # chunks: gate 1's scored positions; sliding: HF's stride convention
    stride: int | None = Field(None, gt=0)  # sliding: tokens scored per window (default ctx/2)
    max_ppl_ratio: Limit = None  # PPL_cand / PPL_ref
    bleu_dataset: str = "calib_data/bleu_eval.jsonl"  # JSONL of prompts with reference translations
    bleu_max_new_tokens: int = Field(64, gt=0)  # greedy tokens generated per BLEU prompt
    batch_size: int = Field(8, gt=0)  # BLEU prompts generated together
    bootstrap: int = Field(1000, ge=100)  # paired bootstrap resamples for the BLEU/chrF intervals
    max_bleu_drop: Limit = None  # reference BLEU − candidate BLEU, per language, points
    max_chrf_drop: Limit = None

    @field_validator(*QUALITY.fields, mode="before")
    @classmethod
    def _limits(cls, v: Any, info: ValidationInfo) -> Any:
        return check_limit(v, QUALITY.by_field(info.field_name))

    @model_validator(mode="after")
    def _stride_needs_sliding(self) -> "QualityGate":
        if self.stride is not None and self.windowing != "sliding":
            raise ValueError("stride applies to windowing: sliding only; remove it or set windowing: sliding")
        return sets_a_threshold(self, QUALITY)
