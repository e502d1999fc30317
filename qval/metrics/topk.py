"""Per-position statistics where one side is known only on its top K (a served engine).

A server's completions API returns, per prompt position, the log-probabilities of its top K tokens
and of the token that actually follows; the rest of its distribution is unseen. Exact from that:
top-1 agreement, the true token's NLL and probability (so perplexity and Δp). KLD(ref‖cand) is not:
let A be the tokens whose probability both models give (the candidate's top K and the actual token,
each where the reference's probability is known: everywhere for full reference logits, on its top k,
sampled tail tokens and actual token for a snapshot), R = 1 − P_ref(A), C = 1 − P_cand(A) the mass each
puts on the unseen tokens B. Then exactly

    KLD = Σ_A p_r·log(p_r/p_c) + R·log(R/C) + R·KL(p_r|B ‖ p_c|B)

with p|B the distributions conditioned on B. The first two terms are known; the third, the shape of
the damage among unseen tokens, is not, and is ≥ 0. So

- `kld_lower` = the first two terms: a strict lower bound (the log-sum inequality), at every position;
- `kld_estimate` = `kld_lower` + R·max(KL(p_r|A ‖ p_c|A), KL over the seen half nearest the tail): the
  unseen tokens assumed as damaged as the seen ones, or as the least likely seen ones where those are worse
  (quantization noise grows toward the tail);
- `kld` = `kld_estimate` + max(0, `kld_estimate` − the same estimate from the top K/2 alone): the estimate
  plus what it gained, at this position, when the list doubled from K/2 to K. This is the figure the gates
  compare with their limits. The estimate falls short of the exact KLD by less the longer the list, so
  its last doubling's gain stands for what a longer list would still add (were the shortfall to shrink
  by a factor ρ per doubling, the rest is the gain × ρ/(1 − ρ): covered for ρ ≤ 1/2); the per-position
  max(0, ·) keeps the figure at or above the estimate. With both sides served the shortfall shrinks more
  slowly (the tokens both lists hold are fewer), and the last two doublings' gains are added (K/4 → K/2
  and K/2 → K, both lists cut; covered for ρ ≤ 1/√2). It is not a bound. How it compares with the exact
  KLD, per K and per side served, is measured by `benchmarks/topk_kld.py` (benchmarks/RESULTS.md §13).

The reference may be known by its top K too (a served reference): against a served candidate, A is
then the tokens both top lists hold and the actual token, and the shorter lists' estimates cut both; against
full candidate logits, A is the reference's top K and the actual token (`topk_reference_stats`). The
decomposition, the bound and the estimate are the same, with R the reference's mass outside A.

No upper bound exists from top-K log-probabilities: a candidate can give any unseen token a
probability as small as it likes. What the estimate rests on is R ("unseen_mass"), reported beside
it; `kld − kld_lower` is the part that is assumed, not measured.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
from torch import Tensor

from ..logits import Compact
from .rows import _check_targets, _log_probs, _nan_where_not, _to_cpu64, position_stats

_ROWS = 256  # rows per step where a dense [rows, V] lookup of a compact reference is built
_FLOOR = 1e-9  # the candidate's unseen mass is never taken below this (its float32 log-probs sum to ~1e-7)


def _ref_at(ref: Tensor | Compact, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The reference's log-probabilities at `ids` [N, M] (−1: none), float64, NaN where it does not
    give one; its argmax [N] and finiteness [N]."""
    safe = ids.clamp(min=0).long()
    if isinstance(ref, Tensor) or ref.full is not None:
        lp, finite = _log_probs(ref) if isinstance(ref, Tensor) else (ref.full, ref.finite)
        got = lp.gather(1, safe.to(lp.device)).double().cpu()
        best = lp.argmax(dim=-1).cpu()
        return torch.where(ids >= 0, got, torch.full_like(got, float("nan"))), best, finite.cpu()
    # a snapshot's block: its top k, sampled tail tokens and the next token; a served reference's: its top K and the next token
    tails = [] if ref.tail_idx is None else [ref.tail_idx.long()]
    tail_lps = [] if ref.tail_logp is None else [ref.tail_logp]
    known_idx = torch.cat([ref.top_idx.long(), *tails, ref.next_token.long().clamp(min=0).unsqueeze(1)], dim=1).cpu()
    nxt_lp = torch.where(ref.next_token >= 0, ref.next_logp, torch.full_like(ref.next_logp, float("nan")))
    known_lp = torch.cat([ref.top_logp, *tail_lps, nxt_lp.unsqueeze(1)], dim=1).float().cpu()
    out = torch.empty(ids.shape, dtype=torch.float64)
    for r0 in range(0, ids.shape[0], _ROWS):
        rows = slice(r0, min(ids.shape[0], r0 + _ROWS))
        dense = torch.full((rows.stop - r0, ref.vocab), float("nan"))
        # the next token last: where it is NaN (no next token) it must not hide a top/tail value of token 0
        dense.scatter_(1, known_idx[rows, -1:], known_lp[rows, -1:])
        dense.scatter_(1, known_idx[rows, :-1], known_lp[rows, :-1])
        out[rows] = dense.gather(1, safe[rows]).double()
    return torch.where(ids >= 0, out, torch.full_like(out, float("nan"))), ref.best.cpu(), ref.finite.cpu()


