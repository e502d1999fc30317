"""Decoders of exported weights: hand-worked values, and agreement with ModelOpt's own packer
(an independent implementation: qval's decoder must invert what ModelOpt wrote)."""

from __future__ import annotations

import pytest
import torch

from qval.quantize.codecs import decode_fp8, decode_int4_blocks, decode_int8, unpack_int4
from qval.export.formats import BY_QUANT_ALGO, export_spec


def test_unpack_int4_by_hand():
    # byte 0x7F: low nibble 0xF = -1 (row 0), high nibble 0x7 = 7 (row 1)
    # byte 0x18: low nibble 0x8 = -8 (row 0), high nibble 0x1 = 1 (row 1)
    assert unpack_int4(torch.tensor([[0x7F, 0x18]], dtype=torch.uint8)).tolist() == [[-1, -8], [7, 1]]


def test_int4_round_trip_through_modelopt_packer():
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    torch.manual_seed(0)
    codes = torch.randint(-8, 8, (6, 8)).float()
    scale = torch.rand(6, 2) + 0.5  # blocks of 4 columns
    weight = codes * scale.repeat_interleave(4, dim=1)
    packed = pack_int4_in_uint8(weight, scale, 4)
    assert packed.shape == (3, 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes.to(torch.int8))
    decoded = decode_int4_blocks({"weight": packed, "weight_scale": scale}, 4)
    torch.testing.assert_close(decoded, weight, rtol=0, atol=1e-6)


def test_int4_scale_shape_is_checked():
    packed = torch.zeros(1, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="one per block of 2 columns"):
        decode_int4_blocks({"weight": packed, "weight_scale": torch.ones(2, 3)}, 2)


def test_fp8_matches_modelopt_quantizer():
    from modelopt.torch.export.quant_utils import to_quantized_weight

    torch.manual_seed(1)
    w = torch.randn(16, 32)
    scale = w.abs().max() / 448
    stored = to_quantized_weight(w, scale, "fp8")
    assert stored.dtype == torch.float8_e4m3fn
    decoded = decode_fp8({"weight": stored, "weight_scale": scale}, None)
    # E4M3 keeps 3 mantissa bits: each value within half a step (2^-4 relative) of the original
    assert bool(((decoded - w).abs() <= w.abs() * 2**-4 + scale * 2**-9).all())
    assert decoded.tolist() == (stored.float() * scale).tolist()


def test_int8_per_channel_by_hand():
    w = torch.tensor([[127, -128], [1, 0]], dtype=torch.int8)
    out = decode_int8({"weight": w, "weight_scale": torch.tensor([0.5, 2.0])}, None)
    assert out.tolist() == [[63.5, -64.0], [2.0, 0.0]]
    with pytest.raises(ValueError, match="expected 1 or 2"):
        decode_int8({"weight": w, "weight_scale": torch.ones(3)}, None)


def test_format_names_are_modelopts():
    # the exportable formats and their quant_algo names are pinned once, in tests/quantize/test_formats.EXPECTED
    assert all(BY_QUANT_ALGO[spec.quant_algo] == name for name, spec in ((n, export_spec(n)) for n in BY_QUANT_ALGO.values()))
    assert export_spec("int4_awq").weight_dtype == torch.uint8
