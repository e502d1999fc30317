"""Quantization formats: each registers how it maps onto a ModelOpt config.

Adding a format is one decorated function here; nothing else dispatches on format names.
The ModelOpt configs are the library's own presets (FP8_DEFAULT_CFG, INT8_SMOOTHQUANT_CFG, …),
copied and then adjusted, so qval calibrates exactly what ModelOpt's examples calibrate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

from ..config import QuantConfig, QuantFormat
from ..registry import Registry


@dataclass(frozen=True)
class FormatSpec:
    """What a format is, in the units a deployment decision needs."""

    name: str
    #: stored bits per quantized weight, scales included: a figure, or a function of the settings
    weight_bits: float | Callable[[QuantConfig], float]
    activation_bits: int | None  # None: activations stay in high precision
    needs_cuda: bool
    #: (QuantConfig, smoothquant alpha) -> ModelOpt config dict, before excludes and KV cache
    make: Callable[[QuantConfig, float | None], dict[str, Any]]
    calibrated_activations: bool = True

    def bits(self, q: QuantConfig) -> float:
        """Stored bits per quantized weight for these settings, scales included."""
        return self.weight_bits(q) if callable(self.weight_bits) else self.weight_bits


FORMATS: Registry[FormatSpec] = Registry("quantization format")


def _preset(name: str) -> dict[str, Any]:
    import modelopt.torch.quantization as mtq

    return copy.deepcopy(getattr(mtq, name))


def _set_block_size(cfg: dict[str, Any], block: int) -> dict[str, Any]:
    """Replace the last-axis block size of every block-quantized weight entry."""
    for entry in cfg["quant_cfg"]:
        if entry.get("quantizer_name") != "*weight_quantizer":
            continue
        attrs = entry.get("cfg")
        for a in attrs if isinstance(attrs, list) else [attrs]:
            if isinstance(a, dict) and a.get("block_sizes"):
                a["block_sizes"] = {**a["block_sizes"], -1: block}
    return cfg


def _awq_bits(q: QuantConfig) -> float:
    # 4-bit weights in blocks of `awq_block_size` with one 16-bit scale per block (4.125 at 128)
    return 4 + 16 / q.awq_block_size


def register_format(spec_name: str, **kw: Any) -> Callable[[Callable], Callable]:
    def deco(make: Callable[[QuantConfig, float | None], dict[str, Any]]) -> Callable:
        FORMATS.register(spec_name)(FormatSpec(name=spec_name, make=make, **kw))
        return make

    return deco


@register_format(QuantFormat.fp8.value, weight_bits=8, activation_bits=8, needs_cuda=False)
def _fp8(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    return _preset("FP8_DEFAULT_CFG")  # per-tensor E4M3 weights and activations, max calibration


@register_format(QuantFormat.int8_sq.value, weight_bits=8, activation_bits=8, needs_cuda=False)
def _int8_sq(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    cfg = _preset("INT8_SMOOTHQUANT_CFG")  # per-channel INT8 weights, per-tensor INT8 activations
    cfg["algorithm"] = {"method": "smoothquant", "alpha": 0.5 if alpha is None else alpha}
    return cfg


@register_format(QuantFormat.int4_awq.value, weight_bits=_awq_bits, activation_bits=None, needs_cuda=False)
def _int4_awq(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    # 4-bit weights in blocks of `awq_block_size` with a 16-bit scale per block: 4 + 16/128 bits
    return _set_block_size(_preset("INT4_AWQ_CFG"), q.awq_block_size)


@register_format(QuantFormat.w4a8_awq.value, weight_bits=_awq_bits, activation_bits=8, needs_cuda=False)
def _w4a8_awq(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    return _set_block_size(_preset("W4A8_AWQ_BETA_CFG"), q.awq_block_size)


@register_format(QuantFormat.nvfp4.value, weight_bits=4.5, activation_bits=4, needs_cuda=True)
def _nvfp4(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    return _preset("NVFP4_DEFAULT_CFG")  # E2M1 in blocks of 16 with an E4M3 scale per block


@register_format(QuantFormat.none.value, weight_bits=16, activation_bits=None, needs_cuda=False, calibrated_activations=False)
def _none(q: QuantConfig, alpha: float | None) -> dict[str, Any]:
    return {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": None}


def effective_weight_bits(q: QuantConfig) -> float:
    """Bits per quantized weight for `q`'s format and settings: the one figure the sweep's
    footprint, the fallback's budget and the report use.

    >>> effective_weight_bits(QuantConfig(format="int4_awq")), effective_weight_bits(QuantConfig(format="int4_awq", awq_block_size=64))
    (4.125, 4.25)
    """
    return FORMATS.get(q.format.value).bits(q)
