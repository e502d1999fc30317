"""The lean CPU forward of FP8 fake-quant linears (qval/engines/leanfp8.py) must be ModelOpt's
arithmetic exactly: bit-identical logits through a whole forward, through the KV cache and in
greedy generation; and its build-time self-check must refuse a forward that is not."""

from __future__ import annotations

import pytest
import torch

from tests.engines.calibrated import build_context, calibrated_state, gate_config
from tests.engines import triton_helpers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(default_model, tmp_path_factory):
    """The FP8 fakequant engine as qval builds it (lean forwards) and the same engine with
    ModelOpt's forwards put back."""
    from qval.engines import BUILDERS
    from qval.engines.fakequant import FakeQuantEngine
    from qval.engines.leanfp8 import _restore

    state = calibrated_state(default_model, "fp8", "fp8")  # FP8 KV cache too: the bmm quantizers stay ModelOpt's
    cfg = gate_config("lean", "fp8", kv="fp8")
    ctx = build_context(default_model, cfg, state, tmp_path_factory.mktemp("lean"))
    lean = BUILDERS.get("fakequant")(ctx)
    plain = BUILDERS.get("fakequant")(ctx)
    mods = [m for m in plain.model.modules() if hasattr(m.forward, "modelopt_forward")]
    _restore(mods)
    return lean, FakeQuantEngine(plain.model, plain.tokenizer), len(mods)


def test_every_fp8_linear_takes_the_lean_path(pair):
    lean, _, count = pair
    assert count == 210  # 30 layers × q, k, v, o, gate, up, down; lm_head is excluded
    assert any("210 FP8 linears run a lean CPU forward" in n for n in lean.describe()["notes"])


def test_logits_pieces_and_generation_are_bit_identical(pair, default_model):
    lean, plain, _ = pair
    tok = default_model.tokenizer
    ids = torch.tensor([tok("The committee published its report on Tuesday, and the members")["input_ids"]] * 2)
    assert torch.equal(lean.logits(ids), plain.logits(ids))
    for a, b in zip(lean.logits_pieces(ids, 5), plain.logits_pieces(ids, 5)):
        assert torch.equal(a, b)
    prompts = [tok(p)["input_ids"] for p in ("Once upon a time", "def fibonacci(n):", "The capital of France is")]
    ga = lean.generate(prompts, 24, suppress_eos=True, batch_size=3)
    gb = plain.generate(prompts, 24, suppress_eos=True, batch_size=3)
    assert ga.tokens == gb.tokens


def test_self_check_refuses_a_forward_that_differs(default_model, tmp_path, monkeypatch):
    from qval.engines import BUILDERS, leanfp8

    monkeypatch.setattr(leanfp8, "FP8_MAX", 447.0)  # a wrong scale: logits change
    state = calibrated_state(default_model, "fp8", "fp16")
    eng = BUILDERS.get("fakequant")(build_context(default_model, gate_config("lean-bad", "fp8"), state, tmp_path))
    notes = eng.describe()["notes"]
    assert any("not bit-identical" in n and "ModelOpt's forward kept" in n for n in notes), notes
    assert not any(hasattr(m.forward, "modelopt_forward") for m in eng.model.modules())


def test_in_the_decode_step_qkv_and_gate_up_share_one_quantized_input_and_one_launch(pair, monkeypatch):
    """Inside the static decoder's step (FusedStep.installed) the FP8 candidate's q/k/v, whose input
    scales ModelOpt calibrated on the same input, run behind one quantizer in one gemv.py launch (the
    k and v projections' calls take its outputs), gate/up behind one with SiLU·mul; o and down one
    launch each. gemv.py's kernels are Triton (GPU): stand-ins with F.linear's arithmetic here, so the
    routing is what is checked, and the logits must equal the per-linear lean step's exactly."""
    from qval.engines import fused_step, gemv, leanfp8

    lean, _, _ = pair
    model = lean.model
    step = fused_step.FusedStep(model, {})
    groups = sum(leanfp8.QKV in m.__dict__ for m in model.modules()), sum(leanfp8.GATE_UP in m.__dict__ for m in model.modules())
    assert groups == (30, 30)
    launches: list = []

    grouped, gate_up_silu = triton_helpers.gemv_standins(launches)

    monkeypatch.setattr(fused_step, "compiled", lambda name: fused_step.EAGER[name])
    ids = torch.tensor([[5, 17, 99, 4], [7, 7, 300, 2]])
    with torch.no_grad(), step.installed():
        want = model(input_ids=ids, use_cache=False).logits  # gemv.usable is False on a CPU: per-linear lean products
        assert launches == []
        monkeypatch.setattr(gemv, "usable", lambda x, ws: True)
        monkeypatch.setattr(gemv, "grouped", grouped)
        monkeypatch.setattr(gemv, "gate_up_silu", gate_up_silu)
        got = model(input_ids=ids, use_cache=False).logits
    assert launches == [(576, 192, 192), (576,), ("gate_up", 1536), (576,)] * 30  # the lm_head: not an FP8 linear
    assert torch.equal(got, want)
