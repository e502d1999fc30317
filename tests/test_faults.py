"""The planted faults (qval/faults.py) on a tiny random Llama: each does what its line in the table
says, severity 0 is no damage, damage grows with severity, and the positional fault reaches every
path an engine runs (chunk logits, pieces through the KV cache, greedy decoding)."""

from __future__ import annotations

import copy

import pytest
import torch

from qval.engines.hf import HFEngine
from qval.faults import GRID, Fault, plant, stretch_positions


def tiny_llama(layers: int = 4) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, eos_token_id=1, pad_token_id=1, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


class Tok:
    pad_token_id = eos_token_id = 1


IDS = torch.randint(2, 64, (2, 96), generator=torch.Generator().manual_seed(1))


def kld(a: torch.Tensor, b: torch.Tensor) -> float:
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    return float((la.exp() * (la - lb)).sum(-1).mean())


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def changed(a: torch.nn.Module, b: torch.nn.Module) -> set[str]:
    sb = b.state_dict()
    return {k for k, v in a.state_dict().items() if not torch.equal(v, sb[k])}


@pytest.mark.parametrize("kind", sorted(GRID))
def test_severity_zero_changes_nothing_and_damage_grows(kind: str) -> None:
    base = tiny_llama()
    ref = logits(base)
    zero = copy.deepcopy(base)
    plant(zero, Fault(kind, 0.0, seed=3, start=48))
    assert torch.equal(logits(zero), ref)
    damage = []
    for s in (GRID[kind][0], GRID[kind][-1]):
        m = copy.deepcopy(base)
        plant(m, Fault(kind, s, seed=3, start=48))
        damage.append(kld(ref, logits(m)))
    assert 0 < damage[0] < damage[1], damage


def test_layer_scale_scales_one_layers_residual_writes() -> None:
    base = tiny_llama()
    m = copy.deepcopy(base)
    p = plant(m, Fault("layer_scale", 0.5, seed=7))
    diff = changed(base, m)
    layer = {k.split(".")[2] for k in diff}
    assert len(layer) == 1 and {k.split(".", 3)[3] for k in diff} == {"self_attn.o_proj.weight", "mlp.down_proj.weight"}
    k = next(iter(diff))
    assert torch.allclose(m.state_dict()[k], 1.5 * base.state_dict()[k])
    assert p.what.startswith(f"decoder layer {layer.pop()}'s")
    seeds = {next(iter(changed(base, plant_copy(base, Fault("layer_scale", 0.5, seed=s))))).split(".")[2] for s in range(12)}
    assert len(seeds) > 1  # the seed picks the layer


def plant_copy(base: torch.nn.Module, f: Fault) -> torch.nn.Module:
    m = copy.deepcopy(base)
    plant(m, f)
    return m


def test_weight_bits_rounds_about_the_fraction_to_a_4_bit_grid() -> None:
    base = tiny_llama()
    m = plant_copy(base, Fault("weight_bits", 0.3, seed=0))
    w0, w1 = base.model.layers[1].mlp.up_proj.weight, m.model.layers[1].mlp.up_proj.weight
    moved = (w0 != w1).float().mean().item()
    assert 0.2 < moved < 0.32  # 0.3 drawn, minus the weights already on their row's grid
    scale = w0.abs().amax(-1, keepdim=True) / 7
    on_grid = w1[w0 != w1] / scale.expand_as(w1)[w0 != w1]
    assert torch.allclose(on_grid, on_grid.round(), atol=1e-4)


def test_kv_scale_scales_keys_and_values_of_every_layer() -> None:
    base = tiny_llama()
    m = plant_copy(base, Fault("kv_scale", 0.25))
    assert changed(base, m) == {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(4) for p in "kv"}
    assert torch.allclose(m.model.layers[2].self_attn.v_proj.weight, 1.25 * base.model.layers[2].self_attn.v_proj.weight)


def test_stretched_positions() -> None:
    assert stretch_positions(torch.tensor([[510, 511, 512, 513, 600]]), 512, 0.5).tolist() == [[510.0, 511.0, 512.0, 513.5, 644.0]]


def test_late_positions_leave_early_positions_exact_on_every_engine_path() -> None:
    base = tiny_llama()
    ref, bad = HFEngine(base, Tok()), HFEngine(plant_copy(base, Fault("late_positions", 1.0, start=48)), Tok())
    a, b = ref.logits(IDS), bad.logits(IDS)
    assert torch.equal(a[:, :49], b[:, :49]) and (a[:, 50:] - b[:, 50:]).abs().amin(-1).gt(0).all()  # 48 + 0·2 = 48
    pa = torch.cat(list(ref.logits_pieces(IDS[:1], 32)), 1)
    pb = torch.cat(list(bad.logits_pieces(IDS[:1], 32)), 1)
    assert torch.allclose(pa[:, :49], pb[:, :49], atol=1e-5) and (pa[:, 50:] - pb[:, 50:]).abs().amax(-1).gt(1e-4).all()
    # a random tiny model's greedy choice barely depends on position: a large stretch shows the hook in decoding
    far = HFEngine(plant_copy(base, Fault("late_positions", 10.0, start=48)), Tok())
    prompt = [IDS[0, :40].tolist()]
    ga = ref.generate(prompt, 60, suppress_eos=True, batch_size=1).tokens[0]
    gb = far.generate(prompt, 60, suppress_eos=True, batch_size=1).tokens[0]
    # the first new token is predicted at position 39, the ninth at 47: all before the damage
    assert ga[:9] == gb[:9] and ga != gb


def test_a_bad_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        Fault("bit_flip", 0.1)
    with pytest.raises(ValueError, match="severity"):
        Fault("kv_scale", -0.1)
    with pytest.raises(ValueError, match="decoder layers"):
        plant(torch.nn.Linear(2, 2), Fault("kv_scale", 0.1))


def test_doctests() -> None:
    import doctest

    from qval import faults

    assert doctest.testmod(faults).failed == 0
