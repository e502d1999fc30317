"""What an engine answers when asked for logits: `Logits`, full or compact.

Every engine method that scores tokens (`Engine.logits`, `logits_pieces`, `answer_logits`) returns
`Logits`, one of two forms with the same tensor-like view of the leading dimensions:

- a `torch.Tensor` [..., V] of raw logits: an engine that computes in this process (the reference
  model, a simulated or exported candidate);
- a `Compact` block [...]: the next-token distributions given compactly, from
  * the reference snapshot (`qval.metrics.compact.compress`): the top k log-probabilities, the
    tail's mass and points sampled from it, or the whole log-softmax (`topk: exact`);
  * a served engine (`qval.engines.served`): what a server's API returns per position, its top K
    log-probabilities and the actual next token's.

What is exact in either form: the argmax (top-1 agreement, greedy marks) and the log-probability of
the token that actually follows in the input (NLL, perplexity, Δp). KLD between two distributions
of which one is compact is an estimate held by a bound (`qval.metrics.tokens.token_stats`, which
takes either form on either side). A gate never asks which form it got: `Compact` indexes, reshapes
and moves like a tensor of its leading dimensions, and the metric functions take both.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor


@dataclass
class Compact:
    """Next-token distributions of a [...] block of positions (the leading shape is the logits' own),
    given compactly. `vocab` is the size of the vocabulary the distributions are over."""

    vocab: int
    best: Tensor  # [...] int64: the argmax
    next_token: Tensor  # [...] int64: the input's next token at this position, −1 where none
    next_logp: Tensor  # [...] float32: its log-probability (NaN where none)
    finite: Tensor  # [...] bool: the row's logits were all finite
    top_logp: Tensor | None = None  # [..., k] float32, descending
    top_idx: Tensor | None = None  # [..., k] int32
    log_tail: Tensor | None = None  # [...] float32: log of the mass outside the top k (−inf: none)
    tail_idx: Tensor | None = None  # [..., P] int32: tokens standing for the tail (snapshot only)
    tail_logp: Tensor | None = None  # [..., P] float32: their log-probabilities
    full: Tensor | None = None  # [..., V] float32 log-probs: exact mode
    #: the full logits when they were computed in this process (never stored): the audit's exact KLD
    source: Tensor | None = None

    # ---- a tensor-like view of the leading dimensions -------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.best.shape, self.vocab))

    @property
    def device(self) -> torch.device:
        return self.best.device

    @property
    def k(self) -> int | None:
        """How many log-probabilities per position are given by token (None: all of them)."""
        return None if self.full is not None else int(self.top_logp.shape[-1])  # type: ignore[union-attr]

    def _map(self, fn: Any) -> "Compact":
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self)
                                if isinstance(getattr(self, f.name), Tensor)})

    def __getitem__(self, index: Any) -> "Compact":
        """Index the leading dimensions (the vocabulary axis is never indexed)."""
        return self._map(lambda t: t[index])

    def reshape(self, *shape: int) -> "Compact":
        """`reshape(-1, V)`: all leading dimensions into one."""
        if len(shape) != 2 or shape[1] != self.vocab:
            raise ValueError(f"Compact reshape takes (-1, {self.vocab}), got {shape}")
        lead = int(np.prod(self.best.shape))
        return self._map(lambda t: t.reshape(lead, *t.shape[self.best.dim():]))

    def float(self) -> "Compact":
        return self

    def to(self, device: Any) -> "Compact":
        return self._map(lambda t: t.to(device))

    def argmax(self, dim: int = -1) -> Tensor:
        """The argmax per position (only over the vocabulary axis)."""
        if dim not in (-1, self.best.dim()):
            raise ValueError("Compact.argmax is over the vocabulary axis only")
        return self.best

    def all_finite(self) -> bool:
        return bool(self.finite.all())

    def stored(self) -> dict[str, np.ndarray]:
        """The arrays a snapshot file holds (no `source`)."""
        return {f.name: getattr(self, f.name).cpu().numpy() for f in fields(self)
                if f.name not in ("vocab", "source") and getattr(self, f.name) is not None}

    @classmethod
    def from_stored(cls, arrays: dict[str, np.ndarray], vocab: int) -> "Compact":
        return cls(vocab=vocab, **{k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})


#: what an engine's scoring methods return: raw logits [..., V], or a `Compact` block [...]
Logits = Union[Tensor, Compact]


def cat(parts: list[Logits], dim: int = 0) -> Logits:
    """Concatenate blocks of one form along a leading dimension."""
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts, dim=dim)  # type: ignore[arg-type]
    out = {f.name: torch.cat([getattr(p, f.name) for p in parts], dim=dim) for f in fields(first)
           if isinstance(getattr(first, f.name), Tensor) and f.name != "source"}
    src = [p.source for p in parts]  # type: ignore[union-attr]
    out["source"] = torch.cat(src, dim=dim) if all(s is not None for s in src) else None
    return Compact(vocab=first.vocab, **out)


def all_finite(x: Logits) -> bool:
    """Whether every row of a block was finite."""
    return bool(torch.isfinite(x).all()) if isinstance(x, Tensor) else x.all_finite()


def from_topk(vocab: int, top_idx: Tensor, top_logp: Tensor, next_token: Tensor, next_logp: Tensor,
              finite: Tensor) -> Compact:
    """A block from what a server returns per position: its top K token ids and log-probabilities
    (any order), the input's next token (−1: none) and its log-probability. The argmax is the top
    log-probability's token; the tail is the mass the K tokens leave (here 1 − e^−0.5 − e^−1.2).

    >>> c = from_topk(4, torch.tensor([[2, 0]]), torch.tensor([[-1.2, -0.5]]), torch.tensor([3]),
    ...               torch.tensor([-3.0]), torch.tensor([True]))
    >>> c.best.tolist(), c.top_idx.tolist(), round(float(c.log_tail.exp()[0]), 4)
    ([0], [[0, 2]], 0.0923)
    """
    order = top_logp.argsort(dim=-1, descending=True, stable=True)
    logp = top_logp.gather(-1, order).float()
    idx = top_idx.gather(-1, order).to(torch.int32)
    mass = logp.double().exp().sum(dim=-1)
    log_tail = torch.log1p(-mass.clamp(max=1.0)).float()  # −inf: the K tokens hold all the mass (to rounding)
    return Compact(vocab=vocab, best=idx[..., 0].long(), next_token=next_token.long(), next_logp=next_logp.float(),
                   finite=finite.bool(), top_logp=logp, top_idx=idx, log_tail=log_tail)
