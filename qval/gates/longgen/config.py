"""Gate 3's config section (`gates.longgen`): the prompts, the generation's length and windows, and its limits,
each checked by its row of `LONGGEN` (`check_limit`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ...config_base import CountLimit, Limit, Sized, Strict, check_limit
from .metrics import LONGGEN


class LongGenGate(Strict):
    """Gate 3: 2048-token greedy generation; drift of the candidate on the reference's text
    and health of the candidate's own text, each judged against the reference's."""

    enabled: bool = True  # gate 3: long generation
    prompts: str = "calib_data/longgen_prompts.jsonl"  # JSONL of prompts both models continue greedily
    max_prompts: int | None = Field(None, gt=0)  # the first N prompts (None: all of the file)
    new_tokens: int = Field(2048, gt=0)  # tokens generated per prompt
    window: int = Field(256, gt=0)  # positions per window of the per-window series
    edge: int = Field(512, gt=0)  # "early" = first `edge` positions, "late" = last `edge`
    suppress_eos: bool = True  # EOS is never chosen, so every continuation runs new_tokens
    batch_size: int = Field(8, gt=0)  # prompts decoded together
    piece: int = Field(256, gt=0)  # teacher-forced scoring goes through the KV cache this many tokens at a time
    min_late_top1: Limit = None
    max_late_kld: Limit = None
    max_late_drift: Limit = None  # late mean KLD − early mean KLD
    max_seq_rep4_excess: Limit = None  # candidate late seq-rep-4 − reference late seq-rep-4
    max_judge_nll_excess: Limit = None  # reference NLL of the candidate's late text − of its own
    # prompts ending in a loop / stopped by EOS early, candidate − reference. Sized by default: strict
    # (0) when the reference never does it, tolerant of noise when it does (small models loop greedily)
    max_loops_excess: CountLimit = Field(default_factory=Sized)
    max_premature_eos_excess: CountLimit = Field(default_factory=Sized)  # only when suppress_eos is false

    @field_validator(*LONGGEN.fields, mode="before")
    @classmethod
    def _limits(cls, v: Any, info: ValidationInfo) -> Any:
        return check_limit(v, LONGGEN.by_field(info.field_name))

    @model_validator(mode="after")
    def _windows_fit(self) -> "LongGenGate":
        if self.window > self.new_tokens:
            raise ValueError(f"window ({self.window}) is longer than new_tokens ({self.new_tokens})")
        if 2 * self.edge > self.new_tokens:
            raise ValueError(f"edge ({self.edge}) is more than half of new_tokens ({self.new_tokens}): "
                             f"the early and late parts would overlap; use edge <= {self.new_tokens // 2}")
        return self
