"""qval's decode runtime: the engine component that runs a model faster than transformers' own
code, giving its figures (the same bit for bit on a CPU; within a last-bit tolerance on a GPU).

An in-process engine (`HFEngine` and the backends built on it) runs its model through this runtime
when `engine.options.runtime` is "qval" (the default), and through transformers' and ModelOpt's code
only when it is "transformers". Its parts:

- attention (decode_attention.py): on a CPU, grouped-query K/V read as they are rather than repeated
  for every query head; in a static decode step, only the filled cache slots (a split-KV Triton
  kernel on a GPU);
- the KV cache (kvcache.py): written in place instead of copied whole every token, and for a
  quantized KV cache quantized once per token as it enters;
- leanfp8.py: FP8 fake-quant linears with ModelOpt's arithmetic and without its per-call overhead
  (installed by the fakequant builder, checked bit-identical when the engine is built);
- on a GPU, the static decoder (static_decode.py): a decode step of device operations only, captured
  as CUDA graphs, its small kernels fused and its products through Triton GEMV kernels
  (fused_step.py, gemv.py, decode_kernel.py).

The boundary: the runtime changes the engine's own model instance — its attention implementation
(set through the model's public `set_attn_implementation` to qval's function, which transformers'
registries hold under qval's own name, `decode_attention.NAME`) and, inside a static decode step
only, instance forwards of its modules — and qval's own classes. It never assigns to torch's or
transformers' classes, functions or modules (tests/test_no_patching.py scans the tree;
tests/test_runtime_boundary.py runs qval and compares the process before and after), and its state
(switches, what could not run here) lives on this object.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from . import decode_attention
from .kvcache import growing_cache

Runtime = Literal["qval", "transformers"]  # engine.options.runtime (qval.backends.RuntimeOptions)


class DecodeRuntime:
    """The runtime on one model instance: its switches and what could not run here."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        #: why a fused function or kernel could not run here (it runs transformers' arithmetic since): an engine note
        self.failures: dict[str, str] = {}
        self.filled = True  # static decode attends over the filled cache slots only
        self.fused: bool | None = None  # the static step's small kernels fused (fused_step.py); None: on a GPU only
        self.gemv = True  # the fused step's 1-16-row products through gemv.py (benchmarks switch it off)
        self.split_kv = True  # the static step's attention through decode_kernel.py on a GPU (benchmarks switch it off)
        self.attention = decode_attention.install(model)

    def own(self) -> None:
        """Before each engine call: the runtime's attention on the model, should another engine on
        the same instance have put transformers' back (tests share one loaded model)."""
        if decode_attention.implementation(self.model) != decode_attention.NAME:
            self.attention = decode_attention.install(self.model)

    def cache(self, kv_quantizers: dict[int, tuple[Any, Any]]) -> Any:
        """The KV cache of one scoring or generation call."""
        return growing_cache(kv_quantizers)


def plain(model: torch.nn.Module) -> None:
    """Before each call of an engine without the runtime: transformers' own attention on its model
    (a copy of a model the runtime ran carries the runtime's)."""
    decode_attention.uninstall(model)


def option(engine_config: Any) -> Runtime:
    """`engine.options.runtime` of a config's engine section ("qval" where its backend declares no such option)."""
    from ..backends import BACKENDS

    model = BACKENDS.get(engine_config.backend).options_model
    return getattr(model.model_validate(engine_config.options), "runtime", "qval") if model is not None else "qval"
