"""Every registered format, walked through everything qval asks of it: the config validates, a
setting it does not take is refused with the message users see, its ModelOpt config builds from
a preset ModelOpt has, its export (if it has one) decodes a tensor back, and its bits per weight
are the stated ones. A format registered without one of these fails here, by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qval.config import QuantConfig, parse_config
from qval.errors import ConfigError
from qval.quantize.formats import FORMATS, FormatSpec

#: what each format is expected to be: bits per weight at the default settings (and at AWQ block
#: 64), its export's quant_algo (None: no export), whether it takes a SmoothQuant alpha and needs CUDA
EXPECTED = {
    "fp8": dict(bits=8, bits64=8, export="FP8", alpha=False, cuda=False),
    "int8_sq": dict(bits=8, bits64=8, export="W8A8_SQ_PER_CHANNEL", alpha=True, cuda=False),
    "int4_awq": dict(bits=4.125, bits64=4.25, export="W4A16_AWQ", alpha=False, cuda=False),
    "w4a8_awq": dict(bits=4.125, bits64=4.25, export=None, alpha=False, cuda=False),
    "nvfp4": dict(bits=4.5, bits64=4.5, export=None, alpha=False, cuda=True),
    "none": dict(bits=16, bits64=16, export=None, alpha=False, cuda=False),
}


def _fp8_case() -> tuple[torch.Tensor, torch.Tensor, int | None]:
    codes = torch.tensor([[1.0, -2.0, 0.5, 448.0], [-448.0, 0.0, 3.5, -0.25]])
    return codes * 0.125, torch.tensor(0.125), None  # E4M3 values times a per-tensor scale


def _int8_case() -> tuple[torch.Tensor, torch.Tensor, int | None]:
    codes = torch.tensor([[127.0, -127.0, 3.0, 0.0], [5.0, -1.0, 64.0, -100.0]])
    scale = torch.tensor([0.5, 0.25])  # one per output channel
    return codes * scale[:, None], scale, None


def _int4_case() -> tuple[torch.Tensor, torch.Tensor, int | None]:
    codes = torch.tensor([[7.0, -8.0, 1.0, 0.0], [-1.0, 2.0, -3.0, 4.0]])
    scale = torch.tensor([[0.5, 2.0], [1.0, 0.25]])  # blocks of 2 columns
    return codes * scale.repeat_interleave(2, dim=1), scale, 2


#: quant_algo -> (ModelOpt's name for its packer, a weight exactly on the grid, its scale, block size)
ROUND_TRIPS = {"FP8": ("fp8", _fp8_case), "W8A8_SQ_PER_CHANNEL": ("int8_sq", _int8_case), "W4A16_AWQ": ("int4_awq", _int4_case)}


def problems(spec: FormatSpec) -> list[str]:
    """What a registered format lacks; [] when it has everything the tests below walk through."""
    import modelopt.torch.quantization as mtq

    out = []
    if spec.name not in EXPECTED:
        out.append(f"{spec.name}: no expected capabilities in this test (add it to EXPECTED)")
        return out
    want = EXPECTED[spec.name]
    if spec.quantizes and spec.preset is None:
        out.append(f"{spec.name}: quantizes but names no ModelOpt preset")
    if spec.preset is not None and not hasattr(mtq, spec.preset):
        out.append(f"{spec.name}: ModelOpt has no preset {spec.preset}")
    if (spec.export.quant_algo if spec.export else None) != want["export"]:
        out.append(f"{spec.name}: export {spec.export} is not the expected {want['export']}")
    if spec.export is not None and spec.export.quant_algo not in ROUND_TRIPS:
        out.append(f"{spec.name}: export {spec.export.quant_algo} has no round-trip case")
    if spec.takes_smoothquant_alpha != want["alpha"] or spec.needs_cuda != want["cuda"]:
        out.append(f"{spec.name}: smoothquant alpha / CUDA capabilities differ from the expected")
    if not spec.quantizes and (spec.export or spec.takes_smoothquant_alpha):
        out.append(f"{spec.name}: quantizes no weight but claims an export or an alpha")  # a KV cache it may (KV-only)
    return out


def test_every_registered_format_is_expected():
    assert sorted(FORMATS.names()) == sorted(EXPECTED)
    assert [p for spec in FORMATS.ordered() for p in problems(spec)] == []


def test_a_format_missing_a_capability_fails():
    fp8 = FORMATS.get("fp8")
    assert problems(dataclasses.replace(fp8, name="fp9")) == ["fp9: no expected capabilities in this test (add it to EXPECTED)"]
    assert any("no preset" in p for p in problems(dataclasses.replace(fp8, preset="NO_SUCH_CFG")))
    assert any("round-trip" in p for p in problems(dataclasses.replace(
        fp8, export=dataclasses.replace(fp8.export, quant_algo="FP6"))))
    assert any("names no ModelOpt preset" in p for p in problems(dataclasses.replace(fp8, preset=None)))


def _config(fmt: str, **quant) -> dict:
    return {"name": "x", "quant": {"format": fmt, **quant}, "gates": {"agreement": {"min_top1": 0.5}}}


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_config_validation(fmt):
    cfg = parse_config(_config(fmt))
    assert cfg.quant.spec is FORMATS.get(fmt)
    if EXPECTED[fmt]["alpha"]:
        assert parse_config(_config(fmt, smoothquant_alpha=[0.3, 0.6])).quant.alphas == [0.3, 0.6]
    else:
        with pytest.raises(ConfigError, match=f"smoothquant_alpha applies to format int8_sq only, not {fmt}"):
            parse_config(_config(fmt, smoothquant_alpha=0.3))


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_modelopt_config(fmt):
    from qval.quantize.modelopt_adapter import KV_QUANTIZERS, build_mtq_config

    for kv in ("fp16", "fp8"):
        cfg = build_mtq_config(QuantConfig(format=fmt, kv_cache=kv, exclude=[]))
        last = cfg["quant_cfg"][-1]
        assert last["quantizer_name"] == KV_QUANTIZERS
        assert ("cfg" in last) == (kv == "fp8" and FORMATS.get(fmt).kv_cache)
        if not FORMATS.get(fmt).quantizes:
            assert cfg["quant_cfg"][0] == {"quantizer_name": "*", "enable": False}


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_export_decoding(fmt):
    from modelopt.torch.export.quant_utils import to_quantized_weight

    from qval.export.formats import BY_QUANT_ALGO, EXPORTABLE, check_exportable, export_spec

    spec = FORMATS.get(fmt).export
    if spec is None:
        with pytest.raises(ConfigError, match=f"quant.format {fmt} cannot be gated as an export: qval exports and reads back "
                                              f"{', '.join(EXPORTABLE)}"):
            check_exportable(fmt, "here")
        assert fmt not in BY_QUANT_ALGO.values()
        return
    check_exportable(fmt, "here")
    assert export_spec(fmt) is spec and BY_QUANT_ALGO[spec.quant_algo] == fmt
    packer, case = ROUND_TRIPS[spec.quant_algo]
    weight, scale, block = case()
    stored = to_quantized_weight(weight, scale, packer, block_size=block)  # ModelOpt's packer: an independent writer
    assert stored.dtype == spec.weight_dtype
    assert torch.equal(spec.decode({"weight": stored, "weight_scale": scale}, block), weight)


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_bits_per_weight(fmt):
    from qval.cost import format_bits

    assert format_bits(QuantConfig(format=fmt)) == EXPECTED[fmt]["bits"]
    assert format_bits(QuantConfig(format=fmt, awq_block_size=64)) == EXPECTED[fmt]["bits64"]
