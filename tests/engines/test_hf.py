"""HFEngine's two greedy-decoding paths: the static-cache path (CUDA-graph replayed on a GPU)
must emit exactly the tokens of transformers' `generate`, and both must see the model's own
logits when checking them for NaN/Inf."""

from __future__ import annotations

import pytest
import torch

from qval.engines.hf import HFEngine, StaticDecoder, left_pad, split_rows

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea and the wind that moves it",  # answers EOS at once without a template
    "Hello there, how",
]


def both_paths(model, tokenizer, prompts, new_tokens, suppress_eos, batch_size):
    out = {}
    for path in ("plain", "static"):
        engine = HFEngine(model, tokenizer, decode=path)
        out[path] = engine.generate(prompts, new_tokens, suppress_eos=suppress_eos, batch_size=batch_size)
    return out["plain"], out["static"]


@pytest.mark.parametrize("suppress_eos", [True, False])
def test_static_path_gives_the_plain_paths_greedy_tokens_on_the_real_model(default_model, suppress_eos):
    tok = default_model.tokenizer
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    assert len({len(i) for i in ids}) == 3  # three widths: left padding is exercised
    # batch 2 over 3 prompts: the last group is padded to the decoder's fixed shape
    plain, static = both_paths(default_model.model, tok, ids, 12, suppress_eos, batch_size=2)
    assert static.tokens == plain.tokens
    assert static.eos_step == plain.eos_step
    assert plain.first_nonfinite_step == static.first_nonfinite_step == [None, None, None]
    if suppress_eos:
        assert all(len(t) == 12 for t in plain.tokens) and plain.eos_step == [None] * 3
    else:
        # the bare instruction is answered with EOS at once: the row stops there, EOS kept
        eos = HFEngine(default_model.model, tok).eos_ids()
        assert plain.eos_step[1] is not None and plain.tokens[1][-1] in eos
        assert len(plain.tokens[1]) == plain.eos_step[1] + 1


def test_static_decoder_reuses_its_cache_and_matches_a_fresh_one(default_model):
    """A second batch through the same decoder (reset cache, same buffers: what a CUDA graph
    replays) gives what a fresh decoder gives."""
    tok = default_model.tokenizer
    engine = HFEngine(default_model.model, tok, decode="static")
    ids = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    first = engine.generate(ids[:1], 6, suppress_eos=True, batch_size=1)
    dec = engine._decoder
    second = engine.generate(ids[1:], 6, suppress_eos=True, batch_size=1)
    assert engine._decoder is dec  # same shape: reused
    fresh = HFEngine(default_model.model, tok, decode="static").generate(ids[1:], 6, suppress_eos=True, batch_size=1)
    assert second.tokens == fresh.tokens and second.tokens != first.tokens


def tiny_llama(vocab: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, eos_token_id=1, pad_token_id=1, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


class _Tok:
    pad_token_id = 1
    eos_token_id = 1


def test_nonfinite_logits_are_reported_at_the_first_step_by_both_paths():
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[7, 0] = float("nan")  # every position's logit for token 7 becomes NaN
    plain, static = both_paths(model, _Tok(), [[3, 4, 5], [6, 8]], 4, suppress_eos=True, batch_size=2)
    assert plain.first_nonfinite_step == static.first_nonfinite_step == [0, 0]


def steer(model, token: int) -> None:
    """Make `token` the greedy choice at every step: a head of zero weights and a one-hot bias
    (zero weights still turn a NaN hidden state into NaN logits)."""
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token] = 10.0
    model.lm_head = head


def test_nonfinite_logits_from_a_later_step_are_dated_by_both_paths():
    """Step 0 is clean and emits token 9; feeding 9 back (a NaN embedding row) poisons step 1."""
    model = tiny_llama()
    steer(model, 9)
    with torch.no_grad():
        model.model.embed_tokens.weight[9] = float("nan")
    plain, static = both_paths(model, _Tok(), [[3, 4, 5], [6]], 4, suppress_eos=True, batch_size=2)
    assert plain.tokens[0][0] == static.tokens[0][0] == 9
    assert plain.first_nonfinite_step == static.first_nonfinite_step == [1, 1]


