"""Each format's ModelOpt config, pinned: the dict qval hands `mtq.quantize` for every registered
format × KV cache (and the settings that change it: SmoothQuant's alpha, AWQ's block size, the
exclude globs) equals the golden file. A ModelOpt upgrade that changes a preset, or an edit to a
format's builder, shows up here as a diff to review, not as a changed figure three gates later.

Regenerate after a reviewed change: QVAL_UPDATE_GOLDEN=1 python -m pytest tests/quantize/test_modelopt_configs.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qval.config import QuantConfig, QuantFormat
from qval.quantize.formats import FORMATS
from qval.quantize.modelopt_adapter import build_mtq_config

GOLDEN = Path(__file__).parent / "golden" / "modelopt_configs.json"


def _cases() -> dict[str, dict]:
    out = {}
    for fmt in QuantFormat:
        for kv in ("fp16", "fp8"):
            q = QuantConfig(format=fmt.value, kv_cache=kv, exclude=["*lm_head*"])
            out[f"{fmt.value}/kv{kv}"] = build_mtq_config(q)
    out["int8_sq/alpha0.8"] = build_mtq_config(QuantConfig(format="int8_sq", smoothquant_alpha=0.8, exclude=[]), alpha=0.8)
    out["int4_awq/block64"] = build_mtq_config(QuantConfig(format="int4_awq", awq_block_size=64, exclude=[]))
    out["w4a8_awq/block64"] = build_mtq_config(QuantConfig(format="w4a8_awq", awq_block_size=64, exclude=[]))
    out["fp8/exclude_down_proj"] = build_mtq_config(QuantConfig(format="fp8", exclude=["*lm_head*", "*mlp.down_proj"]))
    return _plain(out)


def _plain(x):
    """JSON's view: keys as strings (block_sizes has int keys), tuples as lists, other objects by repr."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x if x is None or isinstance(x, (bool, int, float, str)) else repr(x)


def test_every_format_is_registered_and_pinned():
    assert sorted(f.value for f in QuantFormat) == sorted(FORMATS.names())
    if os.environ.get("QVAL_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(_cases(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    now = _cases()
    assert sorted(now) == sorted(golden), "a format or case without a golden entry: regenerate (see the module docstring)"
    for case in now:
        assert now[case] == golden[case], f"{case}: ModelOpt config changed; review it, then regenerate"


@pytest.mark.parametrize("fmt", [f.value for f in QuantFormat if f is not QuantFormat.none])
def test_the_kv_decision_is_explicit_both_ways(fmt):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    last16, last8 = golden[f"{fmt}/kvfp16"]["quant_cfg"][-1], golden[f"{fmt}/kvfp8"]["quant_cfg"][-1]
    assert last16 == {"quantizer_name": "*[kv]_bmm_quantizer", "enable": False}
    assert last8["quantizer_name"] == "*[kv]_bmm_quantizer" and last8["cfg"]["num_bits"] == [4, 3]


def test_bits_per_weight_follow_the_settings_and_every_consumer_asks_the_format():
    """AWQ's bits depend on its block size (one 16-bit scale per block); the sweep's footprint and
    the fallback's budget take them from the same function as the report."""
    import torch

    from qval.config import GateConfig
    from qval.cost import format_bits
    from qval.sweep import footprint

    # each format's bits at its default settings are pinned once, in test_formats.EXPECTED
    assert format_bits(QuantConfig(format="w4a8_awq", awq_block_size=32)) == 4.5

    m = torch.nn.Sequential(torch.nn.Linear(64, 2, bias=False))
    m.config = type("C", (), {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 64})()
    for block, want in ((128, 4.125), (64, 4.25)):
        cfg = GateConfig.model_validate({"name": "x", "quant": {"format": "int4_awq", "exclude": [], "awq_block_size": block},
                                         "gates": {"agreement": {"enabled": False}}})
        assert footprint(cfg, m, context=1, batch=1).weight_bits == want
    from qval.diagnostics.stage import effective_bits, weight_budget

    lin = m[0]
    lin.weight_quantizer = type("Q", (), {"is_enabled": True})()
    budget = weight_budget(m, cfg)  # the block-64 config of the loop's last step
    assert budget["bits_quantized"] == 4.25 and effective_bits(budget) == 4.25
