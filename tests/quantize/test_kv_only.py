"""A KV-cache-only candidate (`quant: {format: none, kv_cache: fp8}`): the weights stay as they are and
ModelOpt's K/V quantizers, alone, are calibrated and used. Seen before it existed: this config built the
reference itself and approved it as an FP8 KV cache (gate 1 KLD exactly 0), so it was refused; now it
is the candidate its config names, on the backends that can build it, and refused on the others."""

from __future__ import annotations

import copy

import pytest
import torch

from qval.config import parse_config
from qval.errors import ConfigError
from qval.quantize.modelopt_adapter import build_mtq_config, iter_quantizers, quantize

from ..test_faults import IDS, kld, logits, tiny_llama


def _quant(kv: str) -> dict:
    return {"name": "kvonly", "quant": {"format": "none", "kv_cache": kv}, "gates": {"agreement": {"min_top1": 0.5}}}


def test_the_modelopt_config_enables_the_kv_quantizers_alone():
    q = parse_config(_quant("fp8"), "kvonly.yaml").quant
    assert q.kv_only and q.has_quantizers
    cfg = build_mtq_config(q)
    assert cfg["algorithm"] == "max" and cfg["quant_cfg"][0] == {"quantizer_name": "*", "enable": False}
    assert cfg["quant_cfg"][-1] == {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}
    plain = parse_config(_quant("fp16"), "plain.yaml").quant
    assert not plain.kv_only and not plain.has_quantizers and build_mtq_config(plain)["algorithm"] is None


def test_only_k_and_v_are_quantized_and_the_logits_move():
    base = tiny_llama(2)
    model = copy.deepcopy(base)
    q = parse_config(_quant("fp8"), "kvonly.yaml").quant
    info = quantize(model, q, [IDS], "cpu")
    enabled = sorted(name for name, m in iter_quantizers(model) if m.is_enabled)
    assert enabled == [f"model.layers.{i}.self_attn.{kv}_bmm_quantizer" for i in range(2) for kv in "kv"]
    assert info["quantizers_enabled"] == 4
    for name, m in iter_quantizers(model):
        if m.is_enabled:
            assert float(m.amax.max()) > 0, name  # calibrated
    for (name, p), (_, p0) in zip(model.named_parameters(), base.named_parameters()):
        assert torch.equal(p, p0), name  # no weight touched
    assert kld(logits(base), logits(model)) > 0


@pytest.mark.parametrize("backend", ["realquant", "export"])
def test_a_backend_that_builds_from_quantized_weights_refuses_it(backend: str):
    with pytest.raises(ConfigError, match="KV-cache-only candidate.*runs on engine.backend fakequant or served"):
        parse_config({**_quant("fp8"), "engine": {"backend": backend}}, "kvonly.yaml")


def test_a_server_cannot_be_handed_a_kv_only_candidate_to_export():
    served = {"backend": "served", "options": {"launch": {"model": "candidate", "kv_cache_dtype": "fp8"}}}
    with pytest.raises(ConfigError, match="no quantized weights to export.*serve model: reference"):
        parse_config({**_quant("fp8"), "engine": served}, "kvonly.yaml")
    served["options"]["launch"]["model"] = "reference"
    assert parse_config({**_quant("fp8"), "engine": served}, "kvonly.yaml").quant.kv_only
