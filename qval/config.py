"""The typed gate config: one YAML file per candidate, validated before any model loads.

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error that
names the file, the key and the keys that are allowed. `load_config` is the only entry point.
"""

from __future__ import annotations

import difflib
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .engines.registry import BACKENDS
from .errors import ConfigError
from .io import read_text_utf8
from .quantize.formats import FORMATS, FormatSpec, names_where

SCHEMA_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


#: the registered formats (`qval.quantize.formats`), in registration order: a format is added there only
QuantFormat = Enum("QuantFormat", [(s.name, s.name) for s in FORMATS.ordered()], type=str, module=__name__)


class KVCache(str, Enum):
    fp16 = "fp16"
    fp8 = "fp8"


class ModelConfig(Strict):
    """Where the reference model comes from. `source` picks one; its field says where."""

    source: Literal["default", "path", "hub", "gguf"] = "default"
    path: str | None = None  # local HF folder
    hub: str | None = None  # hub id (needs network or a populated HF cache)
    gguf: str | None = None  # a .gguf file; transformers dequantizes it to float
    revision: str | None = None
    tokenizer: str | None = None  # tokenizer folder/id when it differs from the model's
    dtype: Literal["float16", "bfloat16", "float32"] = "float16"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_location(self) -> "ModelConfig":
        given = {k for k in ("path", "hub", "gguf") if getattr(self, k)}
        if self.source == "default":
            if given:
                raise ValueError(
                    f"source is 'default' but {', '.join(sorted(given))} is set; "
                    f"set source: {sorted(given)[0]} to use it"
                )
        elif self.source not in given:
            raise ValueError(f"source is {self.source!r} but no {self.source}: value is given")
        elif len(given) > 1:
            raise ValueError(f"give exactly one of path/hub/gguf, not {', '.join(sorted(given))}")
        return self


class QuantConfig(Strict):
    format: QuantFormat
    kv_cache: KVCache = KVCache.fp16
    exclude: list[str] = Field(default_factory=lambda: ["*lm_head*"])
    smoothquant_alpha: float | list[float] | None = None
    awq_block_size: int = Field(128, gt=0)

    @field_validator("smoothquant_alpha")
    @classmethod
    def _alpha_range(cls, v: float | list[float] | None) -> float | list[float] | None:
        values = v if isinstance(v, list) else ([] if v is None else [v])
        if isinstance(v, list) and not v:
            raise ValueError("an empty list of alphas sweeps nothing; give one or more values in [0, 1]")
        for a in values:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"alpha {a} is outside [0, 1]")
        return v

    @model_validator(mode="after")
    def _alpha_only_for_sq(self) -> "QuantConfig":
        if self.smoothquant_alpha is not None and not self.spec.takes_smoothquant_alpha:
            takes = " or ".join(names_where(lambda s: s.takes_smoothquant_alpha))
            raise ValueError(f"smoothquant_alpha applies to format {takes} only, not {self.format.value}")
        return self

    @property
    def spec(self) -> FormatSpec:
        """What the format is and can do: everything that depends on the format asks this."""
        return FORMATS.get(self.format.value)

    @property
    def alphas(self) -> list[float]:
        a = self.smoothquant_alpha
        return a if isinstance(a, list) else [0.5 if a is None else a]


class CalibrationConfig(Strict):
    dataset: str = "calib_data/general_mix.jsonl"
    samples: int = Field(512, gt=0)
    seq_len: int = Field(512, ge=16)
    batch_size: int | Literal["auto"] = "auto"

    @field_validator("batch_size")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v <= 0:
            raise ValueError("batch_size must be a positive integer or 'auto'")
        return v


