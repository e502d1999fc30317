"""Planted faults of graded severity: known damage put into a built candidate, to measure what each
check of a gate catches (issue 29; `benchmarks/error_rates.py` gates them, RESULTS.md has the tables).

A fault is (kind, severity, seed[, start]); `plant(model, fault)` applies it in place to a
Llama-family causal LM (the candidate an engine holds) and returns what it did. Severity 0 is no
damage at all and damage grows with severity. `seed` picks what is damaged where the kind picks
(a layer, a subset of weights, a noise draw), so detection is measured over seeds.

| kind | severity | what it does |
|---|---|---|
| `layer_scale` | s − 1 (0.1: ×1.1) | one decoder layer's contribution to the residual stream (its `o_proj` and `down_proj` weights) × (1 + s); the layer is drawn by `seed` |
| `weight_bits` | fraction f | a random fraction f of every linear layer's weights rounded to a 4-bit grid (symmetric, 15 levels, one scale per output row: the row's largest magnitude / 7) |
| `kv_scale` | c − 1 (0.25: ×1.25) | every layer's keys and values × (1 + c) (`k_proj`, `v_proj` weights and biases): K/V scales off by that factor; `seed` only varies what else varies (the calibration) |
| `weight_noise` | relative σ | Gaussian noise of σ × each weight matrix's own standard deviation added to every linear layer's weights (`seed` draws it): the reference with tiny noise, healthy at small σ |
| `late_positions` | stretch s | from absolute position `start` on, the rotary position p becomes start + (p − start)·(1 + s): positional damage that starts at a depth (gate 1 at depth, retrieval) and, past prompt + N tokens, a generation that degrades after N tokens (gate 3) |

Everything is applied with public torch operations: weights changed in place (every engine path
reads `module.weight` when it runs, CUDA-graph replays included) and, for `late_positions`, a
forward pre-hook on the rotary embedding whose arithmetic is tensor operations only (no Python
branch on a value, so a captured CUDA graph replays it). No library class or function is patched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: each kind's severities for a detection curve, mildest first (benchmarks/error_rates.py's default grid)
GRID: dict[str, tuple[float, ...]] = {
    "layer_scale": (0.05, 0.1, 0.25, 0.5, 1.0, 3.0),
    "weight_bits": (0.01, 0.03, 0.1, 0.3, 1.0),
    "kv_scale": (0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
    "weight_noise": (0.001, 0.003, 0.01, 0.03, 0.1, 0.3),
    "late_positions": (0.01, 0.03, 0.1, 0.3, 1.0),
}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Fault:
    kind: str
    severity: float
    seed: int = 0
    start: int = 512  # late_positions: the first damaged absolute position

    def __post_init__(self) -> None:
        if self.kind not in GRID:
            raise ValueError(f"unknown fault kind {self.kind!r}; the kinds: {', '.join(GRID)}")
        if not self.severity >= 0:
            raise ValueError(f"a fault's severity is >= 0 (0: no damage), not {self.severity!r}")

    @property
    def label(self) -> str:
        return f"{self.kind}={self.severity:g}" + (f"@{self.start}" if self.kind == "late_positions" else "")


@dataclass
class Planted:
    fault: Fault
    what: str  # in words, for the engine's notes and the report
    changed: int = 0  # weights changed (0 for a hook)
    hooks: list[Any] = field(default_factory=list)

    def remove(self) -> None:
        """Take the hooks off (changed weights stay changed)."""
        for h in self.hooks:
            h.remove()
        self.hooks.clear()


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a Llama-family model (`model.model.layers`)."""
    inner = getattr(model, "model", None)
    found = getattr(inner, "layers", None)
    if found is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers at model.model.layers; faults are planted in Llama-family models")
    return list(found)


