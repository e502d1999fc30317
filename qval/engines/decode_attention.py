"""Attention for the static decoder's steps: only the filled part of the cache, GQA without copies.

transformers' sdpa attention, given the static cache and a mask, (1) attends over every slot of
the cache, filled or not (a 2,048-token generation from a short prompt reads the whole 2,176-slot
cache at its first step as at its last), and (2) with a mask it cannot use sdpa's `enable_gqa`,
so it materialises the K/V heads repeated for every query head of their group (×4 on an 8B Llama:
each step writes and reads four copies of the cache). Together they are the cache traffic of a
decode step at batch 8 and long context, several times its weights' (RESULTS.md §14).

`attention` is registered with transformers' `AttentionInterface` under `NAME`; `StaticDecoder`
switches a model to it only while it decodes (`active`), with `length` the cache slots the step
can see, rounded up to a bucket (one CUDA graph per bucket). For a one-token query it slices the
cache and the mask to `length` (views, no copy) and folds each K/V head's query group into the
query-length axis — [B, H_kv·G, 1, D] → [B, H_kv, G, D] — so one sdpa call reads each K/V head
once; its output is unfolded back. Anything else (the prefill, a model without GQA, a position
bias) goes to transformers' own sdpa unchanged. The result is the same attention: the slots cut
off are masked out (weight exactly 0) and the query heads keep their K/V head; the kernels'
reduction order over a shorter axis and the batched query heads can differ in the last bit, which
is why `benchmarks/h200_decode.py` compares the greedy tokens with the plain path's.

On a GPU (CUDA, Triton, bfloat16/float16) the one-token step goes to decode_kernel.py's split-KV
kernel instead of sdpa: with a mask sdpa has only its memory-efficient kernel in deterministic mode
(the gate's), slower than the bytes it reads as the context grows. A kernel that cannot compile or
launch here is recorded in `failures()` (an engine note) and sdpa runs from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from . import decode_kernel

NAME = "qval_static_decode"
use_kernel = True  # on a GPU, decode_kernel.py's split-KV kernel (benchmarks switch it off to measure sdpa)
_failed: dict[str, str] = {}  # "kernel" -> why decode_kernel.py could not run here (sdpa since)
_state = threading.local()  # .length: the slots the current step attends over (None: not decoding)
_registered = False


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    length = getattr(_state, "length", None)
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    if (length is None or q_len != 1 or hq % hkv or kwargs.get("position_bias") is not None
            or (attention_mask is not None and attention_mask.dtype != torch.bool)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    length = min(length, key.shape[2])
    if (use_kernel and "kernel" not in _failed and not kwargs.get("sliding_window") and not kwargs.get("softcap")
            and decode_kernel.usable(query, key, attention_mask)):
        try:
            return decode_kernel.attend(query, key, value, attention_mask, length,
                                        scaling if scaling is not None else d ** -0.5), None
        except Exception as err:  # noqa: BLE001 - a Triton that cannot compile or launch here: sdpa from now on
            if query.is_cuda and torch.cuda.is_current_stream_capturing():
                raise  # never inside a graph capture (the decoder's warm-up step launches it first)
            _failed["kernel"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    k, v = key[:, :, :length], value[:, :, :length]
    mask = attention_mask[..., :length] if attention_mask is not None else None  # [B, 1, 1, L]: broadcast over the group
    q = query.reshape(b, hkv, hq // hkv, d)  # head h = kv·G + g, as transformers' repeat_kv lays them out
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(b, hq, 1, d).transpose(1, 2).contiguous(), None


def failures() -> dict[str, str]:
    """Why the split-KV kernel could not run here (empty: it ran, or was never asked)."""
    return dict(_failed)


def supported(model: torch.nn.Module) -> bool:
    """Whether `active` changes anything for this model: its attention is sdpa (boolean masks)."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


@contextmanager
def active(model: torch.nn.Module, length: int) -> Iterator[None]:
    """Within: the model's attention is `attention`, over the first `length` cache slots."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, attention)
        _registered = True
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = NAME
    _state.length = int(length)
    try:
        yield
    finally:
        cfg._attn_implementation = before
        _state.length = None
