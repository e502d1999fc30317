"""qval/engines/decode_kernel.py's split-KV attention, run in Triton's interpreter in a fresh process (as
test_gemv.py does: the kernels themselves run only on a GPU). Against float64 attention over the seen
slots: left-padded rows (a piece of slots entirely hidden), query groups of 3 and 4 heads, head
dimensions 64 and 128, lengths that no piece divides, one row and eight. In float16: Triton 3.9's
interpreter multiplies bfloat16 tl.dot operands as their raw bits (test_gemv.py), and the kernel's code
is the same for both."""

from __future__ import annotations

import pytest

from qval.engines import decode_kernel
from tests.engines.triton_helpers import interpreted as run_interpreted

CHECK = r'''
import json, torch
from qval.engines import decode_kernel as dk
assert dk._load(), dk.missing()

def reference(q, k, v, mask, length, scale):
    b, hq, _, d = q.shape
    g = hq // k.shape[1]
    kk = k[:, :, :length].double().repeat_interleave(g, 1)
    vv = v[:, :, :length].double().repeat_interleave(g, 1)
    sc = (q.double() @ kk.transpose(-1, -2)) * scale
    sc = sc.masked_fill(~mask[:, :, :, :length], float("-inf"))
    return (sc.softmax(-1) @ vv).transpose(1, 2)  # [B, 1, Hq, D]

out = []
torch.manual_seed(0)
for b, hkv, g, d, max_len, length, pad, config in [
        (2, 3, 3, 64, 320, 300, [0, 130], None),      # the built-in model's heads; row 1's first pieces hidden
        (1, 2, 4, 128, 256, 200, [0], (32, 4, 1)),
        (8, 2, 4, 128, 640, 512, [0, 5, 70, 0, 200, 1, 0, 64], (64, 4, 2)),
        (3, 1, 1, 16, 64, 17, [0, 3, 16], None),      # no GQA, a length of one piece and a bit
        (8, 8, 4, 64, 1024, 1000, [0, 300, 0, 7, 999, 0, 64, 500], (32, 4, 1))]:  # 7 inner steps a piece
    q = torch.randn(b, hkv * g, 1, d).half()
    k = torch.randn(b, hkv, max_len, d).half()
    v = torch.randn(b, hkv, max_len, d).half()
    mask = torch.zeros(b, 1, 1, max_len, dtype=torch.bool)
    for r, p in enumerate(pad):
        mask[r, ..., p:length] = True
    scale = d ** -0.5
    assert dk.usable(q, k, mask) is False  # a CPU tensor: never taken outside a GPU
    got = dk.attend(q, k, v, mask, length, scale, config)
    want = reference(q, k, v, mask, length, scale)
    # the probabilities are rounded to the values' dtype before P·V (as flash attention)
    err = float(((got.double() - want).abs() / (want.abs() + 0.05)).max())
    again = dk.attend(q, k, v, mask, length, scale, config)
    out.append({"shape": list(got.shape), "finite": bool(torch.isfinite(got).all()), "err": err,
                "same_again": bool(torch.equal(got, again)),
                "pieces": dk.splits(b, hkv, length, (config or dk.CONFIG)[0])})
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted() -> list:
    return run_interpreted(CHECK, 600)


def test_attention_over_the_seen_slots_in_pieces(interpreted):
    shapes = [[2, 1, 9, 64], [1, 1, 8, 128], [8, 1, 8, 128], [3, 1, 1, 16], [8, 1, 32, 64]]
    for case, shape in zip(interpreted, shapes):
        assert case["shape"] == shape and case["finite"], case
        assert case["err"] < 0.03, case
        assert case["same_again"], case
    assert [c["pieces"] for c in interpreted] == [3, 7, 8, 1, 5]  # several pieces: the combine kernel ran


def test_pieces_are_a_function_of_the_shape():
    assert decode_kernel.splits(8, 8, 2048, 64) == 5  # 64 programs of rows × heads: ~264 aimed at
    assert decode_kernel.splits(1, 8, 2048, 64) == 32  # 33 wanted, 32 inner steps in all
    assert decode_kernel.splits(1, 8, 100, 64) == 2  # never a piece of less than one inner step
    assert decode_kernel.splits(64, 8, 2048, 64) == 1


def test_the_decode_step_takes_the_kernel_and_falls_back_to_sdpa_once_it_fails(monkeypatch):
    """decode_attention.attention hands a one-token step to decode_kernel.attend (the whole mask, the
    attended length, the scale) where `usable` says it can run (a GPU: stand-ins here), and on a
    failure outside a graph capture records why in the step's (the runtime's) failures and gives
    sdpa's result, then never tries again."""
    import torch

    from qval.engines import decode_attention

    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 16)
    k, v = torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    mask = torch.zeros(2, 1, 1, 32, dtype=torch.bool)
    mask[0, ..., :20] = True
    mask[1, ..., 5:20] = True
    module = torch.nn.Module()
    module.is_causal = True
    calls = []

    def attend(query, key, value, m, length, scale):
        calls.append((m is mask, length, scale))
        return torch.full((2, 1, 4, 16), 7.0)

    def attention(step):
        return decode_attention.attention(module, q, k, v, mask, scaling=0.25, **{decode_attention.STEP: step})[0]

    monkeypatch.setattr(decode_kernel, "usable", lambda query, key, m: True)
    monkeypatch.setattr(decode_kernel, "attend", attend)
    failures: dict[str, str] = {}
    got = attention(decode_attention.StepAttention(24, True, failures))
    assert calls == [(True, 24, 0.25)] and torch.equal(got, torch.full((2, 1, 4, 16), 7.0))
    want = attention(decode_attention.StepAttention(24, False, failures))  # switched off: sdpa over the first 24 slots

    def broken(*a):
        calls.append("broken")
        raise RuntimeError("ptxas not found\nsecond line")

    monkeypatch.setattr(decode_kernel, "attend", broken)
    got = attention(decode_attention.StepAttention(24, True, failures))
    again = attention(decode_attention.StepAttention(24, True, failures))
    assert torch.equal(got, want) and torch.equal(again, want)
    assert calls[1:] == ["broken"]  # tried once
    assert failures == {"split_kv": "RuntimeError: ptxas not found"}