def test_suppressed_eos_is_never_emitted_and_a_free_eos_stops_the_row():
    model = tiny_llama()
    steer(model, 1)  # EOS is the greedy choice at every step
    free_plain, free_static = both_paths(model, _Tok(), [[3, 4, 5]], 5, suppress_eos=False, batch_size=1)
    assert free_plain.tokens == free_static.tokens == [[1]] and free_plain.eos_step == free_static.eos_step == [0]
    sup_plain, sup_static = both_paths(model, _Tok(), [[3, 4, 5]], 5, suppress_eos=True, batch_size=1)
    # EOS masked: every other logit is 0, argmax takes the first, token 0
    assert sup_plain.tokens == sup_static.tokens == [[0] * 5] and sup_static.eos_step == [None]


def test_left_pad_and_split_rows_by_hand():
    ids, mask = left_pad([[5, 6, 7], [8]], 0, "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert split_rows([[4, 9, 2, 2], [2]], [2, 9], suppress_eos=False) == ([[4, 9], [2]], [1, 0])
    assert split_rows([[4, 4]], [2], suppress_eos=True) == ([[4, 4]], [None])


def test_static_decoder_refuses_a_prompt_that_overruns_its_cache():
    dec = StaticDecoder(tiny_llama(), batch=1, max_len=8, new_tokens=4, eos=[1], suppress_eos=True, use_graph=False)
    with pytest.raises(ValueError, match="exceeds the cache"):
        dec.run(torch.tensor([[3, 4, 5, 6, 7]]), torch.ones(1, 5, dtype=torch.long))


def test_auto_takes_the_plain_path_on_cpu(default_model):
    engine = HFEngine(default_model.model, default_model.tokenizer)
    assert engine.decode_path() == "plain" and engine.describe()["decode"] == "plain"


def test_attending_over_the_filled_slots_only_keeps_the_greedy_tokens(default_model, monkeypatch):
    """Buckets of 4 slots: the steps of a 12-token generation attend over 5 different lengths
    (decode_attention.py), K/V heads read once per GQA group, and emit the plain path's tokens,
    as the whole-cache step does."""
    from qval.engines import static_decode

    monkeypatch.setattr(static_decode, "BUCKET", 4)
    lengths = []
    step = static_decode.StaticDecoder._step
    monkeypatch.setattr(static_decode.StaticDecoder, "_step", lambda self, length: (lengths.append(length), step(self, length)))
    tok = default_model.tokenizer
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    plain = HFEngine(default_model.model, tok, decode="plain").generate(ids, 12, suppress_eos=True, batch_size=3)
    filled = HFEngine(default_model.model, tok, decode="static").generate(ids, 12, suppress_eos=True, batch_size=3)
    seen = sorted(set(lengths))
    whole = HFEngine(default_model.model, tok, decode="static")
    whole.static_filled = False
    lengths.clear()
    full = whole.generate(ids, 12, suppress_eos=True, batch_size=3)
    assert filled.tokens == full.tokens == plain.tokens
    assert len(seen) >= 3 and max(seen) < 256 and set(lengths) == {256}  # 256: the whole cache


def test_decode_attention_equals_transformers_sdpa_over_the_whole_cache(monkeypatch):
    from transformers.integrations import sdpa_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from qval.engines import decode_attention

    g = torch.Generator().manual_seed(0)
    b, hkv, group, d, slots, seen = 3, 2, 4, 16, 40, 13
    q = torch.randn(b, hkv * group, 1, d, generator=g)
    k, v = torch.randn(b, hkv, slots, d, generator=g), torch.randn(b, hkv, slots, d, generator=g)
    mask = torch.zeros(b, 1, 1, slots, dtype=torch.bool)
    mask[..., :seen] = True
    mask[1, ..., :4] = False  # a left-padded row
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = group, True
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", None)  # its own path, not transformers'
    step = decode_attention.StepAttention(16)  # a bucket past the seen slots, short of the cache
    got, _ = decode_attention.attention(module, q, k, v, mask, scaling=d ** -0.5, **{decode_attention.STEP: step})
    assert got.shape == want.shape == (b, 1, hkv * group, d)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
