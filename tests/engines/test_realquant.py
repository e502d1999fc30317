"""realquant on a CPU: weights really stored in low precision, FP8 GEMMs through
torch._scaled_mm, every fallback named; outputs close to the fake-quant candidate."""

from __future__ import annotations

import pytest
import torch

from tests.engines.calibrated import build_context, calibrated_state, gate_config


def test_cpu_fp8_gemm_agrees_with_dequantized_matmul():
    """The same FP8 operands multiplied by torch._scaled_mm and by a plain float32 matmul."""
    from qval.engines.realquant import cpu_fp8_gemm

    torch.manual_seed(0)
    x, w = torch.randn(3, 5, 32), torch.randn(16, 32)
    sw, sx = w.abs().max() / 448, x.abs().max() / 448
    w8 = (w / sw).to(torch.float8_e4m3fn)
    out = cpu_fp8_gemm(x, w8, sw, x.abs().max(), torch.ones(16))
    x8 = (x / sx).clamp(-448, 448).to(torch.float8_e4m3fn)
    ref = (x8.float() * sx) @ (w8.float() * sw).t() + 1
    assert out.shape == (3, 5, 16)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fp8_realquant_on_cpu(default_model, tmp_path):
    """Default on a CPU: FP8 storage, emulated GEMM (named as such); then the same engine routed
    through torch._scaled_mm. Both stay close to the fake-quant candidate."""
    from qval.engines import BUILDERS
    from qval.engines.realquant import install_cpu_fp8

    state = calibrated_state(default_model, "fp8")
    rq = BUILDERS.get("realquant")(build_context(default_model, gate_config("rq", "fp8", engine={"backend": "realquant"}), state, tmp_path))
    fq = BUILDERS.get("fakequant")(build_context(default_model, gate_config("fq", "fp8"), state, tmp_path))
    ids = torch.tensor([default_model.tokenizer("A quantized model should still know that water boils at")["input_ids"]])
    a = fq.logits(ids)[0]
    d = rq.describe()
    assert d["weight_storage"] == {"float8_e4m3fn": 210}
    assert d["gemms"] == {"dequantize + float GEMM (emulated)": 210}
    assert any("210 quantized linears fell back to emulation" in n for n in d["notes"])
    emulated = rq.logits(ids)[0]
    assert install_cpu_fp8(rq.model) == 210
    b = rq.logits(ids)[0]
    assert rq.describe()["gemms"] == {"FP8 torch._scaled_mm on CPU (float32 arithmetic inside the kernel)": 210}
    for other in (emulated, b):
        kld = (a.log_softmax(-1).exp() * (a.log_softmax(-1) - other.log_softmax(-1))).sum(-1)
        # same calibrated scales; they differ only where a value sits on a rounding midpoint
        assert float(kld.mean()) < 0.05 and float((a.argmax(-1) == other.argmax(-1)).float().mean()) >= 0.75


@pytest.mark.slow
def test_int4_realquant_names_its_emulation(default_model, tmp_path):
    from qval.engines import BUILDERS

    state = calibrated_state(default_model, "int4_awq")
    cfg = gate_config("rq4", "int4_awq", engine={"backend": "realquant"})
    rq = BUILDERS.get("realquant")(build_context(default_model, cfg, state, tmp_path))
    ids = torch.tensor([default_model.tokenizer("Short input")["input_ids"]])
    assert bool(torch.isfinite(rq.logits(ids)).all())
    d = rq.describe()
    assert sum(d["weight_storage"].values()) == 210 and "float32" not in d["weight_storage"]
    assert d["gemms"] == {"dequantize + float GEMM (emulated)": 210}
    assert any("210 quantized linears fell back to emulation" in n for n in d["notes"])


def test_realquant_refuses_format_none(default_model, tmp_path):
    from qval.engines import BUILDERS
    from qval.errors import StageError

    cfg = gate_config("rq-none", "none", engine={"backend": "realquant"})
    with pytest.raises(StageError, match="nothing to compress"):
        BUILDERS.get("realquant")(build_context(default_model, cfg, None, tmp_path))
