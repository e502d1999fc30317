"""Device and dtype policy: the device a model runs on (`pick_device`: auto is CUDA where torch sees one)
and the dtype it computes in there (`compute_dtype_for`: float32 on a CPU, whatever was asked), for the
reference and the candidate alike."""

from __future__ import annotations

import torch

from .errors import BackendUnavailable

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def pick_device(requested: str) -> str:
    if requested == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("model.device is 'cuda' but torch sees no CUDA device; use device: auto or cpu.")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def compute_dtype_for(requested: str, device: str) -> tuple[torch.dtype, list[str]]:
    """CPUs have no fast FP16 matmul and some FP16 kernels are missing there, so on CPU the
    reference and the candidate both compute in float32; the report records it."""
    if device == "cpu" and requested in ("float16", "bfloat16"):
        return torch.float32, [f"requested {requested}, computed in float32: this CPU has no fast {requested} kernels"]
    return _DTYPES[requested], []