class EngineConfig(Strict):
    backend: str = "fakequant"
    path: str | None = None  # backend 'checkpoint': the candidate's folder
    batch_size: int = Field(4, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)  # typed per backend (its declared `options_model`)

    @field_validator("backend")
    @classmethod
    def _backend_known(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(BACKENDS.unknown_message(v).rstrip("."))  # the error line ends with its own period
        return v

    @model_validator(mode="after")
    def _options_fit(self) -> "EngineConfig":
        options_model = BACKENDS.get(self.backend).options_model
        if options_model is None:
            if self.options:
                raise ValueError(f"engine backend {self.backend!r} takes no options; remove engine.options")
            return self
        try:
            options_model.model_validate(self.options)
        except ValidationError as err:
            problems = "; ".join(f"options.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ValueError(f"{problems} (allowed options for {self.backend}: {', '.join(options_model.model_fields)})") from None
        return self


class Sized(Strict):
    """A threshold sized from the reference's own noise: ref ± Φ⁻¹(α)·sqrt(2σ²/n)."""

    sized: Literal[True] = True
    alpha: float = Field(0.05, gt=0, lt=0.5)
    beta: float = Field(0.2, gt=0, lt=0.5)


Threshold = Union[float, Sized, None]


class AgreementGate(Strict):
    enabled: bool = True
    dataset: str = "calib_data/heldout_eval.jsonl"
    tokens: int = Field(65536, gt=0)
    ctx: int = Field(512, ge=8)
    batch_size: int = Field(4, gt=0)
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
        if self.enabled and self.min_top1 is None and self.max_mean_kld is None and self.max_p99_kld is None:
            raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                             "set min_top1, max_mean_kld or max_p99_kld, or enabled: false")
        return self


# Thresholds of gates 2 and 3: an absolute limit (a number in the figure's own unit) or
# `{sized: true, alpha, beta}`, sized from the data the way DESIGN.md describes. They are checked
# by `_limit` before the union sees them, so a bad value gets one plain message, not one per branch.
CountLimit = Union[int, Sized, None]


def _limit(v: Any, *, lo: float = 0.0, hi: float | None = None, integer: bool = False) -> Any:
    """Validate one threshold: None, a number in [lo, hi] (whole for counts), or a sized spec."""
    if v is None or isinstance(v, Sized):
        return v
    if isinstance(v, dict):
        unknown = sorted(set(v) - set(Sized.model_fields))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)} in a sized threshold; allowed: sized, alpha, beta")
        try:
            return Sized.model_validate(v)
        except ValidationError as err:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("must be a number, or {sized: true} (optionally with alpha and beta)")
    if integer and v != int(v):
        raise ValueError("must be a whole number (it counts prompts)")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"must lie in [{lo:g}, {'∞' if hi is None else f'{hi:g}'}]")
    return int(v) if integer else float(v)


class QualityGate(Strict):
    """Gate 2: perplexity over gate 1's scored positions (windowing "chunks") or HF-style
    sliding windows over the same text ("sliding"), and BLEU/chrF of greedy generations."""

    enabled: bool = True
    windowing: Literal["chunks", "sliding"] = "chunks"
    stride: int | None = Field(None, gt=0)  # sliding: tokens scored per window (default ctx/2)
    max_ppl_ratio: Threshold = None  # PPL_cand / PPL_ref
    bleu_dataset: str = "calib_data/bleu_eval.jsonl"
    bleu_max_new_tokens: int = Field(64, gt=0)
    batch_size: int = Field(8, gt=0)
    bootstrap: int = Field(1000, ge=100)  # paired bootstrap resamples for the BLEU/chrF intervals
    max_bleu_drop: Threshold = None  # reference BLEU − candidate BLEU, per language, points
    max_chrf_drop: Threshold = None

    @field_validator("max_ppl_ratio", mode="before")
    @classmethod
    def _ratio_limit(cls, v: Any) -> Any:
        return _limit(v, lo=1.0)  # a limit below 1 would demand a candidate better than the reference

    @field_validator("max_bleu_drop", "max_chrf_drop", mode="before")
    @classmethod
    def _drop_limit(cls, v: Any) -> Any:
        return _limit(v, hi=100.0)

    @model_validator(mode="after")
    def _stride_needs_sliding(self) -> "QualityGate":
        if self.stride is not None and self.windowing != "sliding":
            raise ValueError("stride applies to windowing: sliding only; remove it or set windowing: sliding")
        if self.enabled and self.max_ppl_ratio is None and self.max_bleu_drop is None and self.max_chrf_drop is None:
            raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                             "set max_ppl_ratio, max_bleu_drop or max_chrf_drop, or enabled: false")
        return self


