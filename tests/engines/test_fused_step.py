"""The static decoder's fused element-wise step (qval/engines/fused_step.py): it wraps only the code
it recognises, changes nothing outside a decode step on the decoding thread, computes what the
eager code computes, and decodes the plain path's greedy tokens on the built-in model."""

from __future__ import annotations

import threading

import pytest
import torch

from qval.engines import fused_step
from qval.engines.hf import HFEngine, StaticDecoder
from tests.engines import triton_helpers


def tiny_llama(act: str = "silu"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, eos_token_id=1, pad_token_id=1, bos_token_id=1,
                      hidden_act=act)
    return LlamaForCausalLM(cfg).eval()


def test_install_wraps_llamas_norms_mlps_and_rotary_and_nothing_else():
    model = tiny_llama()
    counts = fused_step.install(model)
    assert counts == {"rmsnorm": 2 * 2 + 1, "mlp": 2, "rope_modules": 1, "qkv_groups": 2}
    assert fused_step.install(model) == counts  # idempotent: nothing wrapped twice
    gelu = tiny_llama(act="gelu")
    assert fused_step.install(gelu)["mlp"] == 0  # its MLP is not SiLU·mul: left eager

    class OtherNorm(torch.nn.Module):  # an RMSNorm with other arithmetic (Gemma's 1 + weight)
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.zeros(8)), 1e-6

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            h = hidden_states.float()
            return (1 + self.weight) * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    other = torch.nn.Sequential(OtherNorm())
    other.config = model.config
    assert fused_step.install(other)["rmsnorm"] == 0


