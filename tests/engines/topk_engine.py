"""An in-process engine answered as a server answers: its top K and the actual next token per position.

Wraps any engine that gives full logits, so a test can hold what a served engine's compact answers
give (exact top-1, NLL, the lm-eval log-likelihoods) against the same engine's full logits.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from qval.engines.base import Engine, Generation
from qval.logits import Compact, from_topk


def compact_of(logits: torch.Tensor, ids: torch.Tensor, k: int) -> Compact:
    """[B, T, V] logits of the input `ids` [B, T] -> a [B, T] block of top-K answers."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    nxt = torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -1, dtype=ids.dtype)], dim=1).to(lp.device)
    top = lp.topk(k, dim=-1)
    got = lp.gather(-1, nxt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    nxt_lp = torch.where(nxt >= 0, got, torch.full_like(got, float("nan")))
    return from_topk(lp.shape[-1], top.indices.cpu(), top.values.cpu(), nxt.cpu(), nxt_lp.cpu(),
                     torch.isfinite(logits).all(dim=-1).cpu())


class TopKEngine(Engine):
    backend = "topk"
    full_logits = False

    def __init__(self, inner: Engine, k: int) -> None:
        self.inner, self.k = inner, k

    @property
    def device(self) -> str:
        return "topk:" + self.inner.device

    def logits(self, input_ids: torch.Tensor) -> Compact:
        return compact_of(self.inner.logits(input_ids), input_ids, self.k)

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Compact]:
        whole = self.logits(input_ids)  # as a server: the sequence whole, sliced
        for start in range(0, input_ids.shape[1], piece):
            yield whole[:, start : start + piece]

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Compact:
        first = len(prompt) - 1
        return self.logits(torch.tensor([prompt + answer]))[0, first : first + len(answer)]

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        return self.inner.generate(prompts, max_new_tokens, suppress_eos=suppress_eos, batch_size=batch_size, progress=progress)
