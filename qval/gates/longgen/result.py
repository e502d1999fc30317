"""Gate 3's typed details (long generation): how both models generated, the per-window series,
per-prompt figures, the loop rule that decides what the teacher-forced checks rest on, and the
reference's own spread that sizes its sized limits."""

from __future__ import annotations

from typing import Any

from ...results.base import Block, Details, Num
from ..agreement.result import KldAudit, KldBound, KldTopK


class LonggenWindow(Block):
    """One window of the continuation, averaged over the prompts that reach it (None: none does)."""

    start: int
    end: int
    top1: Num | None
    kld: Num | None
    ref_nll: Num | None
    cand_judge_nll: Num | None
    ref_seq_rep4: Num | None
    cand_seq_rep4: Num | None
    ref_distinct2: Num | None
    cand_distinct2: Num | None
    ref_loops: int
    cand_loops: int


class Prompt(Block):
    """One prompt: both continuations' lengths, where they first differ, early/late figures, loops, EOS."""

    id: str
    lang: str | None
    kind: str | None
    ref_tokens: int
    cand_tokens: int
    first_divergence: int | None
    early_kld: Num
    late_kld: Num
    early_top1: Num
    late_top1: Num
    ref_late_seq_rep4: Num | None
    cand_late_seq_rep4: Num | None
    ref_late_nll: Num
    cand_late_judge_nll: Num
    ref_loop_period: int | None
    cand_loop_period: int | None
    ref_eos_step: int | None
    cand_eos_step: int | None


class LoopRule(Block):
    """`judge.loop_rule`: the teacher-forced checks rest on the prompts whose reference
    continuation does not end in a loop when those are at least half; else they are uninformative."""

    looping_prompts: int
    natural_prompts: list[int]
    informative: bool
    why: str | None


class Sizing(Block):
    """The reference's own spread over prompts, which sizes gate 3's sized limits (gate_metrics' rules
    read it by key)."""

    prompts: int
    ref_late_seq_rep4_sigma: Num
    ref_late_nll_sigma: Num
    ref_loop_rate: Num
    ref_eos_rate: Num


class LonggenDetails(Details):
    """Gate 3: greedy continuations of both models, the candidate scoring the reference's through its KV cache."""

    prompts_file: str
    prompts: int
    rendering: str
    new_tokens: int
    suppress_eos: bool
    window: int
    edge: int
    piece: int
    #: the reference's generations: cached or generated in this run (the reference store's entry: reference.CachedGeneration.describe())
    reference_generation: dict[str, Any]
    candidate_generation_seconds: Num
    generated_side_by_side: bool
    shortfall: str | None = None
    teacher_forced_rows: int | None = None  # absent in reports written before it was recorded
    kld_bound: KldBound | None = None
    kld_topk: KldTopK | None = None
    kld_audit: KldAudit | None = None
    loop_span: int
    loop_max_period: int
    windows: list[LonggenWindow]
    per_prompt: list[Prompt]
    ref_loops: int
    cand_loops: int
    ref_eos_stops: int
    cand_eos_stops: int
    late_positions: int
    loop_rule: LoopRule | None = None  # absent in reports written before the rule
    sizing: Sizing


#: the gate's details type (`qval.results.TYPES`)
DETAILS = LonggenDetails
