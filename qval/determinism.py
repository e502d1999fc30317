"""Reproducible figures on a GPU: the same config and seed give the same numbers on the same GPU
and software.

On a CPU qval's runs are already byte-identical, and nothing here touches a CPU run: `configure`
does nothing unless the models compute on CUDA. There it fixes, once per process and before any
model is loaded (qval.models.load_model calls it), what torch leaves to chance:

- `CUBLAS_WORKSPACE_CONFIG=:4096:8`: cuBLAS chooses its kernels, and so their rounding, partly
  from the workspace it finds; a fixed workspace per stream makes the choice the same every run.
  cuBLAS reads it when its first handle is made, so it must be set before the first product.
- `torch.use_deterministic_algorithms(True, warn_only=True)`: torch's deterministic
  implementation wherever an op has two; an op with none warns instead of stopping a gate.
  Not its filling of every new tensor with NaN (`fill_uninitialized_memory`): that guards code
  that reads memory it never wrote, which qval's own decoder does not, and costs a kernel per
  allocation in every decode step.
- cuDNN: deterministic algorithms, no autotuning by timing (`benchmark`), no TF32; matmuls in
  full float32 (no TF32) too.
- attention: the backends scaled-dot-product attention may use (`ATTENTION`). A masked
  attention (every left-padded batch, every step of the static decoder) otherwise goes to cuDNN
  on a Hopper GPU, and there greedy generations differed from one run to the next
  (benchmarks/RESULTS.md §7).

`QVAL_DETERMINISTIC=0` turns it off (faster where torch's deterministic kernels are slower; the
figures may then differ run to run). `describe()` is what the report records.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch

ENV_SWITCH = "QVAL_DETERMINISTIC"
ENV_ATTENTION = "QVAL_ATTENTION"  # another entry of ATTENTION, for measuring them (benchmarks/repro_h200.sh)
CUBLAS_WORKSPACE = ":4096:8"


def _sdpa(cudnn: bool, efficient: bool, flash: bool, math: bool) -> Callable[[], None]:
    def apply() -> None:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        torch.backends.cuda.enable_mem_efficient_sdp(efficient)
        torch.backends.cuda.enable_flash_sdp(flash)
        torch.backends.cuda.enable_math_sdp(math)
    return apply


# which scaled-dot-product-attention backends torch may choose from, process-wide
ATTENTION: dict[str, Callable[[], None]] = {
    "no-cudnn": _sdpa(cudnn=False, efficient=True, flash=True, math=True),
    "math": _sdpa(cudnn=False, efficient=False, flash=False, math=True),
    "torch-default": _sdpa(cudnn=True, efficient=True, flash=True, math=True),
}
DEFAULT_ATTENTION = "no-cudnn"

_state: dict[str, Any] = {"mode": "not configured"}


def wanted() -> bool:
    """Whether deterministic mode is asked for: on unless QVAL_DETERMINISTIC is 0/false/off/no."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def configure(device: str, enabled: bool | None = None, attention: str | None = None) -> dict[str, Any]:
    """Fix torch's GPU numerics for this process when `device` is CUDA and the mode is wanted;
    returns `describe()`. Idempotent; a CPU device changes nothing (`mode: "cpu"`)."""
    enabled = wanted() if enabled is None else enabled
    if not str(device).startswith("cuda"):
        if _state["mode"] == "not configured":
            _state["mode"] = "cpu"
        return describe()
    if not enabled:
        _state.update(mode="off")
        return describe()
    if _state["mode"] == "on":
        return describe()
    attention = attention or os.environ.get(ENV_ATTENTION) or DEFAULT_ATTENTION
    if attention not in ATTENTION:
        raise ValueError(f"{ENV_ATTENTION}={attention!r}: choose one of {', '.join(ATTENTION)}")
    notes = []
    preset = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if preset is None:
        # a handle made before this (a product already run) keeps the workspace it was made with
        if torch.cuda.is_initialized():
            notes.append("CUDA was initialised before CUBLAS_WORKSPACE_CONFIG was set: products run earlier "
                         "kept their workspace")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    elif preset not in (":4096:8", ":16:8"):
        notes.append(f"CUBLAS_WORKSPACE_CONFIG={preset} was set by the caller and kept; cuBLAS is reproducible "
                     "only with :4096:8 or :16:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ATTENTION[attention]()
    _state.update(mode="on", attention=attention, notes=notes)
    return describe()


def describe() -> dict[str, Any]:
    """The settings in force now, for the report's environment."""
    out: dict[str, Any] = {"mode": _state["mode"]}
    if _state["mode"] in ("on", "off"):
        cuda = torch.backends.cuda
        out.update(
            attention=_state.get("attention"),
            cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            fill_uninitialized_memory=torch.utils.deterministic.fill_uninitialized_memory,
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            tf32_matmul=cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32,
            sdpa_backends={"cudnn": cuda.cudnn_sdp_enabled(), "flash": cuda.flash_sdp_enabled(),
                           "efficient": cuda.mem_efficient_sdp_enabled(), "math": cuda.math_sdp_enabled()},
        )
    if _state.get("notes"):
        out["notes"] = list(_state["notes"])
    return out


@contextmanager
def distinct_index_writes() -> Iterator[None]:
    """Within, on a CUDA run in deterministic mode: torch's deterministic switch off, for code
    whose only operations with a deterministic variant are index writes to distinct indices.

    The static decoder's step (qval/engines/static_decode.py) is such code: its KV cache takes the
    step's keys and values with `index_copy_` at one slot, its output buffers the step's tokens at
    one column. An `index_copy_` can differ run to run only when an index repeats (which write
    lands last); with distinct indices the default CUDA kernel's result is the deterministic
    variant's, exactly. That variant is torch's `index_put_` with a sort of the indices (several
    kernels per call, each of the 2 × layers cache writes of every step, every step). Nothing
    else in a decode step (products, norms, attention's forward, argmax) reads the switch. Outside
    a deterministic CUDA run this does nothing. A process-wide switch: callers use it only on
    the thread that runs GPU work (qval's GPU engines run in turn, never side by side)."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


def key(device: str) -> dict[str, Any] | None:
    """What of this mode the numbers depend on, for stage and cache keys: None on a CPU (whose
    keys stay as they were), else the mode and the attention backends."""
    if not str(device).startswith("cuda"):
        return None
    on = _state["mode"] == "on" or (_state["mode"] in ("not configured", "cpu") and wanted())
    attention = (_state.get("attention") or os.environ.get(ENV_ATTENTION) or DEFAULT_ATTENTION) if on else "torch-default"
    return {"deterministic": on, "attention": attention}


def reset_for_tests() -> None:
    """Forget the configured mode (tests only; torch's flags are the caller's to restore)."""
    _state.clear()
    _state["mode"] = "not configured"
