"""How each quantization format looks inside a ModelOpt unified HF checkpoint, and how to read
its weights back to real numbers.

Each format registers the name ModelOpt writes into `hf_quant_config.json` (`quant_algo`), the
dtype its weights are stored in, the tensors every quantized layer must carry, and a decoder:
stored codes and scales -> float32 weights. The decoders are written from the packing code in
`modelopt.torch.export.quant_utils` (`to_quantized_weight`, `pack_int4_in_uint8`), not from
ModelOpt's own unpacking, so the fidelity check is an independent reading of the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigError
from ..registry import Registry

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ExportFormat:
    """One qval format as ModelOpt exports it."""

    qval_format: str
    quant_algo: str  # hf_quant_config.json "quantization.quant_algo"
    weight_dtype: torch.dtype  # dtype of the stored `<layer>.weight`
    required: tuple[str, ...]  # tensors besides `weight` that every quantized layer needs
    #: (`weight`, `weight_scale`, …) of one layer, block size -> dequantized float32 weight
    decode: Callable[[Tensors, int | None], torch.Tensor]
    #: the checkpoint stores an activation scale per layer (static activation quantization)
    static_activations: bool


EXPORT_FORMATS: Registry[ExportFormat] = Registry("exportable format")


def register(fmt: ExportFormat) -> ExportFormat:
    return EXPORT_FORMATS.register(fmt.qval_format)(fmt)


def _per_row(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor (0-d or [1]) or per-output-channel ([rows] or [rows, 1]) scale as [rows|1, 1]."""
    s = scale.float().reshape(-1)
    if s.numel() not in (1, rows):
        raise ValueError(f"scale has {s.numel()} values; expected 1 or {rows} (one per output channel)")
    return s.reshape(-1, 1)


def decode_fp8(t: Tensors, block: int | None) -> torch.Tensor:
    """E4M3 codes times the scale (ModelOpt stores scale = amax / 448).

    >>> w = torch.tensor([[1.0, -2.0]]).to(torch.float8_e4m3fn)
    >>> decode_fp8({"weight": w, "weight_scale": torch.tensor(0.5)}, None).tolist()
    [[0.5, -1.0]]
    """
    w = t["weight"]
    return w.float() * _per_row(t["weight_scale"], w.shape[0])


def decode_int8(t: Tensors, block: int | None) -> torch.Tensor:
    """INT8 codes in [-128, 127] times a per-output-channel scale (amax / 127).

    >>> decode_int8({"weight": torch.tensor([[2, -4]], dtype=torch.int8), "weight_scale": torch.tensor([0.25])}, None).tolist()
    [[0.5, -1.0]]
    """
    w = t["weight"]
    return w.float() * _per_row(t["weight_scale"], w.shape[0])


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out/2, in] -> int8 codes [out, in] in [-8, 7]. ModelOpt packs output rows 2j (low
    nibble) and 2j+1 (high nibble) of column i into byte [j, i].

    >>> unpack_int4(torch.tensor([[0x7F, 0x18]], dtype=torch.uint8)).tolist()
    [[-1, -8], [7, 1]]
    """
    p = packed.view(torch.uint8).to(torch.int16)
    low, high = p & 0x0F, p >> 4
    codes = torch.stack([low, high], dim=1).reshape(p.shape[0] * 2, p.shape[1])
    return torch.where(codes >= 8, codes - 16, codes).to(torch.int8)


def decode_int4_blocks(t: Tensors, block: int | None) -> torch.Tensor:
    """Packed INT4 codes times one scale per block of `block` input columns ([out, in/block]).

    >>> packed = torch.tensor([[0x21, 0x43]], dtype=torch.uint8)  # rows (1, 3) and (2, 4)
    >>> decode_int4_blocks({"weight": packed, "weight_scale": torch.tensor([[0.5], [1.0]])}, 2).tolist()
    [[0.5, 1.5], [2.0, 4.0]]
    """
    codes = unpack_int4(t["weight"])
    scale = t["weight_scale"].float()
    if block is None:
        block = codes.shape[1] // scale.shape[-1]
    if scale.shape != (codes.shape[0], codes.shape[1] // block):
        raise ValueError(f"weight_scale has shape {tuple(scale.shape)}; expected {(codes.shape[0], codes.shape[1] // block)} "
                         f"(one per block of {block} columns)")
    return codes.float() * scale.repeat_interleave(block, dim=1)


register(ExportFormat("fp8", "FP8", torch.float8_e4m3fn, ("weight_scale", "input_scale"), decode_fp8, True))
register(ExportFormat("int8_sq", "W8A8_SQ_PER_CHANNEL", torch.int8, ("weight_scale", "input_scale"), decode_int8, True))
register(ExportFormat("int4_awq", "W4A16_AWQ", torch.uint8, ("weight_scale",), decode_int4_blocks, False))

#: quant_algo in hf_quant_config.json -> qval format
BY_QUANT_ALGO = {EXPORT_FORMATS.get(n).quant_algo: n for n in EXPORT_FORMATS.names()}

#: kv_cache_quant_algo ModelOpt writes for each qval KV-cache setting
KV_ALGO = {"fp16": None, "fp8": "FP8"}


def check_exportable(fmt: str, where: str) -> None:
    """A ConfigError unless qval can export `fmt` and read it back (its fidelity check decodes only
    the registered formats, so any other export could never pass)."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"{where}: quant.format {fmt} cannot be gated as an export: qval exports and reads back "
                          f"{', '.join(EXPORT_FORMATS.names())}; pick one of those or engine: {{backend: fakequant}}.")
