"""The runtime's KV cache: written in place, and a quantized one quantized once per token as it enters.

Measured on this repo's default model (SmolLM2-135M, 30 layers, 3 KV heads of 9 query heads),
batch 8, one CPU thread, after 1,200 tokens of context: 64 % of a decode step went to
`torch.cat` in `DynamicLayer.update` (the whole KV cache is copied on every token). The other
per-step copy of the cache, sdpa repeating K/V for every query head when a mask is given, is
decode_attention.py's. `growing_cache()`: a DynamicCache whose layers (qval's own class) keep K/V
in buffers with spare capacity (doubling), write each new token in place and hand attention a view
of the filled part: the same logits bit for bit (tests/engines/test_runtime.py).

Another cost belongs to quantized KV caches: ModelOpt's HF attention plugin fake-quantizes K and V
*after* the cache update (`_quantized_attention`), i.e. the whole cache again on every decoded
token, O(context) per step (fp8_kvfp8 candidate, batch 8, 1,024 new tokens on 2 CPU cores: 270 s,
against 102 s quantized on entry; benchmarks/kv_prequant_cpu.py).
`install_prequantized_kv()` moves that quantization to the moment a token enters the cache, once:
the cache stores q(K), q(V) and attention gets them marked as already quantized, so the quantizer
passes them through. With a static, element-wise scale (ModelOpt's FP8 KV calibration) q of the
whole cache is q of each token, so the values attention sees are the same; the engine checks that
bit for bit on a probe when it is built and keeps ModelOpt's path if they differ.

CPU only. On the H200 (benchmarks/kv_prequant_cpu.py --device cuda, plain decode, batch 8, 1,024
tokens) the build-time probe matched bit for bit, but the greedy tokens of the left-padded batch
differed from ModelOpt's path, and it was slower (a small model's GPU decode is bound by kernel
launches, not by the cache's size). Whether attention's strided view of the
cache selected another CUDA kernel or ModelOpt's path itself varies from run to run there was not
separated (benchmarks/RESULTS.md §5). On CPU the tokens are identical (tests/engines/test_kv_prequant.py,
and 8 × 1,024 tokens in the benchmark).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from ..quantize.modelopt_adapter import quantizer_state


@functools.cache
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


PREQUANTIZED = "_qval_kv_prequantized"  # marks K/V tensors a cache hands out already quantized


@functools.cache
def _prequantized_cache_class() -> type:
    from transformers import DynamicCache

    class PrequantizedKVCache(DynamicCache):
        """Quantizes each token's K/V once, as it enters the cache; hands attention marked tensors."""

        qval_quantizers: dict[int, tuple[Any, Any]] = {}

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            kq, vq = self.qval_quantizers.get(layer_idx, (None, None))
            if kq is not None:
                key_states = kq(key_states)
            if vq is not None:
                value_states = vq(value_states)
            keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            if kq is not None:
                keys.__dict__[PREQUANTIZED] = True  # the cache's own view, made for this call
            if vq is not None:
                values.__dict__[PREQUANTIZED] = True
            return keys, values

    return PrequantizedKVCache


def growing_cache(kv_quantizers: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """A DynamicCache (what `generate` and a model's forward expect) built of growing layers;
    with `kv_quantizers` (from `install_prequantized_kv`) it stores K/V quantized on entry.
    (The classes are made on first use, so importing this module imports no transformers.)"""
    from transformers import DynamicCache

    if kv_quantizers:
        cache = _prequantized_cache_class()()
        cache.qval_quantizers = kv_quantizers
    else:
        cache = DynamicCache()
    # an empty DynamicCache adds one layer of this class per decoder layer on first use (this cache's attribute)
    cache.layer_class_to_replicate = _growing_layer_class()
    return cache


def _static_elementwise(q: Any) -> bool:
    """A quantizer whose output for one token does not depend on the others: a calibrated
    (static) amax, no dynamic or block scaling."""
    s = quantizer_state(q)
    return s.amax is not None and not s.dynamic and not s.block_sizes


def kv_entry_quantizers(model: torch.nn.Module) -> tuple[dict[int, tuple[Any, Any]], str | None]:
    """layer index -> (K, V) quantizer (None where that side is not quantized) of every attention
    module with an enabled KV quantizer; ({}, why) when any of them may not be moved to cache entry."""
    out: dict[int, tuple[Any, Any]] = {}
    for name, m in model.named_modules():
        kq, vq = getattr(m, "k_bmm_quantizer", None), getattr(m, "v_bmm_quantizer", None)
        on = [q if q is not None and getattr(q, "is_enabled", False) else None for q in (kq, vq)]
        if on == [None, None]:
            continue
        idx = getattr(m, "layer_idx", None)
        if not isinstance(idx, int) or idx in out:
            return {}, f"{name}: no unique layer_idx, so its cache layer cannot be matched to its quantizers"
        for q in on:
            if q is not None and not _static_elementwise(q):
                return {}, f"{name}: KV quantizer {q} is not static and element-wise"
        out[idx] = (on[0], on[1])
    return out, None


def _pass_prequantized(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    if getattr(inputs, PREQUANTIZED, False):
        return inputs
    return type(self).forward(self, inputs, *args, **kwargs)


def install_prequantized_kv(model: torch.nn.Module, probe: torch.Tensor) -> tuple[dict[int, tuple[Any, Any]], str | None]:
    """Quantize the KV cache on entry (see the module docstring). Returns the quantizers for
    `growing_cache`, or ({}, why not) after the bit-for-bit check on `probe` (token ids [batch, n]):
    a prefill of n − 12 tokens and 12 single-token steps, through the growing cache (crossing its
    first reallocation when n > 256), against ModelOpt's own path."""
    quantizers, why = kv_entry_quantizers(model)
    if not quantizers:
        return {}, why
    split = probe.shape[1] - 12

    def run(kv: dict[int, tuple[Any, Any]] | None) -> torch.Tensor:
        cache, outs = growing_cache(kv), []
        with torch.no_grad():
            outs.append(model(input_ids=probe[:, :split], past_key_values=cache, use_cache=True).logits[:, -1:])
            for t in range(split, probe.shape[1]):
                outs.append(model(input_ids=probe[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
        return torch.cat(outs, 1)

    before = run(None)
    patched = {id(q): (q, q.__dict__.get("forward")) for pair in quantizers.values() for q in pair if q is not None}
    for q, _ in patched.values():
        q.forward = types.MethodType(_pass_prequantized, q)
    after = run(quantizers)
    if not torch.equal(before, after):
        for q, old in patched.values():
            if old is None:
                del q.forward
            else:
                q.forward = old
        diff = (before - after).abs().max().item()
        return {}, f"KV quantized on cache entry is not bit-identical to ModelOpt's per-step path (max |Δlogit| {diff:.3g}); kept ModelOpt's"
    return quantizers, None
