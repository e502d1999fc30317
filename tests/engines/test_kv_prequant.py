"""A quantized KV cache quantized once per token, as it enters the cache (qval/engines/kvcache.py),
must give exactly ModelOpt's logits (whose plugin re-quantizes the whole cache every step):
bit-identical through the KV cache, across the growing cache's reallocation, and in greedy
generation; the build-time self-check must refuse an entry quantization that is not."""

from __future__ import annotations

import pytest
import torch

from tests.engines.calibrated import build_context, calibrated_state, gate_config


@pytest.fixture(scope="module")
def fp8_kv_engine(default_model, tmp_path_factory):
    from qval.engines import BUILDERS

    state = calibrated_state(default_model, "fp8", "fp8")
    cfg = gate_config("kvpre", "fp8", kv="fp8")
    return BUILDERS.get("fakequant")(build_context(default_model, cfg, state, tmp_path_factory.mktemp("kvpre")))


def modelopt_path(engine):
    """The same model without entry quantization: its quantizers then see unmarked K/V and
    quantize the whole cache every step, as ModelOpt does."""
    from qval.engines.fakequant import FakeQuantEngine

    return FakeQuantEngine(engine.model, engine.tokenizer)


def test_every_layer_quantizes_on_entry(fp8_kv_engine):
    assert sorted(fp8_kv_engine.kv_quantizers) == list(range(30))
    k, v = fp8_kv_engine.kv_quantizers[0]
    assert k is fp8_kv_engine.model.model.layers[0].self_attn.k_bmm_quantizer and v.is_enabled
    assert any("KV cache of 30 layers quantized once per token" in n for n in fp8_kv_engine.describe()["notes"])


@pytest.mark.slow
def test_bit_identical_through_the_cache_and_in_generation(fp8_kv_engine, default_model):
    plain = modelopt_path(fp8_kv_engine)
    tok = default_model.tokenizer
    text = " ".join(["The committee published its report on Tuesday, and the members met again."] * 24)
    ids = torch.tensor([tok(text)["input_ids"][:300]] * 2)  # 300 > 256: the cache reallocates on the way
    for a, b in zip(fp8_kv_engine.logits_pieces(ids, 64), plain.logits_pieces(ids, 64), strict=True):
        assert torch.equal(a, b)
    prompts = [tok(p)["input_ids"] for p in ("Once upon a time", "def fibonacci(n):", "The capital of France is")]
    ga = fp8_kv_engine.generate(prompts, 32, suppress_eos=True, batch_size=3)
    gb = plain.generate(prompts, 32, suppress_eos=True, batch_size=3)
    assert ga.tokens == gb.tokens


def test_kv_fp16_candidate_has_nothing_to_move(default_model, tmp_path):
    from qval.engines import BUILDERS

    state = calibrated_state(default_model, "fp8", "fp16")
    eng = BUILDERS.get("fakequant")(build_context(default_model, gate_config("kvpre16", "fp8"), state, tmp_path))
    assert eng.kv_quantizers == {}
    assert not any("cache" in n and "entry" in n for n in eng.describe()["notes"])


def test_self_check_refuses_an_entry_quantization_that_differs(default_model, tmp_path, monkeypatch):
    from qval.engines import BUILDERS, kvcache

    def off_by_a_little(self, inputs, *args, **kwargs):  # marked K/V scaled: the logits move
        if getattr(inputs, kvcache.PREQUANTIZED, False):
            return inputs * 1.01
        return type(self).forward(self, inputs, *args, **kwargs)

    monkeypatch.setattr(kvcache, "_pass_prequantized", off_by_a_little)
    state = calibrated_state(default_model, "fp8", "fp8")
    eng = BUILDERS.get("fakequant")(build_context(default_model, gate_config("kvpre-bad", "fp8", kv="fp8"), state, tmp_path))
    assert eng.kv_quantizers == {}
    assert any("not bit-identical" in n and "kept ModelOpt's" in n for n in eng.describe()["notes"])
    attn = eng.model.model.layers[0].self_attn
    assert "forward" not in attn.k_bmm_quantizer.__dict__ and "forward" not in attn.v_bmm_quantizer.__dict__


def test_only_static_element_wise_quantizers_move():
    from modelopt.torch.quantization.nn import TensorQuantizer

    from qval.engines.kvcache import kv_entry_quantizers

    def quantizer(amax=1.0, enabled=True, dynamic=False, block_sizes=None):
        q = TensorQuantizer()
        if amax is not None:
            q.amax = torch.tensor(amax)
        if dynamic:
            q._dynamic = True
        if block_sizes:
            q.block_sizes = block_sizes
        if not enabled:
            q.disable()
        return q

    def attention(idx, k, v):
        m = torch.nn.Module()
        m.layer_idx, m.k_bmm_quantizer, m.v_bmm_quantizer = idx, k, v
        return m

    good = torch.nn.ModuleList([attention(0, quantizer(), quantizer()), attention(1, quantizer(), quantizer(enabled=False))])
    found, why = kv_entry_quantizers(good)
    assert why is None and set(found) == {0, 1} and found[1][1] is None
    for bad, words in ((quantizer(amax=None), "not static"), (quantizer(dynamic=True), "not static"),
                       (quantizer(block_sizes={-1: 16}), "not static")):
        found, why = kv_entry_quantizers(torch.nn.ModuleList([attention(0, quantizer(), bad)]))
        assert found == {} and words in why
    found, why = kv_entry_quantizers(torch.nn.ModuleList([attention(0, quantizer(), quantizer()), attention(0, quantizer(), quantizer())]))
    assert found == {} and "layer_idx" in why


def test_not_on_a_gpu(fp8_kv_engine, monkeypatch):
    """On the H200 the entry path changed greedy tokens of a padded batch and was slower
    (benchmarks/RESULTS.md §8): a GPU engine keeps ModelOpt's path."""
    from qval.engines.fakequant import FakeQuantEngine

    eng = FakeQuantEngine(fp8_kv_engine.model, fp8_kv_engine.tokenizer)
    monkeypatch.setattr(FakeQuantEngine, "device", property(lambda self: "cuda:0"))
    eng.prequantize_kv()
    assert eng.kv_quantizers == {} and eng.notes == []
