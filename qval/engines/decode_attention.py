"""The runtime's attention: transformers' sdpa, with two copies of the KV cache left out.

`attention` is registered in transformers' attention and mask registries under qval's own name
(`NAME`, through transformers' public `AttentionInterface.register`; no entry of transformers' is
replaced) and `install` sets it on one model instance — the engine's, which qval loaded or copied —
with the model's public `set_attn_implementation`. `uninstall` puts transformers' sdpa back. No
other model and no function of transformers' changes. It computes what transformers' sdpa computes:

- On a CPU, with a mask (every left-padded batch, every piece read through the KV cache), sdpa reads
  grouped-query K/V as they are (`enable_gqa`) instead of copies repeated for every query head of
  their group. transformers does this only without a mask, because on CUDA a mask sends GQA to the
  slow math kernel; the CPU kernel has no such limit. The same logits, bit for bit
  (tests/engines/test_runtime.py), without a per-step copy of the whole cache.
- In a static decode step (`StaticDecoder`, which passes a `StepAttention` as the keyword `STEP`)
  a one-token query attends over the step's `length` cache slots only (the filled ones, rounded up
  to a bucket; one CUDA graph per bucket), not over every slot of the cache, and each K/V head's
  query group is folded into the query-length axis — [B, H_kv·G, 1, D] → [B, H_kv, G, D] — so one
  sdpa call reads each K/V head once. The slots cut off are masked out (weight exactly 0); the
  kernels' order of sums over a shorter axis can differ in the last bit. On a GPU (CUDA, Triton,
  bfloat16/float16) the step goes to decode_kernel.py's split-KV kernel instead: with a mask, sdpa
  has only its memory-efficient kernel in deterministic mode (the gate's), slower than the bytes it
  reads as the context grows. A kernel that cannot compile or launch here is recorded in the
  runtime's `failures` and sdpa runs from then on.

Anything else (the GPU's masked calls outside a step, a position bias, an additive mask) goes to
transformers' own `sdpa_attention_forward` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from . import decode_kernel

NAME = "qval_sdpa"  # the attention implementation of a model the runtime runs (transformers' "sdpa" otherwise)
BASE = "sdpa"  # the implementation it stands in for
STEP = "qval_step"  # keyword of a static decode step's forward: its StepAttention


@dataclass
class StepAttention:
    """What a static decode step's attention needs: the cache slots it attends over, whether it
    may take decode_kernel.py's kernel, and where to record why that kernel could not run."""

    length: int
    split_kv: bool = True
    failures: dict[str, str] = field(default_factory=dict)


def _why(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def _step(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attention_mask: torch.Tensor | None, scaling: float | None, step: StepAttention, **kwargs: Any) -> torch.Tensor | None:
    """A one-token step over the first `step.length` slots; None where it does not apply."""
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    if (q_len != 1 or hq % hkv or kwargs.get("position_bias") is not None
            or (attention_mask is not None and attention_mask.dtype != torch.bool)):
        return None
    length = min(step.length, key.shape[2])
    if (step.split_kv and "split_kv" not in step.failures and not kwargs.get("sliding_window") and not kwargs.get("softcap")
            and decode_kernel.usable(query, key, attention_mask)):
        try:
            return decode_kernel.attend(query, key, value, attention_mask, length, scaling if scaling is not None else d ** -0.5)
        except Exception as err:  # noqa: BLE001 - a Triton that cannot compile or launch here: sdpa from now on
            if query.is_cuda and torch.cuda.is_current_stream_capturing():
                raise  # never inside a graph capture (the decoder's warm-up step launches it first)
            step.failures["split_kv"] = _why(err)
    k, v = key[:, :, :length], value[:, :, :length]
    mask = attention_mask[..., :length] if attention_mask is not None else None  # [B, 1, 1, L]: broadcast over the group
    q = query.reshape(b, hkv, hq // hkv, d)  # head h = kv·G + g, as transformers' repeat_kv lays them out
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(b, hq, 1, d).transpose(1, 2).contiguous()


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: [B, H, Lq, D] query, [B, H_kv, L, D] key/value
    in; [B, Lq, H, D] out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    step = kwargs.pop(STEP, None)
    if step is not None and (out := _step(module, query, key, value, attention_mask, scaling, step, **kwargs)) is not None:
        return out, None
    groups = getattr(module, "num_key_value_groups", 1)
    if (key.device.type == "cpu" and attention_mask is not None and groups > 1 and key.shape[-1] == value.shape[-1]
            and kwargs.get("position_bias") is None):
        # sdpa_attention_forward's own call when it may use GQA (with a mask: never causal, nothing cropped)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                             is_causal=False, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _register() -> None:
    """`attention` under NAME, and sdpa's mask function under NAME (transformers builds a model's
    masks by its implementation's name). Adds qval's name; replaces nothing; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS[BASE])


def implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation transformers runs on this model, or None for a model without
    transformers' config (no implementation to choose: it keeps its own)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def install(model: torch.nn.Module) -> bool:
    """The runtime's attention on this model instance, if its attention is transformers' sdpa
    (or already this one); whether it is."""
    if implementation(model) == BASE and hasattr(model, "set_attn_implementation"):
        _register()
        model.set_attn_implementation(NAME)
    return implementation(model) == NAME


def uninstall(model: torch.nn.Module) -> None:
    """transformers' sdpa back on a model that runs this attention (e.g. a copy of one that did)."""
    if implementation(model) == NAME:
        model.set_attn_implementation(BASE)