def _conditional_kld(lr: Tensor, lc: Tensor, mask: Tensor) -> Tensor:
    """KL(p_r|S ‖ p_c|S) of the two distributions conditioned on the tokens `mask` selects, per row
    (NaN where S is empty)."""
    pr = torch.where(mask, lr.exp(), 0.0)
    head = torch.where(mask, pr * (lr - lc), 0.0).sum(dim=-1)
    mr, mc = pr.sum(dim=-1), torch.where(mask, lc.exp(), 0.0).sum(dim=-1)
    return (head / mr + torch.log(mc / mr)).clamp(min=0.0)


@torch.no_grad()
def topk_stats(ref: Tensor | Compact, cand: Compact, targets: Tensor) -> dict[str, Tensor]:
    """`token_stats` for a candidate given by its top K: the same keys ("kld" the gated figure above),
    plus "kld_estimate" (the plain estimate), "kld_lower" (strict lower bound) and "unseen_mass" (R).
    `ref` [N, V] logits or a compact [N] block; `cand` a compact [N] block whose next tokens are `targets`."""
    if cand.top_idx is None:
        raise ValueError("a candidate given compactly must give its top K (a served engine's answer)")
    top, nxt = _checked_answer(cand, "candidate", tuple(ref.shape), (tuple(ref.shape), tuple(cand.shape)), targets)
    ids = torch.cat([top, nxt.unsqueeze(1)], dim=1)
    lr_ids, best_ref, finite_ref = _ref_at(ref, ids)
    lc_ids = torch.cat([cand.top_logp.cpu(), cand.next_logp.cpu().unsqueeze(1)], dim=1).double()
    # both served: the shorter lists' estimates know the reference by its shorter list too
    cut = _reference_cut(ref, ids) if is_topk_reference(ref) else None
    return _partial_stats(top, nxt, lr_ids, lc_ids, best_ref, cand.best.cpu(), finite_ref, cand.finite.cpu().bool(), cut)


