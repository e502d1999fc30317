"""Sensitivity ranking on the toy model: the planted fault comes first, and nothing is left switched off."""

from __future__ import annotations

import pytest
import torch

from qval.diagnostics import sensitivity
from qval.quantize.modelopt_adapter import iter_quantizers

from . import toy


def chunks(n: int = 4, ctx: int = 48, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, toy.VOCAB, (n, ctx), generator=g).tolist()


@pytest.fixture(scope="module")
def faulted():
    reference, cand, _ = toy.quantized("int8_sq")
    for proj in ("up_proj", "down_proj"):  # layer 2's weight scales × 8
        q = getattr(cand.model.layers[2].mlp, proj).weight_quantizer
        q.amax = q.amax * 8
    scorer = sensitivity.SliceScorer(lambda x: reference(input_ids=x).logits, chunks(), "cpu", batch_size=3)
    quantizers = dict(iter_quantizers(cand))
    with torch.no_grad():
        result = sensitivity.rank(cand, quantizers, scorer)
    return reference, cand, quantizers, scorer, result


def test_planted_fault_tops_the_layer_ranking(faulted):
    _, _, _, scorer, result = faulted
    layers = result["layers"]
    assert [e["name"] for e in layers][0] == "model.layers.2"
    top, second = layers[0]["delta_kld"], layers[1]["delta_kld"]
    assert top["value"] > 2 * second["value"] and top["value"] > 3 * top["stderr"]
    assert layers[0]["exclude"] == "*model.layers.2.*" and layers[0]["quantizers"] == 4
    assert result["positions"] == 4 * (48 - 24 - 1) and result["base_nonfinite"] == 0
    assert 0 < layers[0]["recovered"] <= 1.0 + 1e-9
    assert {e["name"] for e in result["parts"]} == {"mlp.up_proj", "mlp.down_proj"}


def test_figures_are_kld_differences(faulted):
    """Independent check of one entry: switch layer 2 off by hand and score it directly."""
    _, cand, quantizers, scorer, result = faulted
    base = scorer.kld(cand).mean()
    assert result["base_kld"]["value"] == pytest.approx(base, rel=1e-9)
    names = [n for n in quantizers if n.startswith("model.layers.2.") and quantizers[n].is_enabled]
    for n in names:
        quantizers[n].disable()
    restored = scorer.kld(cand).mean()
    for n in names:
        quantizers[n].enable()
    top = result["layers"][0]
    assert top["kld_restored"] == pytest.approx(restored, rel=1e-9)
    assert top["delta_kld"]["value"] == pytest.approx(base - restored, rel=1e-9)


def test_rank_leaves_every_quantizer_as_it_was(faulted):
    _, cand, quantizers, _, _ = faulted
    enabled = {n for n, q in quantizers.items() if q.is_enabled}
    assert len(enabled) == toy.LAYERS * 4
    assert sensitivity.steps(quantizers) == toy.LAYERS + 2


def test_identity_candidate_has_zero_kld():
    reference = toy.ToyLM().eval()
    scorer = sensitivity.SliceScorer(lambda x: reference(input_ids=x).logits, chunks(2), "cpu")
    assert float(abs(scorer.kld(reference)).max()) < 1e-6


def test_folded_weights_give_the_live_logits_and_restore_exactly():
    from qval.diagnostics.folding import FoldedWeights

    reference, cand, data = toy.quantized("fp8")
    quantizers = {n: q for n, q in iter_quantizers(cand) if q.is_enabled}
    weights = {n: q for n, q in quantizers.items() if n.endswith("weight_quantizer")}
    x = data[0]
    with torch.no_grad():
        live = cand(input_ids=x).logits
        before = {n: cand.get_submodule(n.rpartition(".")[0]).weight.clone() for n in weights}
        with FoldedWeights(cand, quantizers) as fw:
            assert set(fw.entries) == set(weights) and not any(q.is_enabled for q in weights.values())
            assert torch.equal(cand(input_ids=x).logits, live)  # quantized once == quantized every forward
            fw.high("model.layers.1.mlp.up_proj.weight_quantizer")
            swapped = cand(input_ids=x).logits
        weights["model.layers.1.mlp.up_proj.weight_quantizer"].disable()
        assert torch.equal(cand(input_ids=x).logits, swapped)  # high == that quantizer switched off
        weights["model.layers.1.mlp.up_proj.weight_quantizer"].enable()
        assert torch.equal(cand(input_ids=x).logits, live)
    assert all(q.is_enabled for q in quantizers.values())
    for n in weights:
        assert torch.equal(cand.get_submodule(n.rpartition(".")[0]).weight, before[n])
