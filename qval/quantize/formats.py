"""Quantization formats: one `FormatSpec` per format, the only place a format's name means anything.

A spec carries everything qval asks about a format: whether it quantizes at all, which settings it
takes, whether it can quantize the KV cache, the hardware it needs, its bits per weight, the
ModelOpt preset it starts from, and how ModelOpt exports it (the decoder that reads its weights
back). Everything else asks the spec; adding a format is one decorated function here.

This module imports neither torch, ModelOpt nor the config (the config builds its format enum
from `FORMATS`); the ModelOpt presets are copied by `modelopt_adapter`, so qval calibrates
exactly what ModelOpt's examples calibrate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from . import codecs
from ..registry import Registry


class Settings(Protocol):
    """The part of the config's quant section a format's builder and bits read."""

    awq_block_size: int


@dataclass(frozen=True)
class ExportSpec:
    """How ModelOpt's unified HF checkpoint stores a format, and how qval reads its weights back."""

    quant_algo: str  # hf_quant_config.json "quantization.quant_algo"
    weight_dtype_name: str  # torch dtype of the stored `<layer>.weight`
    required: tuple[str, ...]  # tensors besides `weight` that every quantized layer needs
    #: (`weight`, `weight_scale`, …) of one layer, block size -> dequantized float32 weight
    decode: Callable[[codecs.Tensors, int | None], Any]
    #: the checkpoint stores an activation scale per layer (static activation quantization)
    static_activations: bool

    @property
    def weight_dtype(self) -> Any:
        import torch

        return getattr(torch, self.weight_dtype_name)


@dataclass(frozen=True)
class FormatSpec:
    """What a format is, in the units a deployment decision needs."""

    name: str
    #: stored bits per quantized weight, scales included: a figure, or a function of the settings
    weight_bits: float | Callable[[Settings], float]
    activation_bits: int | None  # None: activations stay in high precision
    needs_cuda: bool
    #: ModelOpt's preset (a `modelopt.torch.quantization` attribute) the config starts from; None: no preset
    preset: str | None
    #: (a copy of the preset, settings, smoothquant alpha) -> ModelOpt config, before excludes and KV cache
    adjust: Callable[[dict[str, Any] | None, Settings, float | None], dict[str, Any]]
    quantizes: bool = True  # False for `none`: the reference itself, nothing calibrated
    takes_smoothquant_alpha: bool = False
    kv_cache: bool = True  # `kv_cache: fp8` quantizes the KV cache (False: the setting has no effect)
    export: ExportSpec | None = None  # None: qval cannot export it and read it back

    def bits(self, q: Settings) -> float:
        """Stored bits per quantized weight for these settings, scales included."""
        return self.weight_bits(q) if callable(self.weight_bits) else self.weight_bits


FORMATS: Registry[FormatSpec] = Registry("quantization format")


def names_where(has: Callable[[FormatSpec], bool]) -> list[str]:
    """Names of the formats with a capability, in registration order (the order messages list them)."""
    return [s.name for s in FORMATS.ordered() if has(s)]


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


def _awq_bits(q: Settings) -> float:
    # 4-bit weights in blocks of `awq_block_size` with one 16-bit scale per block (4.125 at 128)
    return 4 + 16 / q.awq_block_size


def register_format(name: str, **kw: Any) -> Callable[[Callable], Callable]:
    def deco(adjust: Callable[[dict[str, Any] | None, Settings, float | None], dict[str, Any]]) -> Callable:
        FORMATS.register(name)(FormatSpec(name=name, adjust=adjust, **kw))
        return adjust

    return deco


FP8_EXPORT = ExportSpec("FP8", "float8_e4m3fn", ("weight_scale", "input_scale"), codecs.decode_fp8, True)
INT8_EXPORT = ExportSpec("W8A8_SQ_PER_CHANNEL", "int8", ("weight_scale", "input_scale"), codecs.decode_int8, True)
INT4_EXPORT = ExportSpec("W4A16_AWQ", "uint8", ("weight_scale",), codecs.decode_int4_blocks, False)


@register_format("fp8", weight_bits=8, activation_bits=8, needs_cuda=False, preset="FP8_DEFAULT_CFG", export=FP8_EXPORT)
def _fp8(cfg: dict[str, Any], q: Settings, alpha: float | None) -> dict[str, Any]:
    return cfg  # per-tensor E4M3 weights and activations, max calibration


@register_format("int8_sq", weight_bits=8, activation_bits=8, needs_cuda=False, preset="INT8_SMOOTHQUANT_CFG",
                 takes_smoothquant_alpha=True, export=INT8_EXPORT)
def _int8_sq(cfg: dict[str, Any], q: Settings, alpha: float | None) -> dict[str, Any]:
    # per-channel INT8 weights, per-tensor INT8 activations
    cfg["algorithm"] = {"method": "smoothquant", "alpha": 0.5 if alpha is None else alpha}
    return cfg


@register_format("int4_awq", weight_bits=_awq_bits, activation_bits=None, needs_cuda=False, preset="INT4_AWQ_CFG",
                 export=INT4_EXPORT)
def _int4_awq(cfg: dict[str, Any], q: Settings, alpha: float | None) -> dict[str, Any]:
    # 4-bit weights in blocks of `awq_block_size` with a 16-bit scale per block: 4 + 16/128 bits
    return _set_block_size(cfg, q.awq_block_size)


@register_format("w4a8_awq", weight_bits=_awq_bits, activation_bits=8, needs_cuda=False, preset="W4A8_AWQ_BETA_CFG")
def _w4a8_awq(cfg: dict[str, Any], q: Settings, alpha: float | None) -> dict[str, Any]:
    return _set_block_size(cfg, q.awq_block_size)


@register_format("nvfp4", weight_bits=4.5, activation_bits=4, needs_cuda=True, preset="NVFP4_DEFAULT_CFG")
def _nvfp4(cfg: dict[str, Any], q: Settings, alpha: float | None) -> dict[str, Any]:
    return cfg  # E2M1 in blocks of 16 with an E4M3 scale per block


@register_format("none", weight_bits=16, activation_bits=None, needs_cuda=False, preset=None, quantizes=False)
def _none(cfg: None, q: Settings, alpha: float | None) -> dict[str, Any]:
    # every quantizer off; with kv_cache fp8 build_mtq_config switches the KV quantizers back on: a KV-cache-only candidate
    return {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": None}

