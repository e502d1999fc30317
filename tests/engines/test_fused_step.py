"""The static decoder's fused step (qval/engines/fused_step.py): it takes only the module classes it
knows, installs on the model instance for one step and leaves nothing behind, computes what the
eager code computes (the fused functions held to each known class's own forward), and decodes the
plain path's greedy tokens on the built-in model."""

from __future__ import annotations

import pytest
import torch

from qval.engines import decode_attention, fused_step
from qval.engines.fused_step import FusedStep
from qval.engines.hf import HFEngine, StaticDecoder
from tests.engines import triton_helpers


def tiny_llama(act: str = "silu", attention: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, eos_token_id=1, pad_token_id=1, bos_token_id=1,
                      hidden_act=act)
    model = LlamaForCausalLM(cfg).eval()
    if attention == decode_attention.NAME:
        decode_attention.install(model)
    return model


def eager(monkeypatch):
    """The fused functions in their eager form (transformers' arithmetic), each call recorded."""
    calls: list[str] = []
    monkeypatch.setattr(fused_step, "compiled", lambda name: (lambda *a: (calls.append(name), fused_step.EAGER[name](*a))[1]))
    return calls


def test_the_plan_takes_llamas_norms_mlps_attention_and_linears_and_nothing_else():
    model = tiny_llama(attention=decode_attention.NAME)
    counts = FusedStep(model, {}).counts
    # rmsnorm: 2 per layer + the final one; rope: Llama's attention (the runtime's attention on the model); linears:
    # q, k, v, o, gate, up, down per layer and the lm_head
    assert counts == {"rmsnorm": 2 * 2 + 1, "mlp": 2, "rope": 2, "linears": 7 * 2 + 1, "qkv_groups": 2}
    assert FusedStep(tiny_llama(act="gelu"), {}).counts["mlp"] == 0  # its MLP is not SiLU·mul: left eager
    assert FusedStep(tiny_llama(), {}).counts["rope"] == 0  # transformers' own attention: its rotary stays eager

    class OtherNorm(torch.nn.Module):  # an RMSNorm with other arithmetic (Gemma's 1 + weight): an unknown class
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.zeros(8)), 1e-6

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            h = hidden_states.float()
            return (1 + self.weight) * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class Subclassed(LlamaRMSNorm):  # a subclass (not ModelOpt's wrapper) may change the arithmetic: not taken
        pass

    other = torch.nn.Sequential(OtherNorm(), Subclassed(8))
    other.config = model.config
    assert FusedStep(other, {}).counts["rmsnorm"] == 0


def test_each_known_class_computes_the_fused_functions_eager_arithmetic():
    """What replaces source-text recognition: every class in the table, built by transformers, gives
    on random inputs exactly what the fused function's eager form gives (a transformers upgrade that
    changes one fails here, naming it)."""
    from transformers import AutoConfig

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 32, generator=g).to(torch.bfloat16)
    for cls, kind in fused_step.known_classes().items():
        family = cls.__module__.rsplit(".", 1)[-1].removeprefix("modeling_")
        cfg = AutoConfig.for_model(family, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=8, hidden_act="silu")
        if kind == "rmsnorm":
            m = cls(32, eps=1e-5).to(torch.bfloat16)
            torch.nn.init.normal_(m.weight, generator=g)
            assert torch.equal(m(x), fused_step.EAGER["rms"](x, m.weight, float(m.variance_epsilon))), cls
        elif kind == "mlp":
            m = cls(cfg).to(torch.bfloat16)
            want = m.down_proj(fused_step.EAGER["silu_mul"](m.gate_proj(x), m.up_proj(x)))
            assert torch.equal(m(x), want), cls


