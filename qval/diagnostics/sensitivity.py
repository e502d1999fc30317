"""Sensitivity: how much of the candidate's KLD goes away when one part is kept in high precision.

For each decoder layer (every quantizer in it) and each projection type (one projection across
all layers, e.g. every `mlp.down_proj`), the part's quantizers are switched off, a small slice of
the agreement data is scored teacher-forced against the reference (the gate-1 convention: the
second half of each chunk), and the quantizers are switched back on. Weights are quantized once
(folding.py), so each scoring costs a forward, not a forward plus a re-quantization of every weight. The figure is the paired
per-position KLD change, base − restored, with its standard error: large positive means that part
carries the damage. Switching a SmoothQuant/AWQ quantizer off keeps its pre_quant_scale, and the
weight holds the inverse scale, so "off" is the unquantized layer up to rounding.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..metrics import mean_estimate
from ..metrics.tokens import token_stats
from ..quantize.modelopt_adapter import set_quantizer
from .folding import FoldedWeights
from .scales import split_name, unit_glob


def groups(quantizers: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Enabled quantizer names grouped by unit (decoder layer) and by projection type.

    >>> g = groups({"m.layers.0.mlp.up_proj.weight_quantizer": 1, "m.layers.1.mlp.up_proj.input_quantizer": 1})
    >>> g["layer"], g["part"]
    ({'m.layers.0': ['m.layers.0.mlp.up_proj.weight_quantizer'], 'm.layers.1': ['m.layers.1.mlp.up_proj.input_quantizer']}, {'mlp.up_proj': ['m.layers.0.mlp.up_proj.weight_quantizer', 'm.layers.1.mlp.up_proj.input_quantizer']})
    """
    out: dict[str, dict[str, list[str]]] = {"layer": {}, "part": {}}
    for name in quantizers:
        unit, part, _ = split_name(name)
        out["layer"].setdefault(unit, []).append(name)
        out["part"].setdefault(part, []).append(name)
    return out


class SliceScorer:
    """Scores a model on fixed chunks against reference logits computed once."""

    def __init__(self, reference_logits: Callable[[torch.Tensor], torch.Tensor], chunks: list[list[int]], device: str,
                 batch_size: int = 4) -> None:
        self.x = torch.tensor(chunks)
        self.half = self.x.shape[1] // 2
        self.device = device
        self.batch_size = batch_size
        self.ref = [reference_logits(self.x[i : i + batch_size])[:, self.half : -1].float()
                    for i in range(0, len(chunks), batch_size)]

    @torch.no_grad()
    def kld(self, model: torch.nn.Module) -> np.ndarray:
        """Per scored position KLD(ref‖model), NaN where either side is non-finite."""
        out = []
        for j, i in enumerate(range(0, self.x.shape[0], self.batch_size)):
            x = self.x[i : i + self.batch_size].to(self.device)
            lc = model(input_ids=x, use_cache=False).logits[:, self.half : -1].float()
            lr = self.ref[j].to(lc.device)
            for b in range(x.shape[0]):
                out.append(token_stats(lr[b], lc[b], x[b, self.half + 1 :])["kld"].numpy())
            del lc
        return np.concatenate(out)


def _summary(kind: str, name: str, names: list[str], base: np.ndarray, restored: np.ndarray) -> dict[str, Any]:
    finite = np.isfinite(base) & np.isfinite(restored)
    delta = mean_estimate(base[finite] - restored[finite]) if finite.any() else None
    base_mean = float(np.mean(base[finite])) if finite.any() else float("nan")
    return {
        "kind": kind,
        "name": name,
        "exclude": unit_glob(name) if kind == "layer" or any(f"{name}." in n for n in names) else f"*{name}_quantizer",
        "quantizers": len(names),
        "kld_restored": float(np.nanmean(restored)) if np.isfinite(restored).any() else float("nan"),
        "delta_kld": delta.to_dict() if delta else None,
        "recovered": (delta.value / base_mean) if delta and base_mean > 0 else None,
        # non-finite positions the part causes: restoring it removes them
        "nonfinite_removed": int((~np.isfinite(base)).sum() - (~np.isfinite(restored)).sum()),
    }


def ranking_key(entry: dict[str, Any]) -> tuple[int, float]:
    d = entry["delta_kld"]
    v = float(d["value"]) if d else float("-inf")
    return (-entry["nonfinite_removed"], -v if np.isfinite(v) else float("inf"))


def _precision(names: list[str], quantizers: dict[str, Any], folded: FoldedWeights, high: bool) -> None:
    """Put a group in high precision (high=True) or back: folded weights swap tensors, live
    quantizers are switched off and on."""
    for n in names:
        if n in folded.entries:
            (folded.high if high else folded.low)(n)
        else:
            set_quantizer(quantizers[n], enabled=not high)


@torch.no_grad()
def rank(model: torch.nn.Module, quantizers: dict[str, Any], scorer: SliceScorer,
         on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Base KLD, then one scoring per layer and per projection type with that group switched off;
    each ranking sorted by the KLD it removes (largest first)."""
    enabled = {n: q for n, q in quantizers.items() if q.is_enabled}
    ranked: dict[str, list[dict[str, Any]]] = {}
    with FoldedWeights(model, enabled) as folded:
        base = scorer.kld(model)
        for kind, members in groups(enabled).items():
            entries = []
            for name, names in members.items():
                _precision(names, enabled, folded, high=True)
                try:
                    restored = scorer.kld(model)
                finally:
                    _precision(names, enabled, folded, high=False)
                entries.append(_summary(kind, name, names, base, restored))
                if on_step is not None:
                    on_step(1)
            ranked[kind] = sorted(entries, key=ranking_key)
    finite = np.isfinite(base)
    return {
        "positions": int(base.size),
        "chunks": int(scorer.x.shape[0]),
        "ctx": int(scorer.x.shape[1]),
        "base_kld": mean_estimate(base[finite]).to_dict() if finite.any() else None,
        "base_nonfinite": int((~finite).sum()),
        "layers": ranked.get("layer", []),
        "parts": ranked.get("part", []),
    }


def steps(quantizers: dict[str, Any]) -> int:
    """How many scorings `rank` will do after the base one (for a progress bar)."""
    g = groups({n: q for n, q in quantizers.items() if q.is_enabled})
    return len(g["layer"]) + len(g["part"])
