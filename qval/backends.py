"""The engine backends by name: what each one accepts and declares, as data (config layer, torch-free).

This is what a config is validated against (`engine.backend`, `engine.options`), and what the
stages ask before any engine is built (does the backend calibrate?). It sits beside the config and
imports no engine: the builders live in their own modules and are looked up by name in
`qval.engines.builders`, which checks that it has a builder for every name declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .registry import Registry


class ExportOptions(BaseModel):
    """`engine.options` of the export-based backends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: dtype of high-precision tensors and scales; auto = the dtype the reference computes in
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    trtllm_checkpoint: bool = False  # also write ModelOpt's TensorRT-LLM checkpoint
    tp_size: int = Field(1, ge=1)  # tensor parallelism of the TensorRT-LLM checkpoint / engine


class TensorRTLLMOptions(ExportOptions):
    free_gpu_memory_fraction: float = Field(0.7, gt=0, le=1)  # of the memory left after weights, for the KV cache
    max_batch_size: int | None = Field(None, gt=0)  # the LLM API's max_batch_size (None: its default)


class RuntimeOptions(BaseModel):
    """`engine.options` of every in-process backend: which code runs the candidate's model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: "qval": qval's decode runtime (qval/engines/runtime.py: its attention, KV cache, lean FP8 forward and, on
    #: a GPU, the static CUDA-graph decoder; a CPU's figures are transformers' bit for bit); "transformers":
    #: transformers' and ModelOpt's own code only
    runtime: Literal["qval", "transformers"] = "qval"


class ExportEngineOptions(RuntimeOptions, ExportOptions):
    """`engine.options` of export: the export's, and the runtime of the read-back model."""


class RealQuantOptions(RuntimeOptions):
    """`engine.options` of realquant."""

    #: on a CPU: "emulate" (dequantize the stored FP8 weights, float GEMM) or "scaled_mm"
    #: (torch._scaled_mm with FP8 operands: the GPU's data path, but slow on a CPU)
    cpu_fp8_gemm: Literal["emulate", "scaled_mm"] = "emulate"


#: `launch.model` values that are not paths: the reference written as a model folder, or this config's
#: calibrated candidate exported (ModelOpt's unified checkpoint, as `qval build` writes it)
MODEL_SOURCES = ("reference", "candidate")


class LaunchOptions(BaseModel):
    """How qval starts a vLLM server (`engine.options.launch`, `model.served.launch`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the Python of vLLM's own environment (it runs `-m vllm.entrypoints.openai.api_server`);
    #: unset: $QVAL_VLLM_PYTHON. A relative path is taken from the working directory, then the config's folder
    python: str | None = None
    #: a whole command instead of `python -m vllm.entrypoints.openai.api_server` (qval appends its arguments)
    command: list[str] | None = None
    #: what it serves: a model folder, "reference" (the reference model written as a folder) or
    #: "candidate" (this config's calibrated candidate exported as ModelOpt's unified checkpoint)
    model: str = "reference"
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"  # vLLM's --dtype
    kv_cache_dtype: str = Field("auto", min_length=1)  # vLLM's --kv-cache-dtype: auto, fp8, fp8_e4m3, fp8_e5m2
    quantization: str | None = None  # vLLM's --quantization (unset: what the checkpoint declares)
    tensor_parallel_size: int = Field(1, ge=1)  # vLLM's --tensor-parallel-size
    max_model_len: int | None = Field(None, gt=0)  # vLLM's --max-model-len
    #: API front-end processes (vLLM's --api-server-count, through `vllm serve`): each turns the engine's prompt
    #: log-probabilities into JSON, which bounds served scoring on a GPU (docs/engines.md, "Speed")
    api_servers: int = Field(1, ge=1, le=64)
    args: list[str] = Field(default_factory=list)  # more arguments, as given (e.g. ["--enforce-eager"])
    env: dict[str, str] = Field(default_factory=dict)  # environment variables for the server
    port: int | None = Field(None, ge=1, le=65535)  # unset: a free port
    startup_timeout_s: float = Field(900.0, gt=0)  # from start to a healthy server

    @model_validator(mode="after")
    def _one_runner(self) -> "LaunchOptions":
        if self.python is not None and self.command is not None:
            raise ValueError("give launch.python or launch.command, not both")
        if self.command is not None and not self.command:
            raise ValueError("launch.command is empty; give the command that starts the server, or remove it")
        if any(a == "--api-server-count" or a.startswith("--api-server-count=") for a in self.args):
            raise ValueError("launch.args sets --api-server-count; set launch.api_servers instead (qval then starts "
                             "`vllm serve`, the entry point that runs several API front ends)")
        return self


class ServedOptions(BaseModel):
    """A server's options: `engine.options` of backend `served` (the candidate), and `model.served` (a served
    reference: `model.source: served`; its `launch.model` is a model folder, and `model.tokenizer` a local folder with the
    model's config.json and tokenizer, which may default to that folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None  # a running server's base URL (http://host:port), without /v1
    launch: LaunchOptions | None = None  # or qval starts one
    #: the served model's name in the API (unset: the one model the server lists)
    model: str | None = None
    api_key_env: str | None = None  # the environment variable holding the API key (never the key itself)
    #: log-probabilities per prompt position (the top K); at most the server's limit (vLLM's --max-logprobs)
    top_k: int = Field(20, ge=1, le=4096)
    concurrency: int = Field(4, ge=1)  # requests in flight at once
    timeout_s: float = Field(900.0, gt=0)  # one request
    retries: int = Field(3, ge=0)  # after a failed connection or a 5xx/429 answer, with backoff

    @model_validator(mode="after")
    def _one_server(self) -> "ServedOptions":
        if (self.url is None) == (self.launch is None):
            raise ValueError("give url (a running server) or launch (qval starts one), exactly one of them")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        return self


def serves_candidate(options: dict) -> bool:
    """Whether a served config needs this config's calibrated candidate (launch.model: candidate)."""
    launch = options.get("launch") or {}
    return isinstance(launch, dict) and launch.get("model") == "candidate"


@dataclass(frozen=True)
class Backend:
    name: str
    #: the pydantic model of its `engine.options` (None: it takes no options)
    options_model: type[BaseModel] | None = None
    #: False for backends that gate a finished checkpoint: no calibrate stage (or a function of
    #: `engine.options`, for a backend that calibrates for some settings only)
    needs_calibration: bool | Callable[[dict], bool] = True


BACKENDS: Registry[Backend] = Registry("engine backend")

for _backend in (
    Backend("fakequant", options_model=RuntimeOptions),
    Backend("realquant", options_model=RealQuantOptions),
    Backend("export", options_model=ExportEngineOptions),
    Backend("tensorrt_llm", options_model=TensorRTLLMOptions),
    Backend("checkpoint", options_model=RuntimeOptions, needs_calibration=False),
    Backend("served", options_model=ServedOptions, needs_calibration=serves_candidate),
):
    BACKENDS.register(_backend.name)(_backend)
del _backend


def needs_calibration(backend: str, options: dict | None = None) -> bool:
    """False for backends that gate a finished checkpoint (declared `needs_calibration=False`), or
    for these `engine.options` of a backend that calibrates for some settings only."""
    needs = BACKENDS.get(backend).needs_calibration
    return needs(options or {}) if callable(needs) else needs