def test_outside_a_decode_step_and_on_other_threads_the_eager_code_runs_bit_for_bit(monkeypatch):
    model = tiny_llama()
    ids = torch.randint(2, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        fused_step.install(model)
        calls = []
        monkeypatch.setattr(fused_step, "_call", lambda name, eager, *a: (calls.append(name), eager(*a))[1])
        assert torch.equal(model(ids).logits, want) and calls == []
        seen: list[bool] = []
        with fused_step.active():
            t = threading.Thread(target=lambda: seen.append(torch.equal(model(ids).logits, want)))
            t.start()
            t.join()
            assert calls == []  # the other thread ran transformers' code
            inside = model(ids).logits
        assert seen == [True]
        assert set(calls) == {"rms", "rope", "silu_mul"}
        # the eager forms of the fused functions are transformers' arithmetic
        assert torch.equal(inside, want)


def test_a_model_copied_after_install_runs_its_own_weights():
    """A candidate is built from a deep copy of the reference, possibly after the reference has
    decoded through the fused step: the copy must compute with its own modules, fused or not
    (an instance-bound wrapper would call the original's MLP: the candidate's quantized MLPs
    skipped, uncalibrated, the reference's run in their place)."""
    import copy

    model = tiny_llama()
    fused_step.install(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.model.layers[0].mlp.parameters():
            p.mul_(3.0)
        fresh = tiny_llama()
        fresh.load_state_dict(twin.state_dict())
        ids = torch.randint(2, 64, (2, 6), generator=torch.Generator().manual_seed(4))
        want = fresh(ids).logits
        assert not torch.equal(model(ids).logits, want)
        assert torch.equal(twin(ids).logits, want)
        with fused_step.active():
            torch.testing.assert_close(twin(ids).logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_functions_compute_the_eager_arithmetic_bit_for_bit(dtype):
    """Compiled by inductor on this CPU (the same graph the GPU's Triton kernels are generated
    from), intermediates rounded where eager rounds them: in bfloat16 the eager logits exactly
    (without emulate_precision_casts they differ by up to 2e-3: checked); in float32 within a
    float32 rounding (the RMSNorm's mean sums in another order than ATen's kernel, 7e-7 apart)."""
    model = tiny_llama().to(dtype)
    ids = torch.randint(2, 64, (3, 7), generator=torch.Generator().manual_seed(2))
    fused_step.install(model)
    with torch.no_grad():
        want = model(ids).logits
        with fused_step.active():
            got = model(ids).logits
    assert not fused_step.failures(), fused_step.failures()
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_compiler_that_fails_falls_back_to_eager_and_says_so(monkeypatch):
    model = tiny_llama()
    fused_step.install(model)

    def broken(*a, **k):
        raise RuntimeError("no C compiler here\nsecond line")

    monkeypatch.setattr(fused_step, "_compiled", {"rms": broken, "rope": broken, "silu_mul": broken})
    monkeypatch.setattr(fused_step, "_failed", {})
    ids = torch.randint(2, 64, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        with fused_step.active():
            got = model(ids).logits
    assert torch.equal(got, want)
    assert fused_step.failures() == {k: "RuntimeError: no C compiler here" for k in ("rms", "rope", "silu_mul")}


@pytest.mark.slow
def test_fused_static_decode_gives_the_plain_paths_greedy_tokens_on_the_real_model(default_model):
    tok = default_model.tokenizer
    prompts = ["The capital of France is", "Write a short poem about the sea", "Hello there, how"]
    ids = [tok(p)["input_ids"] for p in prompts]
    plain = HFEngine(default_model.model, tok, decode="plain").generate(ids, 16, suppress_eos=True, batch_size=3)
    fused = HFEngine(default_model.model, tok, decode="static")
    fused.static_fused = True
    got = fused.generate(ids, 16, suppress_eos=True, batch_size=3)
    assert not fused_step.failures(), fused_step.failures()
    assert fused.describe()["decode_fused"] == {"rmsnorm": 61, "mlp": 30, "rope_modules": 1, "qkv_groups": 30}
    assert got.tokens == plain.tokens


def test_the_decoder_is_rebuilt_when_fusion_is_switched():
    model = tiny_llama()
    dec = StaticDecoder(model, batch=1, max_len=16, new_tokens=4, eos=[1], suppress_eos=True, use_graph=False, fused=True)
    assert dec.fits(1, 16, 4, [1], True, True, True) and not dec.fits(1, 16, 4, [1], True, True, False)


def test_one_row_steps_take_the_gemv_kernels_qkv_in_one_launch(monkeypatch):
    """At one row (a batch-1 decode step) the plain linears go to qval/engines/gemv.py: q/k/v as one
    grouped launch whose k and v outputs serve the k and v projections' own calls, gate/up/SiLU·mul
    as one; a quantized subclass, a bias, what `usable` refuses (the stand-in here: two rows; the real
    one takes 1 to 16 rows of a CUDA tensor) or a call outside the step keep their own product. The
    kernels are Triton (GPU only): here stand-ins with F.linear's arithmetic, so the routing is what
    is checked, and the step's logits must be the eager ones."""
    import copy

    from qval.engines import gemv

    model = tiny_llama()
    fused_step.install(model)
    launches: list[tuple[int, ...]] = []

    grouped, gate_up_silu = triton_helpers.gemv_standins(launches)

    monkeypatch.setattr(gemv, "usable", lambda x, ws: x.numel() == x.shape[-1])
    monkeypatch.setattr(gemv, "grouped", grouped)
    monkeypatch.setattr(gemv, "gate_up_silu", gate_up_silu)
    monkeypatch.setattr(fused_step, "_call", lambda name, eager, *a: eager(*a))
    one = torch.tensor([[5]])
    with torch.no_grad():
        want = model(one).logits
        assert launches == []  # outside a step: transformers' products
        with fused_step.active():
            got = model(one).logits
        # per layer: q/k/v (32 + 16 + 16 rows) in one launch, o, gate/up/SiLU in one, down; then lm_head
        assert launches == [(32, 16, 16), (32,), ("gate_up", 64), (32,)] * 2 + [(64,)]
        assert torch.equal(got, want)
        launches.clear()
        with fused_step.active():
            model(torch.tensor([[5, 6]]))  # two positions: not a GEMV
        assert launches == []
        twin = copy.deepcopy(model)
        for a, b in zip(model.model.layers, twin.model.layers):  # the copy's group is its own modules
            assert b.self_attn.q_proj._qval_qkv == (b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj)
            assert all(x is not y for x, y in zip(a.self_attn.q_proj._qval_qkv, b.self_attn.q_proj._qval_qkv))
        with torch.no_grad(), fused_step.active():
            torch.nn.init.zeros_(twin.lm_head.weight)
            assert torch.equal(twin(one).logits, torch.zeros_like(want))
            assert torch.equal(model(one).logits, want)


def test_fp8_projections_share_a_quantizer_only_with_bit_equal_scales_and_no_bias():
    """leanfp8._shared: q/k/v (or gate/up) are grouped behind one quantized input only when every one
    is a lean FP8 linear without bias, of one input size, with bit-equal input scales."""
    from types import SimpleNamespace

    from qval.engines import leanfp8

    def lin(scale, bias=None, k=8):
        def forward(x):
            return x
        forward.lean = (None, torch.tensor(scale), torch.zeros(4, k), bias)
        return SimpleNamespace(forward=forward)

    assert leanfp8._shared([lin(2.5), lin(2.5), lin(2.5)])
    assert not leanfp8._shared([lin(2.5), lin(2.5), lin(2.5000002)])  # one ulp apart: a different quantized input
    assert not leanfp8._shared([lin(2.5), lin(2.5, bias=torch.zeros(4))])
    assert not leanfp8._shared([lin(2.5), lin(2.5, k=16)])
    assert not leanfp8._shared([lin(2.5), SimpleNamespace(forward=lambda x: x)])  # ModelOpt's own forward
