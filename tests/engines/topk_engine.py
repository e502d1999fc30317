"""An in-process engine answered as a server answers: its top K and the actual next token per position.

Wraps any engine that gives full logits, so a test can hold what a served engine's compact answers
give (exact top-1, NLL, the lm-eval log-likelihoods) against the same engine's full logits. Each call
goes to the same call of the inner engine (pieces to pieces), so the answers differ from the inner
engine's in their form only, not by the rounding of another computation: the identity stays exact.
How a served engine slices one whole answer into pieces is tested in test_served.py.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from qval.engines.base import Engine, Generation
from qval.logits import Compact, from_topk


def compact_of(logits: torch.Tensor, ids: torch.Tensor, k: int, start: int = 0) -> Compact:
    """[B, n, V] logits of positions start..start+n of the input `ids` [B, T] -> a [B, n] block of
    top-K answers."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    n = lp.shape[1]
    following = torch.cat([ids, torch.full((ids.shape[0], 1), -1, dtype=ids.dtype)], dim=1)
    nxt = following[:, start + 1 : start + 1 + n].to(lp.device)
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

    @property
    def model_config(self) -> Any:
        return self.inner.model_config

    def logits(self, input_ids: torch.Tensor) -> Compact:
        return compact_of(self.inner.logits(input_ids), input_ids, self.k)

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Compact]:
        start = 0
        for block in self.inner.logits_pieces(input_ids, piece):
            yield compact_of(block, input_ids, self.k, start)
            start += block.shape[1]

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Compact:
        first = len(prompt) - 1
        block = self.inner.answer_logits(prompt, answer)  # [len(answer), V]: positions first.. of prompt + answer
        return compact_of(block.unsqueeze(0), torch.tensor([prompt + answer]), self.k, first)[0]

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        return self.inner.generate(prompts, max_new_tokens, suppress_eos=suppress_eos, batch_size=batch_size, progress=progress)