class LongGenGate(Strict):
    """Gate 3: 2048-token greedy generation; drift of the candidate on the reference's text
    and health of the candidate's own text, each judged against the reference's."""

    enabled: bool = True
    prompts: str = "calib_data/longgen_prompts.jsonl"
    max_prompts: int | None = Field(None, gt=0)
    new_tokens: int = Field(2048, gt=0)
    window: int = Field(256, gt=0)
    edge: int = Field(512, gt=0)  # "early" = first `edge` positions, "late" = last `edge`
    suppress_eos: bool = True
    batch_size: int = Field(8, gt=0)
    piece: int = Field(256, gt=0)  # teacher-forced scoring goes through the KV cache this many tokens at a time
    min_late_top1: Threshold = None
    max_late_kld: Threshold = None
    max_late_drift: Threshold = None  # late mean KLD − early mean KLD
    max_seq_rep4_excess: Threshold = None  # candidate late seq-rep-4 − reference late seq-rep-4
    max_judge_nll_excess: Threshold = None  # reference NLL of the candidate's late text − of its own
    # prompts ending in a loop / stopped by EOS early, candidate − reference. Sized by default: strict
    # (0) when the reference never does it, tolerant of noise when it does (small models loop greedily)
    max_loops_excess: CountLimit = Field(default_factory=Sized)
    max_premature_eos_excess: CountLimit = Field(default_factory=Sized)  # only when suppress_eos is false

    @field_validator("min_late_top1", "max_late_kld", "max_late_drift", mode="before")
    @classmethod
    def _against_reference(cls, v: Any, info: Any) -> Any:
        # these compare the candidate with the reference (or with its own early positions): the
        # only spread to size them from is the candidate's own, so a noisier candidate would get a
        # looser limit. They take an absolute limit, met by the one-sided bound of the figure.
        if isinstance(v, dict) or isinstance(v, Sized):
            raise ValueError("cannot be sized: the only spread it could be sized from is the candidate's own, so a "
                             "worse (noisier) candidate would get a looser limit; give an absolute limit (the check "
                             "meets it with the figure's 95% interval bound, so noise makes it stricter, never looser)")
        return _limit(v, hi=1.0 if info.field_name == "min_late_top1" else None)

    @field_validator("max_seq_rep4_excess", mode="before")
    @classmethod
    def _fraction_limit(cls, v: Any) -> Any:
        return _limit(v, hi=1.0)

    @field_validator("max_judge_nll_excess", mode="before")
    @classmethod
    def _nonneg_limit(cls, v: Any) -> Any:
        return _limit(v)

    @field_validator("max_loops_excess", "max_premature_eos_excess", mode="before")
    @classmethod
    def _count_limit(cls, v: Any) -> Any:
        return _limit(v, integer=True)

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

    enabled: bool = True
    dataset: str = "calib_data/longctx_docs.jsonl"
    ctx: int = Field(2048, ge=64)
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
        if self.enabled and self.min_top1 is None and self.max_mean_kld is None and self.max_p99_kld is None:
            raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                             "set min_top1, max_mean_kld or max_p99_kld, or enabled: false")
        return self

    @property
    def edges(self) -> list[int]:
        """Bucket upper edges, the last one at ctx − 1 positions scored per chunk at most."""
        return list(self.buckets) if self.buckets else _depth_edges(self.ctx)


class RetrievalGate(Strict):
    """The retrieval matrix: haystacks of shipped prose, a needle with a random pass code at a
    depth, the question after the haystack; both models answer greedily (exact match), paired
    per trial. Non-inferiority per context length and overall; a length the reference cannot
    solve is reported uninformative, never passed silently."""

    enabled: bool = True
    haystack: str = "calib_data/longctx_docs.jsonl"
    lengths: list[int] = Field(default_factory=lambda: [512, 1024, 2048])  # prompt tokens, approximately
    depths: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # needle position, fraction of the haystack
    trials: int = Field(2, gt=0)  # per cell, each with its own key and haystack offset
    #: non-inferiority margins on the accuracy drop (reference − candidate, a fraction): per length, and pooled
    margin: Annotated[float, Field(gt=0, le=1)] | None = None
    margin_overall: Annotated[float, Field(gt=0, le=1)] | None = None
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
        if self.enabled and self.margin is None and self.margin_overall is None and self.max_answer_kld is None:
            raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                             "set margin, margin_overall or max_answer_kld, or enabled: false")
        return self


