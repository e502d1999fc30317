"""The typed gate config: one YAML file per candidate, validated before any model loads.

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error that
names the file, the key and the keys that are allowed. `load_config` is the only entry point.
The `gates:` section is `qval.config_gates.GatesConfig`; each gate's own section is its package's
`config.py` (`qval/gates/<name>/`), its limits the rows of its package's table (`metrics.py`).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from .config_base import CountLimit, Limit, Sized, Strict  # noqa: F401  (the gate sections' limits, importable here)
from .config_gates import GatesConfig
from .config_types import format_errors, mistyped, non_finite  # noqa: F401  (non_finite: importable from here as before)
from .config_served import served_location, served_reference_fits
from .backends import BACKENDS, ServedOptions, needs_calibration
from .errors import ConfigError
from .io import read_text_utf8
from .quantize.formats import FORMATS, FormatSpec, names_where

SCHEMA_VERSION = 1


#: the registered formats (`qval.quantize.formats`), in registration order: a format is added there only
QuantFormat = Enum("QuantFormat", [(s.name, s.name) for s in FORMATS.ordered()], type=str, module=__name__)


class KVCache(str, Enum):
    fp16 = "fp16"
    fp8 = "fp8"


class ModelConfig(Strict):
    """Where the reference model comes from. `source` picks one; its field says where."""

    source: Literal["default", "path", "hub", "gguf", "served"] = "default"
    path: str | None = None  # local HF folder
    hub: str | None = None  # hub id (needs network or a populated HF cache)
    gguf: str | None = None  # a .gguf file; transformers dequantizes it to float
    #: a reference that a server serves (`source: served`): its `url`, or `launch` (qval starts vLLM on a model folder),
    #: and the scoring options of backend served; its answers are top-K distributions (docs/engines.md)
    served: ServedOptions | None = None
    revision: str | None = None
    #: tokenizer folder/id when it differs from the model's; with `source: served`, a local folder with the model's
    #: config.json and tokenizer files (no weights), needed where `served` gives a url
    tokenizer: str | None = None
    dtype: Literal["float16", "bfloat16", "float32"] = "float16"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: CUDA: one GPU when the model fits it, else every visible GPU (accelerate device_map), else CPU
    #: offload as the last resort (auto); always one GPU (single); always every visible GPU (spread)
    placement: Literal["auto", "single", "spread"] = "auto"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_location(self) -> "ModelConfig":
        if self.source == "served" or self.served is not None:
            served_location(self)
            return self
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


#: the backends that build a KV-cache-only candidate (format none, kv_cache fp8): ModelOpt's fake-quantized K/V,
#: or a server that caches K/V in FP8 itself
KV_ONLY_BACKENDS = ("fakequant", "served")


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
    def kv_only(self) -> bool:
        """Format none with an FP8 KV cache: the weights stay as they are, K and V are quantized (calibrated)."""
        return not self.spec.quantizes and self.kv_cache is KVCache.fp8

    @property
    def has_quantizers(self) -> bool:
        """Whether the candidate has quantizers to calibrate: a weight format, or a KV-cache-only candidate."""
        return self.spec.quantizes or self.kv_only

    @property
    def alphas(self) -> list[float]:
        a = self.smoothquant_alpha
        return a if isinstance(a, list) else [0.5 if a is None else a]


class CalibrationConfig(Strict):
    dataset: str = "calib_data/general_mix.jsonl"
    samples: int = Field(512, gt=0)
    seq_len: int = Field(512, ge=16)
    batch_size: int | Literal["auto"] = "auto"
    #: which windows: None the first `samples` in order (qval.calibration), a number a seeded draw of them
    sample_seed: int | None = Field(None, ge=0)

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


class SnapshotConfig(Strict):
    """The reference snapshot (qval/snapshot): what the gates need from the reference, computed
    once, stored content-addressed under <report dir>/.reference/snapshot/ and reused by every
    candidate. Per position it keeps the true-token log-probability and the argmax exactly and the
    `topk` largest log-probabilities with the tail mass (KLD from them plus the lumped tail, with
    its upper bound reported); `topk: exact` keeps every log-probability (small vocabularies only:
    4 bytes × vocabulary per position)."""

    enabled: bool = True  # false: both models in memory, figures from the full reference logits
    topk: Annotated[int, Field(gt=0)] | Literal["exact"] = 128  # benchmarks/snapshot_k.py: KLD within 0.5 % (mean and p99)
    #: while the reference's logits are computed (a snapshot being filled), also compute the KLD
    #: from them in full and report how far the snapshot's figure is from it
    audit: bool = True
    #: one model in memory at a time (peak memory max(reference, candidate), not their sum): the
    #: reference fills the snapshot and leaves, calibration and the candidate take fresh loads of its
    #: weights without a copy, the gates read the reference from the snapshot alone, and the reference
    #: returns at the end for what needs the candidate's output (gate 3's judge). Costs reloads of the
    #: reference (up to four); lm-eval suites cannot run this way
    sequential: bool = False

    @field_validator("topk", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("topk is a number of log-probabilities kept per position, or 'exact'")
        return v

    @property
    def k(self) -> int | None:
        return None if self.topk == "exact" else int(self.topk)


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
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
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
        if self.snapshot.sequential and not self.snapshot.enabled:
            raise ValueError("snapshot.sequential needs the snapshot (snapshot.enabled: true): the gates read the "
                             "reference from it while the candidate is in memory")
        if self.snapshot.sequential and self.gates.tasks.enabled and any(s.lm_eval for s in self.gates.tasks.suites):
            raise ValueError("snapshot.sequential cannot run lm-eval suites (gates.tasks.suites[].lm_eval): lm-eval "
                             "scores both models side by side; set snapshot.sequential: false or drop those suites")
        if self.quant.kv_only and self.engine.backend not in KV_ONLY_BACKENDS:
            raise ValueError(f"quant.kv_cache: fp8 with quant.format: none (a KV-cache-only candidate) runs on engine.backend "
                             f"{' or '.join(KV_ONLY_BACKENDS)}, not {self.engine.backend}: that backend builds its candidate "
                             "from quantized weights, so it would gate the reference itself as an FP8 KV cache; choose a "
                             "quant.format, or one of those backends")
        if self.model.source == "served":
            served_reference_fits(self)
        launch = (self.engine.options.get("launch") or {}) if self.engine.backend == "served" else {}
        if self.quant.kv_only and isinstance(launch, dict) and launch.get("model") == "candidate":
            raise ValueError("engine.options.launch.model: candidate serves this config's candidate as qval exports it, and a "
                             "KV-cache-only candidate (quant.format none, kv_cache fp8) has no quantized weights to export; "
                             "serve model: reference with kv_cache_dtype fp8 (the server quantizes K/V), or give a quant.format")
        if isinstance(launch, dict) and launch:  # the server's KV cache is the candidate's: the report must say which
            fp8 = str(launch.get("kv_cache_dtype", "auto")).startswith("fp8")
            if fp8 != (self.quant.kv_cache == KVCache.fp8):
                raise ValueError(f"quant.kv_cache is {self.quant.kv_cache.value} but the server qval starts caches K/V in "
                                 f"{launch.get('kv_cache_dtype', 'auto')} (engine.options.launch.kv_cache_dtype); set "
                                 f"quant.kv_cache: {'fp8' if fp8 else 'fp16'}, which the report states")
        return self

    @property
    def calibrates(self) -> bool:
        """Whether a run calibrates: a candidate with quantizers (quant.has_quantizers) on a backend that builds from
        qval's calibration (not a finished checkpoint, not a server's own model)."""
        return self.quant.has_quantizers and needs_calibration(self.engine.backend, self.engine.options)

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


def parse_config(data: Any, file: str = "<config>") -> GateConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the config must be a YAML mapping (key: value), not {type(data).__name__}.")
    bad = non_finite(data) + mistyped(data, GateConfig)  # pydantic would read `true` as 1, 'yes' as true
    if bad:
        raise ConfigError("\n".join(f"{file}: {line}." for line in bad))
    try:
        return GateConfig.model_validate({**data, "source_file": file})
    except ValidationError as err:
        raise ConfigError("\n".join(format_errors(err, file, GateConfig))) from None


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
