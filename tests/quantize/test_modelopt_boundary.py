"""ModelOpt is reached through qval/quantize/modelopt_adapter.py only, and the private names its
quantizer accessor reads are pinned: a ModelOpt upgrade that renames one fails here, naming it,
rather than as a changed figure (or a silently skipped lean path) somewhere downstream."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from qval.quantize.modelopt_adapter import compress, quantizer_state, set_quantizer

from .quantizers import calibrated

QVAL = Path(__file__).resolve().parents[2] / "qval"
ADAPTER = QVAL / "quantize" / "modelopt_adapter.py"

#: every private TensorQuantizer attribute the accessor reads (ModelOpt 0.47)
PRIVATE = ("_amax", "_num_bits", "_unsigned", "_axis", "_block_sizes", "_fake_quant", "_if_quant", "_if_calib",
           "_use_constant_amax", "_dynamic", "_pre_quant_scale", "_scale")


def test_private_names_exist():
    x = torch.tensor([[1.0, -3.0], [0.5, 2.0]])
    q = calibrated(x, num_bits=(4, 3), axis=None)
    set_quantizer(q, pre_quant_scale=torch.tensor([1.0, 2.0]))
    lin = torch.nn.Linear(2, 2)
    compressed = _compressed_fp8(lin)
    missing = [n for n in PRIVATE if not hasattr(q, n) and not hasattr(compressed.weight_quantizer, n)]
    assert not missing, f"ModelOpt's TensorQuantizer no longer has {', '.join(missing)}: update quantizer_state"


def test_the_accessor_reads_what_the_quantizer_holds():
    x = torch.tensor([[1.0, -3.0, 0.25], [0.5, 2.0, -6.0]])
    q = calibrated(x, num_bits=8, axis=0)
    s = quantizer_state(q)
    assert s.enabled and s.num_bits == q._num_bits == 8 and s.unsigned is False and s.axis == q._axis == 0
    assert torch.equal(s.amax, q._amax) and s.amax.reshape(-1).tolist() == [3.0, 6.0]
    assert s.maxbound == 127.0 and s.block_sizes is None and s.pre_quant_scale is None and s.stored_pre_quant_scale is None
    assert (s.fake_quant, s.if_quant, s.if_calib, s.use_constant_amax, s.dynamic, s.rotate) == (True, True, False, False, False, False)
    assert s.backend is None and s.bias_calibration is False and s.scale is None

    set_quantizer(q, pre_quant_scale=torch.tensor([2.0, 4.0, 8.0]), scale=torch.tensor([[0.5], [0.25]]), enabled=False)
    s = quantizer_state(q)
    assert not s.enabled and q._disabled
    assert torch.equal(s.pre_quant_scale, q._pre_quant_scale) and s.pre_quant_scale.tolist() == [2.0, 4.0, 8.0]
    assert s.amax.reshape(-1).tolist() == [0.5 * 127, 0.25 * 127]  # a stored scale is amax / maxbound

    fp8 = quantizer_state(calibrated(x, num_bits=(4, 3), axis=None))
    assert fp8.num_bits == (4, 3) and fp8.maxbound == 448.0 and float(fp8.amax) == 6.0


def _compressed_fp8(lin: torch.nn.Module) -> torch.nn.Module:
    import copy

    import modelopt.torch.quantization as mtq

    from qval.config import QuantConfig
    from qval.quantize.modelopt_adapter import _quiet, build_mtq_config

    model = torch.nn.Sequential(copy.deepcopy(lin))
    cfg = build_mtq_config(QuantConfig(format="fp8", exclude=[]))
    with _quiet():
        mtq.quantize(model, cfg, forward_loop=lambda m: m(torch.randn(4, lin.in_features)))
    compress(model)
    return model[0]


def test_a_compressed_weight_s_scale_is_read():
    torch.manual_seed(0)
    m = _compressed_fp8(torch.nn.Linear(8, 4))
    s = quantizer_state(m.weight_quantizer)
    assert s.scale is not None and torch.equal(s.scale, m.weight_quantizer._scale)


def _modelopt_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        out += [f"{path.relative_to(QVAL.parent)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "modelopt"]
    return out


def test_only_the_adapter_imports_modelopt():
    found = [hit for p in sorted(QVAL.rglob("*.py")) if p != ADAPTER for hit in _modelopt_imports(p)]
    assert not found, "ModelOpt is reached through qval/quantize/modelopt_adapter.py only:\n" + "\n".join(found)
    assert _modelopt_imports(ADAPTER), "the scan finds nothing: it would pass anything"