class TaskSuite(Strict):
    """One suite of gate 4: built in (generated deterministically from shipped prose), the user's
    golden JSONL, or an lm-evaluation-harness task by name (lm-eval's prompts, few-shot selection,
    filters and metrics, run on both models). Each suite is gated on its own: non-inferiority of
    the drop (accuracy, or the task's per-document score)."""

    builtin: Literal["cloze", "choice", "recall"] | None = None
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
    alpha: float = Field(0.05, gt=0, lt=0.5)
    beta: float = Field(0.2, gt=0, lt=0.5)
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

    enabled: bool = True
    suites: list[TaskSuite] = Field(default_factory=list)
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


class ReportConfig(Strict):
    dir: str = "reports"


class DiagnosticsConfig(Strict):
    """Per-layer scale diagnostics (every gate report) and the sensitivity ranking."""

    enabled: bool = True
    batches: int = Field(2, gt=0)  # calibration batches the activation hooks see
    #: auto: rank sensitivity only when the candidate is rejected (or for diagnose / fallback)
    sensitivity: Literal["auto", "always", "never"] = "auto"
    #: chunks of gates.agreement.dataset (ctx gates.agreement.ctx) scored once per layer and per
    #: projection type: 1 chunk of 512 is 255 positions, enough to rank, and ~40 forwards in all
    slice_chunks: int = Field(1, gt=0)
    slice_ctx: int | None = Field(None, ge=8)  # None: gates.agreement.ctx (half of each chunk is scored)


class FallbackConfig(Strict):
    """`--fallback auto`: keep the most sensitive layers in high precision until every gate passes."""

    mode: Literal["off", "auto"] = "off"
    max_excluded: int = Field(4, ge=1)  # parts (decoder layers or projection types) the search may add to quant.exclude
    max_effective_bits: float | None = Field(None, gt=0)  # weight bits per parameter, over all linear layers


class GateConfig(Strict):
    """A whole candidate: what to quantize, how to build it, and what it must pass."""

    schema_version: int = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: ModelConfig = Field(default_factory=ModelConfig)
    quant: QuantConfig
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gates: GatesConfig = Field(default_factory=GatesConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)
    seed: int = 0
    #: the largest fraction of a data budget (calibration samples, gate tokens, prompts) that may be
    #: missing: less data is a note beside the verdict, more missing is an error (exit 2)
    max_shortfall: float = Field(0.5, ge=0.0, le=1.0)
    #: folder the config file lives in; relative dataset paths resolve against it first
    source_file: str | None = Field(None, exclude=True)

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is not supported; this qval reads {SCHEMA_VERSION}")
        return v

    @model_validator(mode="after")
    def _engine_known(self) -> "GateConfig":
        if self.engine.backend == "checkpoint" and not self.engine.path:
            raise ValueError("engine backend 'checkpoint' needs engine.path: the candidate's folder")
        return self

    def resolve(self, path: str) -> Path:
        """A data path from the config: absolute, else relative to the working directory if it
        exists there, else relative to the config file's folder, else the qval checkout."""
        p = Path(path)
        if p.is_absolute() or p.exists():
            return p
        candidates = []
        if self.source_file:
            candidates.append(Path(self.source_file).parent / p)
            candidates.append(Path(self.source_file).parent.parent / p)
        candidates.append(Path(__file__).resolve().parent.parent / p)
        for c in candidates:
            if c.exists():
                return c
        return p


def _loc_to_key(loc: tuple[Any, ...]) -> str:
    # pydantic puts the union member's type name in loc ("float", "Sized"); drop those
    parts = [str(x) for x in loc if not (isinstance(x, str) and x[:1].isupper()) and x not in ("float", "int")]
    return ".".join(parts) or "(top level)"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at the parent of `loc`, walking the nested models."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list of models (gates.tasks.suites.0)
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        if not isinstance(ann, type):  # list[Model]: the keys of its items
            ann = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if current is None:
            return []
    return [k for k in current.model_fields if k != "source_file"]


