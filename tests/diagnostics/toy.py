"""A tiny causal-LM-shaped model with HF-style module names (model.layers.N.mlp.up_proj, lm_head),
quantized by qval's own ModelOpt adapter: real TensorQuantizers in a second, not a 135M model."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

VOCAB, DIM, LAYERS = 64, 32, 4


class RMSNorm(nn.Module):
    """Hand-written like Llama's, so ModelOpt (which wraps nn.LayerNorm) leaves it unquantized."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Module()
        self.mlp.up_proj = nn.Linear(DIM, 2 * DIM, bias=False)
        self.mlp.down_proj = nn.Linear(2 * DIM, DIM, bias=False)
        self.norm = RMSNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp.down_proj(torch.relu(self.mlp.up_proj(self.norm(x))))


class ToyLM(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.model.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        with torch.no_grad():
            for layer in self.model.layers:  # a few outlier input channels, as real LLMs have
                layer.mlp.up_proj.weight[:, :2] *= 6

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return SimpleNamespace(logits=self.lm_head(x) * 3)


def batches(n: int = 2, batch: int = 4, seq: int = 32, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(n)]


def quantized(fmt: str = "int8_sq", seed: int = 0) -> tuple[ToyLM, nn.Module, list[torch.Tensor]]:
    """(reference, calibrated candidate, calibration batches)."""
    from qval.config import QuantConfig
    from qval.quantize.modelopt_adapter import quantize

    reference = ToyLM(seed).eval()
    candidate = copy.deepcopy(reference)
    data = batches()
    quantize(candidate, QuantConfig(format=fmt), data, "cpu")
    return reference, candidate.eval(), data
