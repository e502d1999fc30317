"""Weights quantized once, switchable between their quantized and high-precision values.

A live weight quantizer re-quantizes its weight on every forward; on a CPU that is most of the
cost of a forward (FP8 fake quantization runs at ~100-200 ns per element there: seconds per
forward for a 135M model). The diagnostics run tens of forwards, so each weight is quantized
once here, stored in place of the weight with its quantizer switched off, which gives the same
logits (this is what ModelOpt's fold_weight does), while the high-precision weight is kept so
a layer can be "restored" by swapping the tensor back. Leaving the context undoes everything.

Quantizers with a pre_quant_scale or a rotation are left live: switched off, they would still
apply their scale to the stored (already scaled) weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..quantize.modelopt_adapter import quantizer_state, set_quantizer


@dataclass
class Folded:
    module: torch.nn.Module
    quantizer: Any
    high: torch.Tensor  # the weight as calibrated (SmoothQuant/AWQ scales included), unquantized
    quantized: torch.Tensor  # what the quantizer makes of it


def foldable(quantizer: Any) -> bool:
    s = quantizer_state(quantizer)
    return s.enabled and s.pre_quant_scale is None and not s.rotate and s.fake_quant


class FoldedWeights:
    """`with FoldedWeights(model, quantizers) as fw:` weights quantized once; `fw.high(name)` /
    `fw.low(name)` switch one weight quantizer's weight between high precision and quantized."""

    def __init__(self, model: torch.nn.Module, quantizers: dict[str, Any]) -> None:
        self.entries: dict[str, Folded] = {}
        with torch.no_grad():
            for name, q in quantizers.items():
                if name.endswith("weight_quantizer") and foldable(q):
                    module = model.get_submodule(name.rpartition(".")[0])
                    self.entries[name] = Folded(module, q, module.weight.data, q(module.weight).detach())

    def __enter__(self) -> "FoldedWeights":
        for e in self.entries.values():
            e.module.weight.data = e.quantized
            set_quantizer(e.quantizer, enabled=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for e in self.entries.values():
            e.module.weight.data = e.high
            set_quantizer(e.quantizer, enabled=True)

    def high(self, name: str) -> None:
        self.entries[name].module.weight.data = self.entries[name].high

    def low(self, name: str) -> None:
        self.entries[name].module.weight.data = self.entries[name].quantized
