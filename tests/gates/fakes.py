"""A tiny deterministic language model behind the Engine interface, for testing gate 3's
bookkeeping (positions, windows, drift, collapse) with numbers that can be worked by hand.

The "model" puts logit HIGH on one token chosen by a rule of (current token, absolute position)
and LOW on every other token, so every KLD and NLL has a closed form:
p_hi = e^HIGH / Z, p_lo = e^LOW / Z, Z = e^HIGH + (V − 1)·e^LOW.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch

from qval.engines.base import Engine, Generation

V = 64
EOS = 63
HIGH, LOW = 5.0, -5.0
Z = math.exp(HIGH) + (V - 1) * math.exp(LOW)
P_HI, P_LO = math.exp(HIGH) / Z, math.exp(LOW) / Z
#: KLD between two such distributions whose peaks differ: (p_hi − p_lo)·(HIGH − LOW)
KLD_MISMATCH = (P_HI - P_LO) * (HIGH - LOW)

Rule = Callable[[int, int], int]  # (token, absolute position) -> next token


def walk(token: int, pos: int) -> int:
    """The reference's rule: t_{i+1} = (t_i + i) mod 60, a sequence with period 120 (no short loop)."""
    return (token + pos) % 60


def collapse_after(start: int) -> Rule:
    """The reference's rule until absolute position `start`, then a 2-token loop 61 62 61 62 …"""
    def rule(token: int, pos: int) -> int:
        if pos < start:
            return walk(token, pos)
        return 62 if token == 61 else 61
    return rule


class FakeEngine(Engine):
    backend = "fake"

    def __init__(self, rule: Rule, nan_from: int | None = None) -> None:
        self.rule = rule
        self.nan_from = nan_from  # absolute position from which logits are NaN
        self.generate_calls = 0
        self.pieces_rows: list[int] = []  # rows of each logits_pieces call

    @property
    def device(self) -> str:
        return "cpu"

    def _row(self, token: int, pos: int) -> torch.Tensor:
        row = torch.full((V,), LOW)
        row[self.rule(token, pos)] = HIGH
        if self.nan_from is not None and pos >= self.nan_from:
            row[0] = float("nan")
        return row

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.stack([self._row(int(t), i) for i, t in enumerate(seq)]) for seq in input_ids])

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[torch.Tensor]:
        self.pieces_rows.append(input_ids.shape[0])
        rows = input_ids.tolist()
        for s in range(0, len(rows[0]), piece):
            yield torch.stack([torch.stack([self._row(t, s + i) for i, t in enumerate(ids[s : s + piece])]) for ids in rows])

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        self.generate_calls += 1
        tokens, bad, eos = [], [], []
        for p in prompts:
            seq, out, first_bad, stop = list(p), [], None, None
            for k in range(max_new_tokens):
                row = self._row(seq[-1], len(seq) - 1)
                if first_bad is None and not torch.isfinite(row).all():
                    first_bad = k
                if suppress_eos:
                    row[EOS] = -math.inf
                nxt = int(torch.nan_to_num(row, nan=-1e9).argmax())
                out.append(nxt)
                seq.append(nxt)
                if nxt == EOS and not suppress_eos:
                    stop = k
                    break
            tokens.append(out), bad.append(first_bad), eos.append(stop)
            if progress is not None:
                progress(1)
        return Generation(tokens=tokens, first_nonfinite_step=bad, eos_step=eos)


class FakeTokenizer:
    """No chat template: prompts are used raw, one token per character (mod 60)."""

    chat_template = None
    eos_token_id = EOS

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 60 for c in text]}
