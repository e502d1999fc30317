"""Decoders of exported weights: stored codes and scales -> float32 weights, one per storage layout.

They are written from the packing code in `modelopt.torch.export.quant_utils`
(`to_quantized_weight`, `pack_int4_in_uint8`), not from ModelOpt's own unpacking, so the fidelity
check is an independent reading of the files. Each format's `ExportSpec` (`qval.quantize.formats`)
names its decoder; torch is imported when one runs, so the format registry stays torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]


def _per_row(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor (0-d or [1]) or per-output-channel ([rows] or [rows, 1]) scale as [rows|1, 1]."""
    s = scale.float().reshape(-1)
    if s.numel() not in (1, rows):
        raise ValueError(f"scale has {s.numel()} values; expected 1 or {rows} (one per output channel)")
    return s.reshape(-1, 1)


def decode_fp8(t: Tensors, block: int | None) -> torch.Tensor:
    """E4M3 codes times the scale (ModelOpt stores scale = amax / 448).

    >>> import torch
    >>> w = torch.tensor([[1.0, -2.0]]).to(torch.float8_e4m3fn)
    >>> decode_fp8({"weight": w, "weight_scale": torch.tensor(0.5)}, None).tolist()
    [[0.5, -1.0]]
    """
    w = t["weight"]
    return w.float() * _per_row(t["weight_scale"], w.shape[0])


def decode_int8(t: Tensors, block: int | None) -> torch.Tensor:
    """INT8 codes in [-128, 127] times a per-output-channel scale (amax / 127).

    >>> import torch
    >>> decode_int8({"weight": torch.tensor([[2, -4]], dtype=torch.int8), "weight_scale": torch.tensor([0.25])}, None).tolist()
    [[0.5, -1.0]]
    """
    w = t["weight"]
    return w.float() * _per_row(t["weight_scale"], w.shape[0])


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out/2, in] -> int8 codes [out, in] in [-8, 7]. ModelOpt packs output rows 2j (low
    nibble) and 2j+1 (high nibble) of column i into byte [j, i].

    >>> import torch
    >>> unpack_int4(torch.tensor([[0x7F, 0x18]], dtype=torch.uint8)).tolist()
    [[-1, -8], [7, 1]]
    """
    import torch

    p = packed.view(torch.uint8).to(torch.int16)
    low, high = p & 0x0F, p >> 4
    codes = torch.stack([low, high], dim=1).reshape(p.shape[0] * 2, p.shape[1])
    return torch.where(codes >= 8, codes - 16, codes).to(torch.int8)


def decode_int4_blocks(t: Tensors, block: int | None) -> torch.Tensor:
    """Packed INT4 codes times one scale per block of `block` input columns ([out, in/block]).

    >>> import torch
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