def format_errors(err: ValidationError, file: str) -> list[str]:
    """One line per problem: file, key, bad value, what is allowed."""
    lines = []
    for e in err.errors():
        key = _loc_to_key(e["loc"])
        bad = e.get("input")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(GateConfig, e["loc"])
            close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"{file}: unknown key {key!r}.{hint} Allowed here: {', '.join(allowed)}.")
            continue
        if e["type"] == "missing":
            lines.append(f"{file}: {key}: required key is missing.")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "enum":
            msg = f"must be one of {e['ctx']['expected']}"
        shown = repr(bad) if not isinstance(bad, dict) else "{...}"
        lines.append(f"{file}: {key} = {shown}: {msg}.")
    # unions report each branch; keep each distinct line once
    return list(dict.fromkeys(lines))


def non_finite(data: Any, where: str = "") -> list[str]:
    """One line per NaN or ±inf anywhere in the config: no setting takes one, and a threshold
    that is one cannot decide (NaN compares false with everything) or cannot fail (+inf on a
    max_, −inf on a min_).

    >>> non_finite({"gates": {"agreement": {"max_mean_kld": float("inf"), "min_top1": 0.9}}})
    ['gates.agreement.max_mean_kld = inf: a limit that can never fail; give a finite number']
    """
    if isinstance(data, dict):
        return [line for k, v in data.items() for line in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, list):
        return [line for i, v in enumerate(data) for line in non_finite(v, f"{where}[{i}]")]
    if not isinstance(data, float) or math.isfinite(data):
        return []
    leaf = where.rsplit(".", 1)[-1]
    if math.isnan(data):
        why = "NaN is not a limit: every comparison with it is false, so the check could never decide"
    elif leaf.startswith(("max_", "min_")):
        never_fails = (data > 0) == leaf.startswith("max_")
        why = "a limit that can never fail" if never_fails else "a limit that no candidate can ever pass"
    else:
        why = "must be a finite number"
    return [f"{where} = {data}: {why}; give a finite number"]


def parse_config(data: Any, file: str = "<config>") -> GateConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the config must be a YAML mapping (key: value), not {type(data).__name__}.")
    bad = non_finite(data)
    if bad:
        raise ConfigError("\n".join(f"{file}: {line}." for line in bad))
    try:
        return GateConfig.model_validate({**data, "source_file": file})
    except ValidationError as err:
        raise ConfigError("\n".join(format_errors(err, file))) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that remembers every key given twice in one mapping (plain YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, tuple[int, int]] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` keys may be overridden; only keys written twice are errors
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue
            at = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                first = seen[key]
                where = (f"line {first[0]} and line {at[0]}" if first[0] != at[0]
                         else f"line {at[0]} (columns {first[1]} and {at[1]})")
                self.duplicates.append(f"key {key!r} is given twice, on {where}; keep one")
            seen.setdefault(key, at)
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> Any:
    """The YAML of a config: UTF-8, valid, and no key given twice in one mapping."""
    text = read_text_utf8(path, ConfigError)
    loader = _UniqueKeyLoader(text)
    loader.duplicates = []  # type: ignore[attr-defined]
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    finally:
        loader.dispose()
    if loader.duplicates:  # type: ignore[attr-defined]
        raise ConfigError("\n".join(f"{path}: {d}." for d in loader.duplicates))  # type: ignore[attr-defined]
    return data


def load_config(path: str | Path) -> GateConfig:
    """Read and validate one YAML config; every problem in it is reported at once."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a folder, not a config file; give a YAML file (e.g. checks/fp8_kvfp16.yaml).")
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file. Shipped configs live in checks/ (e.g. checks/fp8_kvfp16.yaml).")
    data = load_yaml(p)
    if isinstance(data, dict) and "source_file" in data:
        raise ConfigError(f"{p}: 'source_file' is set by qval, not by the config; remove it.")
    return parse_config(data, str(p))
