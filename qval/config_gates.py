"""The gate sections of the config: one pydantic model per gate, and `GatesConfig` holding them.

Each section's threshold fields are the rows of its gate's table in `qval.gate_metrics`. Gates 2
and 3 validate each limit by its row (`_limit`: bounds, whole numbers, whether it may be sized);
the others declare the same bounds as pydantic constraints, held to the rows by
tests/test_gate_metrics.py. The "enabled but sets no threshold" check names the table's fields.
`Strict`, the base of every config section, lives here so that `qval.config` (which re-exports
every name) and this module share it without an import cycle.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .gate_metrics import AGREEMENT, DEPTH, LONGGEN, QUALITY, RETRIEVAL, GateMetrics, Metric


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class Sized(Strict):
    """A threshold sized from the reference's own noise: ref ± Φ⁻¹(α)·sqrt(2σ²/n), or, where `healthy`
    is given, healthy ± the same margin (a ratio: healthy × the margin's factor)."""

    sized: Literal[True] = True  # marks the limit as sized from the reference's own spread
    alpha: float = Field(0.05, gt=0, lt=0.5)  # one-sided level: how often a candidate at the reference's level (at `healthy`, where given) fails
    beta: float = Field(0.2, gt=0, lt=0.5)  # 1 − power at the smallest detectable effect printed beside the check
    #: the figure a healthy candidate of this format is expected to show, measured over healthy variants (a
    #: quantized model's greedy text is never the reference's mode, so its judge NLL excess is above 0): the
    #: limit is sized around it, so α is the false-reject rate there. Absent: the reference's own level.
    #: A number in the config, never from the candidate: a worse candidate cannot widen the limit
    healthy: float | None = None

    @field_validator("healthy", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number (the figure a healthy candidate is expected to show), not a boolean")
        return v


Limit = Union[float, Sized, None]


def _sets_a_threshold(section: Any, table: GateMetrics) -> Any:
    """The section, unless it is enabled and sets none of its table's limits (it could never fail)."""
    if section.enabled and all(getattr(section, f) is None for f in table.fields):
        *first, last = table.fields
        raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                         f"set {', '.join(first)} or {last}, or enabled: false")
    return section


# Thresholds of gates 2 and 3: an absolute limit (a number in the figure's own unit) or
# `{sized: true, alpha, beta, healthy}`, sized from the data the way DESIGN.md describes. They are checked
# by `_limit` before the union sees them, so a bad value gets one plain message, not one per branch.
CountLimit = Union[int, Sized, None]


def _limit(v: Any, m: Metric) -> Any:
    """Validate one threshold of row `m`: None, a number in [lo, hi] (whole for counts), or a
    sized spec where the row allows one."""
    if "sized" not in m.kinds and isinstance(v, (dict, Sized)):
        raise ValueError("cannot be sized: the only spread it could be sized from is the candidate's own, so a "
                         "worse (noisier) candidate would get a looser limit; give an absolute limit (the check "
                         "meets it with the figure's 95% interval bound, so noise makes it stricter, never looser)")
    if v is None:
        return v
    if isinstance(v, dict):
        unknown = sorted(set(v) - set(Sized.model_fields))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)} in a sized threshold; allowed: sized, alpha, beta, healthy")
        try:
            v = Sized.model_validate(v)
        except ValidationError as err:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())) from None
    if isinstance(v, Sized):
        h = v.healthy  # a boolean: Sized refuses it
        if h is not None and (not math.isfinite(h) or not _within(h, m)):
            raise ValueError(f"healthy must be a number in {_bounds(m)} (the figure a healthy candidate is expected to "
                             f"show; {m.lo:g} is the reference's own level), got {h!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("must be a number, or {sized: true} (optionally with alpha, beta and healthy)")
    if m.integer and v != int(v):
        raise ValueError("must be a whole number (it counts prompts)")
    if not _within(v, m):
        raise ValueError(f"must lie in {_bounds(m)}")
    return int(v) if m.integer else float(v)


def _within(v: float, m: Metric) -> bool:
    return v >= m.lo and (m.hi is None or v <= m.hi)


def _bounds(m: Metric) -> str:
    return f"[{m.lo:g}, {'∞' if m.hi is None else f'{m.hi:g}'}]"


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
        return _sets_a_threshold(self, AGREEMENT)


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
        return _limit(v, QUALITY.by_field(info.field_name))

    @model_validator(mode="after")
    def _stride_needs_sliding(self) -> "QualityGate":
        if self.stride is not None and self.windowing != "sliding":
            raise ValueError("stride applies to windowing: sliding only; remove it or set windowing: sliding")
        return _sets_a_threshold(self, QUALITY)


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
        return _limit(v, LONGGEN.by_field(info.field_name))

    @model_validator(mode="after")
    def _windows_fit(self) -> "LongGenGate":
        if self.window > self.new_tokens:
            raise ValueError(f"window ({self.window}) is longer than new_tokens ({self.new_tokens})")
        if 2 * self.edge > self.new_tokens:
            raise ValueError(f"edge ({self.edge}) is more than half of new_tokens ({self.new_tokens}): "
                             f"the early and late parts would overlap; use edge <= {self.new_tokens // 2}")
        return self


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
        return _sets_a_threshold(self, DEPTH)

    @property
    def edges(self) -> list[int]:
        """Bucket upper edges, the last one at ctx − 1 positions scored per chunk at most."""
        return list(self.buckets) if self.buckets else _depth_edges(self.ctx)


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
        return _sets_a_threshold(self, RETRIEVAL)


class TaskSuite(Strict):
    """One suite of gate 4: built in (generated deterministically from shipped prose), the user's
    golden JSONL, or an lm-evaluation-harness task by name (lm-eval's prompts, few-shot selection,
    filters and metrics, run on both models). Each suite is gated on its own: non-inferiority of
    the drop (accuracy, or the task's per-document score)."""

    builtin: Literal["cloze", "choice", "recall"] | None = None  # a built-in suite, generated from seed and size
    golden: str | None = None  # JSONL of {"id","prompt","answer","match","tolerance"} or {"id","prompt","choices","label"}
    lm_eval: str | None = Field(None, min_length=1)  # an lm-eval task name (the installed lm-eval's, or one under include_path)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # default: the builtin's or task's name, or the file's stem
    size: int = Field(40, gt=0)  # items a built-in suite generates (a golden suite keeps all of its file)
    dataset: str = "calib_data/heldout_eval.jsonl"  # prose the cloze/choice items are cut from (English records)
    max_new_tokens: int = Field(8, gt=0)  # tokens of a generated answer (recall, golden exact-answer items)
    # --- lm_eval suites only
    include_path: str | None = None  # a folder of the user's task YAMLs (relative: to the config file, as data paths)
    num_fewshot: int | None = Field(None, ge=0)  # None: the task's own (0 if it sets none), as lm-eval does
    limit: int | None = Field(None, gt=0)  # the task's first N documents (None: all)
    #: the per-document metric that marks an item, "acc" or "acc,none" (lm-eval's "metric,filter");
    #: None: acc if the task reports it, else exact_match, else its first metric; its first filter
    metric: str | None = Field(None, min_length=1)
    max_length: int | None = Field(None, ge=8)  # tokens of context (None: the model's positions, as lm-eval's HFLM)
    #: the task's prompts as a user turn of the tokenizer's chat template (lm-eval's --apply_chat_template, few-shot
    #: examples as turns, its default); None/false: lm-eval's default, raw prompts
    chat_template: bool | None = None
    #: non-inferiority margin on the drop (reference − candidate: a fraction of items for a right/wrong
    #: suite, the metric's own unit otherwise): its one-sided (1 − α) upper bound must not exceed it
    margin: float = Field(gt=0)
    max_flip_rate: Annotated[float, Field(gt=0, le=1)] | None = None  # met by the exact upper bound of the flip rate
    alpha: float = Field(0.05, gt=0, lt=0.5)  # one-sided level of the drop's upper bound
    beta: float = Field(0.2, gt=0, lt=0.5)  # for the smallest detectable drop printed beside the check
    #: accuracy of guessing; None: 1/choices for multiple choice, 0.05 for open answers. A suite whose
    #: reference is not clearly above it (Wilson lower bound) is uninformative
    chance: Annotated[float, Field(ge=0, lt=1)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "TaskSuite":
        given = [k for k in ("builtin", "golden", "lm_eval") if getattr(self, k) is not None]
        if len(given) != 1:
            also = f"; this suite gives {' and '.join(given)}" if given else ""
            raise ValueError("give exactly one of builtin (cloze, choice, recall), golden (a JSONL file) or lm_eval "
                             f"(an lm-evaluation-harness task name){also}")
        only_lm = sorted(k for k in ("include_path", "num_fewshot", "limit", "metric", "max_length", "chat_template")
                         if getattr(self, k) is not None)
        if self.lm_eval is None and only_lm:
            raise ValueError(f"{', '.join(only_lm)} apply to lm_eval suites only")
        not_lm = sorted(k for k in ("size", "dataset", "max_new_tokens") if k in self.model_fields_set)
        if self.lm_eval is not None and not_lm:
            raise ValueError(f"{', '.join(not_lm)} do not apply to an lm_eval suite: the task's own documents and "
                             "generation settings are used (limit: N takes its first N documents)")
        if self.builtin is not None or self.golden is not None:
            if self.margin > 1:
                raise ValueError(f"margin {self.margin} is an accuracy drop, a fraction: it must be at most 1")
        return self

    @property
    def label(self) -> str:
        return self.name or self.builtin or self.lm_eval or Path(str(self.golden)).stem


class TasksGate(Strict):
    """Gate 4: both models answer the same items, each marked right or wrong; per suite, paired
    non-inferiority of the accuracy drop, McNemar's exact p, flips with exact intervals."""

    enabled: bool = True  # gate 4: answers, item by item
    suites: list[TaskSuite] = Field(default_factory=list)  # each gated on its own
    piece: int = Field(1024, gt=0)  # teacher-forced items go through the KV cache this many tokens at a time
    batch_size: int = Field(8, gt=0)  # generated answers

    @model_validator(mode="after")
    def _suites(self) -> "TasksGate":
        labels = [s.label for s in self.suites]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"suite names must be distinct; {', '.join(dup)} appears twice (set name: on one)")
        if self.enabled and not self.suites:
            raise ValueError("gate is enabled but has no suites, so it could never fail; add suites "
                             "(e.g. - {builtin: choice, margin: 0.1}) or enabled: false")
        return self


class GatesConfig(Strict):
    agreement: AgreementGate = Field(default_factory=AgreementGate)
    quality: QualityGate = Field(default_factory=lambda: QualityGate(enabled=False))
    longgen: LongGenGate = Field(default_factory=lambda: LongGenGate(enabled=False))
    depth: DepthGate = Field(default_factory=lambda: DepthGate(enabled=False))
    retrieval: RetrievalGate = Field(default_factory=lambda: RetrievalGate(enabled=False))
    tasks: TasksGate = Field(default_factory=lambda: TasksGate(enabled=False))

    @model_validator(mode="after")
    def _quality_fits_agreement(self) -> "GatesConfig":
        q, a = self.quality, self.agreement
        if q.enabled and q.windowing == "chunks" and not a.enabled:
            raise ValueError("gates.quality with windowing: chunks scores gate 1's positions, but gates.agreement is "
                             "disabled; enable it, or set quality.windowing: sliding")
        if q.enabled and q.stride is not None and q.stride > a.ctx:
            raise ValueError(f"gates.quality.stride ({q.stride}) is longer than the window (gates.agreement.ctx = {a.ctx})")
        return self