def _linears(layer: torch.nn.Module, names: tuple[str, ...] = LINEARS) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in layer.named_modules() if n.rsplit(".", 1)[-1] in names and hasattr(m, "weight")]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _layer_scale(model: torch.nn.Module, f: Fault) -> Planted:
    ls = layers(model)
    i = int(torch.randint(len(ls), (1,), generator=_generator(f.seed)))
    n = 0
    for _, m in _linears(ls[i], ("o_proj", "down_proj")):
        m.weight.mul_(1 + f.severity)
        n += m.weight.numel()
    return Planted(f, f"decoder layer {i}'s o_proj and down_proj weights × {1 + f.severity:g}", n)


def _round_rows_4bit(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny) / 7
    return (w / scale).round().clamp(-7, 7) * scale


def _weight_bits(model: torch.nn.Module, f: Fault) -> Planted:
    g, n = _generator(f.seed), 0
    for layer in layers(model):
        for _, m in _linears(layer):
            w = m.weight
            mask = (torch.rand(w.shape, generator=g) < f.severity).to(w.device)
            w.copy_(torch.where(mask, _round_rows_4bit(w.float()).to(w.dtype), w))
            n += int(mask.sum())
    return Planted(f, f"{f.severity:g} of every linear layer's weights rounded to 4 bits (per-row absmax / 7)", n)


def _kv_scale(model: torch.nn.Module, f: Fault) -> Planted:
    n = 0
    for layer in layers(model):
        for _, m in _linears(layer, ("k_proj", "v_proj")):
            m.weight.mul_(1 + f.severity)
            if getattr(m, "bias", None) is not None:
                m.bias.mul_(1 + f.severity)
            n += m.weight.numel()
    return Planted(f, f"every layer's keys and values × {1 + f.severity:g} (k_proj, v_proj)", n)


def _weight_noise(model: torch.nn.Module, f: Fault) -> Planted:
    g, n = _generator(f.seed), 0
    for layer in layers(model):
        for _, m in _linears(layer):
            w = m.weight
            noise = torch.randn(w.shape, generator=g).to(device=w.device, dtype=torch.float32)
            w.add_((noise * f.severity * w.float().std()).to(w.dtype))
            n += w.numel()
    return Planted(f, f"Gaussian noise of {f.severity:g} × each weight matrix's standard deviation on every linear layer", n)


def stretch_positions(positions: torch.Tensor, start: int, stretch: float) -> torch.Tensor:
    """p → p before `start`, start + (p − start)·(1 + stretch) from it on (float positions).

    >>> stretch_positions(torch.tensor([[0, 4, 5, 8]]), 5, 1.0).tolist()
    [[0.0, 4.0, 5.0, 11.0]]
    """
    p = positions.float()
    return torch.where(p >= start, start + (p - start) * (1 + stretch), p)


def _late_positions(model: torch.nn.Module, f: Fault) -> Planted:
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None:
        raise ValueError(f"{type(model).__name__}: no rotary embedding at model.model.rotary_emb")

    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if "position_ids" in kwargs:
            kwargs = {**kwargs, "position_ids": stretch_positions(kwargs["position_ids"], f.start, f.severity)}
        elif len(args) > 1:
            args = (args[0], stretch_positions(args[1], f.start, f.severity), *args[2:])
        return args, kwargs

    handle = rotary.register_forward_pre_hook(hook, with_kwargs=True)
    return Planted(f, f"rotary positions from {f.start} on stretched × {1 + f.severity:g}", 0, [handle])


PLANTERS: dict[str, Callable[[torch.nn.Module, Fault], Planted]] = {
    "layer_scale": _layer_scale, "weight_bits": _weight_bits, "kv_scale": _kv_scale, "weight_noise": _weight_noise,
    "late_positions": _late_positions,
}


def plant(model: torch.nn.Module, fault: Fault) -> Planted:
    """Put `fault` into `model` in place; severity 0 changes nothing."""
    if fault.severity == 0:
        return Planted(fault, "no damage (severity 0)")
    with torch.no_grad():
        return PLANTERS[fault.kind](model, fault)