def _reference_cut(ref: Compact, ids: Tensor) -> Callable[[int], Tensor]:
    """For a reference known by its top K: its log-probabilities at `ids` where it is known by its top K/d only."""
    assert ref.top_idx is not None and ref.top_logp is not None
    top_idx, top_logp = ref.top_idx, ref.top_logp
    return lambda d: _ref_at(replace(ref, top_idx=top_idx[:, : top_idx.shape[-1] // d],
                                     top_logp=top_logp[:, : top_logp.shape[-1] // d]), ids)[0]


def _checked_answer(block: Compact, side: str, other: tuple[int, ...], shapes: tuple[tuple[int, ...], ...],
                    targets: Tensor) -> tuple[Tensor, Tensor]:
    """A side given by its top K, checked against the other side's shape `other` and the targets: its top
    ids [N, K] and next tokens [N] (int64, CPU). `shapes`: (ref, cand) as the error names them."""
    n = block.best.shape[0]
    if block.best.dim() != 1 or other != (n, block.vocab):
        raise ValueError(f"logits shapes differ: ref {shapes[0]} vs cand {shapes[1]}")
    targets = targets.cpu()
    _check_targets(targets, n, block.vocab)
    nxt = block.next_token.cpu().long()
    if n and not bool((nxt == targets).all()):
        raise ValueError(f"a {side} given by its top K holds the log-probability of the input's next token only; "
                         "these targets differ from it")
    return block.top_idx.cpu().long(), nxt


def is_topk_reference(ref: object) -> bool:
    """Whether a reference block is known by its top K alone (a served reference: no sampled tail, no full row)."""
    return isinstance(ref, Compact) and ref.top_idx is not None and ref.tail_idx is None and ref.full is None


@torch.no_grad()
def topk_reference_stats(ref: Compact, logits_cand: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """`token_stats` for a reference known by its top K (a served reference) against a candidate's full
    logits [N, V]: the same estimate with the roles of the two sides' knowledge swapped — A is the
    reference's top K and the actual token, where the candidate is known everywhere; the seen half nearest
    the tail is the reference's less likely half. Same keys as `topk_stats`."""
    shape = tuple(logits_cand.shape)
    top, nxt = _checked_answer(ref, "reference", shape, (tuple(ref.shape), shape), targets)
    ids = torch.cat([top, nxt.unsqueeze(1)], dim=1)
    lp_cand, finite_cand = _log_probs(logits_cand)
    lc_ids = lp_cand.gather(1, ids.to(lp_cand.device)).double().cpu()
    best_cand = lp_cand.argmax(dim=-1).cpu()
    del lp_cand
    lr_ids = torch.cat([ref.top_logp.cpu(), ref.next_logp.cpu().unsqueeze(1)], dim=1).double()
    return _partial_stats(top, nxt, lr_ids, lc_ids, ref.best.cpu(), best_cand, ref.finite.cpu().bool(), finite_cand.cpu())


def _partial_stats(top: Tensor, nxt: Tensor, lr: Tensor, lc: Tensor, best_ref: Tensor, best_cand: Tensor,
                   finite_ref: Tensor, finite_cand: Tensor, ref_cut: Callable[[int], Tensor] | None = None) -> dict[str, Tensor]:
    """The figures above over ids = [one side's top K (sorted, most likely first) | the actual token]:
    `lr`, `lc` [N, K + 1] the two sides' log-probabilities there (NaN where a side does not give one).
    `ref_cut(d)`: with both sides served, the reference's log-probabilities at the same ids where it is known
    by its top K/d only; then the last two doublings' gains are added, else the last one's."""
    k = top.shape[-1]
    lower, estimate, r = _kld_parts(top, nxt, lr, lc)
    gated, longer = estimate, estimate
    for div in ((2, 4) if ref_cut is not None else (2,)):
        cols = [*range(k // div), k]  # the top K/div and the actual token
        _, shorter, _ = _kld_parts(top[:, : k // div], nxt, (lr if ref_cut is None else ref_cut(div))[:, cols], lc[:, cols])
        gated = gated + (longer - shorter).clamp(min=0.0)
        longer = shorter
    both = finite_ref & finite_cand
    top1 = (best_ref == best_cand) & both
    out = position_stats(gated, top1, lr[:, k], lc[:, k], finite_ref, finite_cand)
    out["kld_estimate"] = _to_cpu64(_nan_where_not(estimate, both))
    out["kld_lower"] = _to_cpu64(_nan_where_not(lower, both))
    out["unseen_mass"] = _to_cpu64(_nan_where_not(r, both))
    return out


def _kld_parts(top: Tensor, nxt: Tensor, lr: Tensor, lc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per position: the strict lower bound, the estimate and R over ids = [top K | the actual token]."""
    k = top.shape[-1]
    # the actual token counted once: where it is among the top K, its own column stands aside
    dup = torch.zeros(lr.shape, dtype=torch.bool)
    dup[:, k] = (top == nxt.unsqueeze(1)).any(dim=1)
    seen = torch.isfinite(lr) & torch.isfinite(lc) & ~dup
    pr, pc = torch.where(seen, lr.exp(), 0.0), torch.where(seen, lc.exp(), 0.0)
    head = torch.where(seen, pr * (lr - lc), 0.0).sum(dim=-1)
    r = (1.0 - pr.sum(dim=-1)).clamp(min=0.0)
    c = (1.0 - pc.sum(dim=-1)).clamp(min=_FLOOR)
    lower = head + torch.where(r > 0, r * torch.log(r / c), torch.zeros_like(r))
    low_half = seen.clone()
    low_half[:, : k // 2] = False  # the top K is sorted: its less likely half, and the actual token
    shape = torch.maximum(_conditional_kld(lr, lc, seen), _conditional_kld(lr, lc, low_half).nan_to_num(nan=0.0))
    return lower, lower + r * shape.nan_to_num(nan=0.0), r
