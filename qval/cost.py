"""What a candidate costs in memory: bits per weight and footprint, from the format spec and the exclusions.

Two figures are made here, over two different sets of parameters, each for its own question:

- over all parameters (`model_weight_bits`, the sweep's footprint): every parameter of the reference, tied
  tensors once; quantized linears (those the exclude globs leave quantized) at the format's bits,
  everything else (embeddings, norms, excluded layers) at the deployment dtype. It is the memory
  the deployment holds, so candidates of different formats compare by it.
- over linear layers (`weight_budget` / `effective_bits`, the fallback's `max_effective_bits`): only
  the linear layers that carry a weight quantizer after calibration, at the format's bits where the
  quantizer is enabled and in high precision where it is not or where an extra exclusion puts it.
  It is what keeping layers in high precision trades against, with embeddings left out.

Both start from `format_bits` (the format's spec) and `HIGH_PRECISION_BITS` (the dtype's).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .config import KVCache

if TYPE_CHECKING:
    import torch

HIGH_PRECISION_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def format_bits(q: Any) -> float:
    """Stored bits per quantized weight of `q`'s format and settings, scales included.

    >>> from qval.config import QuantConfig
    >>> format_bits(QuantConfig(format="int4_awq")), format_bits(QuantConfig(format="int4_awq", awq_block_size=64))
    (4.125, 4.25)
    """
    return q.spec.bits(q)


def kv_bytes_per_element(q: Any, dtype: str) -> float:
    """1 byte for an FP8 KV cache of a format that quantizes it, else the deployment dtype's."""
    return 1 if (q.spec.kv_cache and q.kv_cache is KVCache.fp8) else HIGH_PRECISION_BITS[dtype] / 8


def _excluded(name: str, patterns: list[str]) -> bool:
    # the same globs build_mtq_config hands ModelOpt: on the module, or on its quantizers
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(f"{name}.weight_quantizer", p) for p in patterns)


@dataclass(frozen=True)
class WeightBits:
    bits: float  # stored bits of all the parameters counted
    params: int

    @property
    def per_param(self) -> float:
        return self.bits / self.params


def model_weight_bits(model: "torch.nn.Module", cfg: Any) -> WeightBits:
    """Stored bits of every parameter of the model (the first figure of the module docstring),
    before calibration: the exclude globs decide which linears stay in high precision."""
    import torch

    hp_bits = HIGH_PRECISION_BITS[cfg.model.dtype]
    qbits = format_bits(cfg.quant)
    quantize = cfg.quant.spec.quantizes
    def ident(t: torch.Tensor) -> int:  # shared storage (tied weights); a weightless (meta) model has none: the object
        return id(t) if t.device.type == "meta" else t.data_ptr()

    linear_weights = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            linear_weights[ident(module.weight)] = quantize and not _excluded(name, cfg.quant.exclude)
    seen: set[int] = set()
    bits = params = 0.0
    for p in model.parameters():
        if ident(p) in seen:
            continue
        seen.add(ident(p))
        params += p.numel()
        bits += p.numel() * (qbits if linear_weights.get(ident(p), False) else hp_bits)
    return WeightBits(bits, params)  # type: ignore[arg-type]


def weight_budget(model: "torch.nn.Module", cfg: Any) -> dict[str, Any]:
    """The linear-layer count (the second figure of the module docstring): parameters of every linear layer that carries a weight quantizer,
    per quantized module, and the total already kept in high precision. Embeddings are not linear
    layers (no format here quantizes them); a weight tied to another (lm_head and the embedding in
    small models) counts once. `effective_bits` turns it into bits per parameter."""
    import torch

    modules: dict[str, int] = {}
    high = 0
    seen: set[int] = set()
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        w = getattr(module, "weight", None)
        if wq is None or not isinstance(w, torch.Tensor) or isinstance(module, torch.nn.Embedding):
            continue
        if w.data_ptr() in seen:
            continue
        seen.add(w.data_ptr())
        if wq.is_enabled:
            modules[f"{name}.weight_quantizer"] = w.numel()
        else:
            high += w.numel()
    return {"bits_quantized": format_bits(cfg.quant),
            "bits_high": HIGH_PRECISION_BITS[cfg.model.dtype], "modules": modules, "high_precision_params": high}


def kept_high(budget: dict[str, Any], excluded: Sequence[str]) -> int:
    """Parameters of quantized modules that the exclude globs put back in high precision (globs
    match weight-quantizer names, as ModelOpt matches them)."""
    return sum(n for q, n in budget["modules"].items() if any(fnmatch.fnmatch(q, g) for g in excluded))


def effective_bits(budget: dict[str, Any], excluded: Sequence[str] = ()) -> float:
    """Weight bits per parameter over all linear layers once the `excluded` globs stay in high precision.

    >>> b = {"bits_quantized": 8, "bits_high": 16, "modules": {"a.weight_quantizer": 30, "b.weight_quantizer": 10},
    ...      "high_precision_params": 0}
    >>> effective_bits(b), effective_bits(b, ["*b.*"])
    (8.0, 10.0)
    """
    total = sum(budget["modules"].values()) + budget["high_precision_params"]
    if total == 0:
        return math.nan
    high = budget["high_precision_params"] + kept_high(budget, excluded)
    return ((total - high) * budget["bits_quantized"] + high * budget["bits_high"]) / total