def test_installed_for_a_step_only_and_the_eager_code_runs_bit_for_bit(monkeypatch):
    model = tiny_llama(attention=decode_attention.NAME)
    ids = torch.randint(2, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    calls = eager(monkeypatch)
    step = FusedStep(model, {})
    with torch.no_grad():
        want = model(ids).logits
        assert calls == [] and not any("forward" in m.__dict__ for m in model.modules())
        with step.installed():
            inside = model(ids).logits
            assert sum("forward" in m.__dict__ for m in model.modules()) == sum(step.counts.values()) - step.counts["qkv_groups"]
        assert set(calls) == {"rms", "rope", "silu_mul"}
        assert not any("forward" in m.__dict__ for m in model.modules())  # nothing left on the instance
        calls.clear()
        assert torch.equal(model(ids).logits, want) and calls == []
    assert torch.equal(inside, want)  # the eager forms of the fused functions are transformers' arithmetic


def test_a_model_copied_during_or_after_a_step_runs_its_own_weights():
    """A candidate is built from a deep copy of the reference, possibly after the reference has
    decoded through the fused step: the copy must compute with its own modules (an instance-bound
    wrapper left on the reference would call the original's MLP in the copy)."""
    import copy

    model = tiny_llama()
    step = FusedStep(model, {})
    with torch.no_grad(), step.installed():
        model(torch.tensor([[3, 4]]))
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
        with FusedStep(twin, {}).installed():
            torch.testing.assert_close(twin(ids).logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_functions_compute_the_eager_arithmetic_bit_for_bit(dtype):
    """Compiled by inductor on this CPU (the same graph the GPU's Triton kernels are generated
    from), intermediates rounded where eager rounds them: in bfloat16 the eager logits exactly
    (without emulate_precision_casts they differ by up to 2e-3: checked); in float32 within a
    float32 rounding (the RMSNorm's mean sums in another order than ATen's kernel, 7e-7 apart)."""
    model = tiny_llama(attention=decode_attention.NAME).to(dtype)
    ids = torch.randint(2, 64, (3, 7), generator=torch.Generator().manual_seed(2))
    failures: dict[str, str] = {}
    with torch.no_grad():
        want = model(ids).logits
        with FusedStep(model, failures).installed():
            got = model(ids).logits
    assert not failures, failures
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_compiler_that_fails_falls_back_to_eager_and_says_so(monkeypatch):
    model = tiny_llama(attention=decode_attention.NAME)

    def broken(*a, **k):
        raise RuntimeError("no C compiler here\nsecond line")

    monkeypatch.setattr(fused_step, "compiled", lambda name: broken)
    ids = torch.randint(2, 64, (1, 5), generator=torch.Generator().manual_seed(3))
    failures: dict[str, str] = {}
    with torch.no_grad():
        want = model(ids).logits
        with FusedStep(model, failures).installed():
            got = model(ids).logits
    assert torch.equal(got, want)
    assert failures == {k: "RuntimeError: no C compiler here" for k in ("rms", "rope", "silu_mul")}


@pytest.mark.slow
def test_fused_static_decode_gives_the_plain_paths_greedy_tokens_on_the_real_model(default_model):
    tok = default_model.tokenizer
    prompts = ["The capital of France is", "Write a short poem about the sea", "Hello there, how"]
    ids = [tok(p)["input_ids"] for p in prompts]
    plain = HFEngine(default_model.model, tok, decode="plain").generate(ids, 16, suppress_eos=True, batch_size=3)
    fused = HFEngine(default_model.model, tok, decode="static")
    fused.static_fused = True
    got = fused.generate(ids, 16, suppress_eos=True, batch_size=3)
    assert not fused.runtime.failures, fused.runtime.failures
    assert fused.describe()["decode_fused"] == {"rmsnorm": 61, "mlp": 30, "rope": 30, "linears": 211, "qkv_groups": 30}
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

    model = tiny_llama(attention=decode_attention.NAME)
    launches: list[tuple[int, ...]] = []

    grouped, gate_up_silu = triton_helpers.gemv_standins(launches)

    monkeypatch.setattr(gemv, "usable", lambda x, ws: x.numel() == x.shape[-1])
    monkeypatch.setattr(gemv, "grouped", grouped)
    monkeypatch.setattr(gemv, "gate_up_silu", gate_up_silu)
    eager(monkeypatch)
    step = FusedStep(model, {})
    one = torch.tensor([[5]])
    with torch.no_grad():
        want = model(one).logits
        assert launches == []  # outside a step: transformers' products
        with step.installed():
            got = model(one).logits
        # per layer: q/k/v (32 + 16 + 16 rows) in one launch, o, gate/up/SiLU in one, down; then lm_head
        assert launches == [(32, 16, 16), (32,), ("gate_up", 64), (32,)] * 2 + [(64,)]
        assert torch.equal(got, want)
        launches.clear()
        with step.installed():
            model(torch.tensor([[5, 6]]))  # two positions: not a GEMV
        assert launches == []
        twin = copy.deepcopy(model)  # a copy plans its own modules
        with FusedStep(twin, {}).installed():
            torch.nn.init.zeros_(twin.lm_head.weight)
            assert torch.equal(twin(one).logits, torch.zeros_like(want))
        with step.installed():
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
