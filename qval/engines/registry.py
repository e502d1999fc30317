"""The engine backends by name: what each one accepts and declares, as data.

This is what a config is validated against (`engine.backend`, `engine.options`), and what the
stages ask before any engine is built (does the backend calibrate?). It imports no engine
implementation: the builders live in their own modules and are looked up by name in
`qval.engines.builders`, which checks that it has a builder for every name declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..registry import Registry


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


class RealQuantOptions(BaseModel):
    """`engine.options` of realquant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: on a CPU: "emulate" (dequantize the stored FP8 weights, float GEMM) or "scaled_mm"
    #: (torch._scaled_mm with FP8 operands: the GPU's data path, but slow on a CPU)
    cpu_fp8_gemm: Literal["emulate", "scaled_mm"] = "emulate"


@dataclass(frozen=True)
class Backend:
    name: str
    #: the pydantic model of its `engine.options` (None: it takes no options)
    options_model: type[BaseModel] | None = None
    #: False for backends that gate a finished checkpoint: no calibrate stage
    needs_calibration: bool = True


BACKENDS: Registry[Backend] = Registry("engine backend")

for _backend in (
    Backend("fakequant"),
    Backend("realquant", options_model=RealQuantOptions),
    Backend("export", options_model=ExportOptions),
    Backend("tensorrt_llm", options_model=TensorRTLLMOptions),
    Backend("checkpoint", needs_calibration=False),
):
    BACKENDS.register(_backend.name)(_backend)
del _backend


def needs_calibration(backend: str) -> bool:
    """False for backends that gate a finished checkpoint (declared `needs_calibration=False`)."""
    return BACKENDS.get(backend).needs_calibration
