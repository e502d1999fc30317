"""Long-context decoding on CPU without the two hidden copies of transformers' defaults.

Measured on this repo's default model (SmolLM2-135M, 30 layers, 3 KV heads of 9 query heads),
batch 8, one CPU thread, after 1,200 tokens of context: 64 % of a decode step went to
`torch.cat` in `DynamicLayer.update` (the whole KV cache is copied on every token), and
`sdpa_attention_forward` copies K and V once more to repeat them for every query head
(`repeat_kv`) whenever an attention mask is present, which left-padded batches always have.
Both copies grow with the context, so a 2048-token generation spends most of its time
copying. Two fixes, each giving bit-identical logits (tests/gates/test_gates_e2e.py):

- `growing_cache()`: a DynamicCache whose layers keep K/V in buffers with spare capacity
  (doubling), write each new token in place and hand attention a view of the filled part.
- `cpu_gqa_attention()`: while active, SDPA on CPU takes grouped-query K/V as they are
  (`enable_gqa=True`) instead of repeated copies. transformers only does this without a mask
  because on CUDA a mask sends GQA to the slow math kernel; the CPU kernel has no such limit.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """DynamicLayer that appends in place: `keys`/`values` are views of larger buffers."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            self._k: torch.Tensor | None = None
            self._v: torch.Tensor | None = None
            self._filled = 0

        def _reserve(self, like_k: torch.Tensor, like_v: torch.Tensor, need: int) -> None:
            if self._k is not None and need <= self._k.shape[-2]:
                return
            old = 0 if self._k is None else self._k.shape[-2]
            cap = max(need, 2 * old, 256)  # doubling: every token is copied O(1) times on average
            k = like_k.new_empty(*like_k.shape[:-2], cap, like_k.shape[-1])
            v = like_v.new_empty(*like_v.shape[:-2], cap, like_v.shape[-1])
            if self._filled:
                k[..., : self._filled, :] = self._k[..., : self._filled, :]  # type: ignore[index]
                v[..., : self._filled, :] = self._v[..., : self._filled, :]  # type: ignore[index]
            self._k, self._v = k, v

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            need = self._filled + key_states.shape[-2]
            self._reserve(key_states, value_states, need)
            self._k[..., self._filled : need, :] = key_states  # type: ignore[index]
            self._v[..., self._filled : need, :] = value_states  # type: ignore[index]
            self._filled = need
            self.keys, self.values = self._k[..., :need, :], self._v[..., :need, :]  # type: ignore[index]
            return self.keys, self.values

    return GrowingLayer


_LAYER: type | None = None


def growing_cache() -> Any:
    """A DynamicCache (what `generate` and a model's forward expect) built of growing layers."""
    global _LAYER
    from transformers import DynamicCache

    if _LAYER is None:
        _LAYER = _growing_layer_class()
    cache = DynamicCache()
    # an empty DynamicCache adds one layer of this class per decoder layer on first use
    cache.layer_class_to_replicate = _LAYER
    return cache


@contextlib.contextmanager
def cpu_gqa_attention(device: str) -> Iterator[None]:
    """On CPU, let SDPA read grouped K/V heads directly even when a mask is given."""
    if not str(device).startswith("cpu"):
        yield
        return
    import transformers.integrations.sdpa_attention as sdpa

    original = sdpa.use_gqa_in_sdpa

    def cpu_gqa(attention_mask: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor) -> bool:
        return key.device.type == "cpu" and key.shape[-1] == value.shape[-1] or original(attention_mask, key, value)

    sdpa.use_gqa_in_sdpa = cpu_gqa
    try:
        yield
    finally:
        sdpa.use_gqa_in_sdpa = original
