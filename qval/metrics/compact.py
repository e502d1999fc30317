"""The reference's next-token distributions, stored compactly, and the figures computed from them.

A `Compact` holds, per position, what every gate needs from the reference without its
[positions × vocab] logits: the log-probability of the token that actually follows in the input
(exact: NLL, p(x), perplexity), the argmax (exact: top-1 agreement, greedy marks), the `k` largest
log-probabilities with their token ids, and the log of the mass outside them (the tail). With
`k = None` ("exact" mode) it keeps the whole float32 log-softmax instead.

It also keeps `TAIL_POINTS` tokens of the tail picked at evenly spaced quantiles of its
cumulative mass (a systematic sample: a token is picked in proportion to its probability), with
their log-probabilities. KLD(ref‖cand) from it, per position, with T_r / T_c the tail masses of the
reference / candidate outside the reference's top k, v_j the P tail points, r = log p_r − log p_c,
m the reference's k-th probability (no tail token is more likely under the reference) and
w(p_c) = clamp((p_c/m − 1)/(SPLIT − 1), 0, 1), a weight known for every token from the candidate alone:

    estimate = Σ_top p_r(v)·(log p_r(v) − log p_c(v)) + (T_r − T_c) + Σ_tail w·p_c
               + (T_r/P)·Σ_j [r_j − 1 + (1 − w_j)·e^(−r_j)]

This is exactly the tail's Σ p_r·log(p_r/p_c) = (T_r − T_c) + Σ p_r·g(r), g(r) = r − 1 + e^(−r) ≥ 0,
with the p_r-weighted e^(−r) = p_c/p_r part split in two: the share w summed exactly over the whole
tail, the rest sampled. Where w = 0 (p_c ≤ m: every token of a candidate equal to the reference, whose
figure is then exactly 0) the sampled term is g, second order in r, so its noise stays relative to the
KLD even when that is tiny (near-uniform distributions); where w = 1 (p_c ≥ SPLIT·m ≥ SPLIT·p_r: a
token the candidate makes far likelier than the reference can) only p_r·(r − 1) is sampled, and the
p_c the token contributes no longer rides on the rare point that lands on it — the error a damaged
candidate makes. (A cut at m itself, w a step there, puts the near-identical case's tokens on both
sides of it and brings first-order noise back: ×10 on a synthetic pair of KLD 5e-5.)
`benchmarks/snapshot_k.py` measures the agreement; on the built-in model at k = 128, int8_sq α 0.5
(4,080 positions), the per-position error's 99th percentile went from 20 % to 8 % of the position's
KLD with this split and 256 points (64 points and no split before), its largest from 0.56 to 0.12
nats. What no compact form can see: a token the reference finds near impossible to which the
candidate gives less than ~m (below the split) is an ordinary tail token to it; unless sampled, its
share of the KLD (≈ its candidate probability, at most ~m ≤ 1/k per such token) is missed —
tests/snapshot/test_compact.py measures that case, the upper bound covers it, `topk: exact` has no such gap.

The estimate is held between two bounds. Lumping the tail into one outcome, Σ_top … +
T_r·(log T_r − log T_c), is a LOWER bound of the true KLD (the log-sum inequality). The largest the
true value can be is found from the candidate's own distribution: every tail token has
p_r(v) ≤ m (the reference's k-th probability), so the tail's contribution Σ p_r·log(p_r/p_c)
(convex in p_r) is largest when mass m sits on the candidate's least likely tail tokens, in order.
`upper` is that maximum (computed over the `BOUND_TOKENS` least likely tokens; mass beyond them is
charged at the last one's probability and at log m, which only raises it): the true KLD lies in
[lower, upper] at every position; the estimate is clamped into it, and the report prints the
mean estimate and the mean upper bound. On the built-in model the lumped bound alone is ~20 %
below the full KLD at k = 64 (its tail is heavy); the sampled tail brings it within the measured
agreement that `benchmarks/snapshot_k.py` records.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..logits import Compact
from .rows import _check_logits, _check_targets, _log_probs, _nan_where_not, _to_cpu64, kld_rows, position_stats

BOUND_TOKENS = 256  # candidate tail tokens the upper bound looks at one by one
TAIL_POINTS = 256  # tokens that stand for the reference's tail, each for 1/TAIL_POINTS of its mass
SPLIT = 3.0  # from SPLIT × the reference's k-th probability on, a tail token's e^(−r) part is summed exactly
_ROWS = 512  # rows per step of the tail's cumulative sum (its float32 temporaries stay O(512 × V))


def _tail_points(lp: Tensor, top_idx: Tensor, points: int) -> tuple[Tensor, Tensor, Tensor]:
    """log of the tail mass, and `points` tail tokens picked at evenly spaced quantiles of the
    tail's cumulative mass (token-id order; midpoints (j + ½)/points): a systematic sample in
    which a token is picked in proportion to its reference probability. With their log-probs."""
    n = lp.shape[0]
    log_tail = torch.empty(n, dtype=lp.dtype, device=lp.device)
    idx = torch.zeros(n, points, dtype=torch.int64, device=lp.device)
    for r0 in range(0, n, _ROWS):
        rows = slice(r0, min(n, r0 + _ROWS))
        rest = lp[rows].scatter(1, top_idx[rows], float("-inf"))
        log_tail[rows] = torch.logsumexp(rest, dim=-1)
        cum = rest.exp_().cumsum_(dim=-1)
        del rest
        u = (torch.arange(points, device=lp.device, dtype=cum.dtype) + 0.5) / points
        at = torch.searchsorted(cum, (u.unsqueeze(0) * cum[:, -1:]).contiguous())
        idx[rows] = at.clamp_(max=lp.shape[1] - 1)
        del cum
    return log_tail, idx.to(torch.int32), lp.gather(1, idx)


@torch.no_grad()
def compress(logits: Tensor, next_token: Tensor, k: int | None, keep_source: bool = False) -> Compact:
    """The compact form of `logits` [..., V]; `next_token` [...] the input's next token per
    position (−1: none). Computed on the logits' device in float32; the result lives on the CPU."""
    vocab = int(logits.shape[-1])
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, vocab)
    finite = torch.isfinite(flat).all(dim=-1)
    lp = F.log_softmax(flat.float(), dim=-1)
    nxt = next_token.reshape(-1).to(flat.device).long()
    has = nxt >= 0
    gathered = lp.gather(1, nxt.clamp(min=0).unsqueeze(1)).squeeze(1)
    next_logp = torch.where(has, gathered, torch.full_like(gathered, float("nan")))
    out: dict[str, Any] = {"best": lp.argmax(dim=-1), "next_token": nxt, "next_logp": next_logp, "finite": finite}
    if k is None or k >= vocab:
        out["full"] = lp
    else:
        top = lp.topk(k, dim=-1)  # sorted, descending
        out["top_logp"], out["top_idx"] = top.values, top.indices.to(torch.int32)
        out["log_tail"], out["tail_idx"], out["tail_logp"] = _tail_points(lp, top.indices, TAIL_POINTS)
    del lp
    shaped = {name: t.reshape(*lead, *t.shape[1:]).cpu() for name, t in out.items()}
    return Compact(vocab=vocab, source=logits if keep_source else None, **shaped)


def _split_weight(log_pc: Tensor, log_m: Tensor) -> Tensor:
    """w(p_c) = clamp((p_c/m − 1)/(SPLIT − 1), 0, 1): 0 up to the reference's k-th probability m
    (a candidate equal to the reference has every tail token there, so its figure is exactly 0),
    1 from SPLIT·m on (a token the candidate makes ≥ SPLIT× likelier than the reference can)."""
    return ((log_pc - log_m).exp() - 1).div_(SPLIT - 1).clamp_(0, 1)


def _xlogx(x: Tensor) -> Tensor:
    return torch.where(x > 0, x * torch.log(x.clamp(min=1e-45)), torch.zeros_like(x))


@torch.no_grad()
def kld_terms(ref: Compact, lp_cand: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of a flat [N] ref and [N, V] candidate log-probs: (estimate, upper bound) of
    KLD(ref‖cand) as the module docstring defines them; exact (both equal) in exact mode."""
    dev = lp_cand.device
    if ref.full is not None:
        kld = kld_rows(ref.full.to(dev), lp_cand.clone())  # token_stats' own formula (it consumes its second argument)
        return kld, kld
    top_lr = ref.top_logp.to(dev)
    idx = ref.top_idx.to(dev).long()
    top_lc = lp_cand.gather(1, idx)
    head = (top_lr.exp() * (top_lr - top_lc)).sum(dim=-1)
    masked = lp_cand.scatter(1, idx, float("-inf"))  # the candidate's log-probs on the reference's tail
    log_tc = torch.logsumexp(masked, dim=-1)
    log_m = top_lr[:, -1:]
    # Σ_tail w·p_c, w = _split_weight (below): the part of the e^(−r) term summed exactly
    above = (masked > log_m).nonzero()  # w = 0 elsewhere: few tokens per row
    # (index_add_ on CUDA is deterministic under torch.use_deterministic_algorithms, which qval's determinism sets)
    lp_above = masked[above[:, 0], above[:, 1]]
    exact_part = torch.zeros_like(log_tc).index_add_(0, above[:, 0], _split_weight(lp_above, log_m[above[:, 0], 0]) * lp_above.exp())
    masked.scatter_(1, idx, float("inf"))  # the top k never counts among the least likely
    log_tr = ref.log_tail.to(dev)
    t_r = log_tr.exp()
    lumped = torch.where(t_r > 0, t_r * (log_tr - log_tc), torch.zeros_like(t_r))
    # the tail's own term, Σ_tail p_r·log(p_r/p_c) = (T_r − T_c) + Σ_tail p_r·g(r), r = log(p_r/p_c),
    # g(r) = r − 1 + e^(−r) ≥ 0 (second order in r): T_r − T_c is known exactly, and the sum of the
    # non-negative g from the systematic sample (each point stands for T_r / P of the mass). Sampling
    # log(p_r/p_c) itself is unbiased too, but its first-order noise swamps a small KLD (near-uniform
    # distributions: 30× too large on a random-weight model once clamped); g's noise is relative.
    # Of p_r·e^(−r) = p_c the share w(p_c) is summed exactly over the tail (`exact_part`) and only the
    # rest sampled: 0 up to m (g as it is), 1 from SPLIT·m (a token of tiny p_r and large p_c no longer
    # rides on the one point that may land on it).
    pts_r = ref.tail_logp.to(dev)
    pts_c = lp_cand.gather(1, ref.tail_idx.to(dev).long())
    r = pts_r - pts_c
    term = r - 1 + (1 - _split_weight(pts_c, log_m)) * torch.exp(-r)
    term = torch.where(torch.isfinite(pts_r), term, torch.zeros_like(term))  # a point of zero mass (rounding) stands for none
    sampled = (t_r - log_tc.exp()) + exact_part + t_r * term.mean(dim=-1)
    # the upper bound: mass m on the candidate's least likely tail tokens, in order
    c = min(BOUND_TOKENS, max(1, ref.vocab - idx.shape[1]))
    s = masked.topk(c, dim=-1, largest=False).values  # ascending log p_c over the tail
    del masked
    m = log_m.exp()
    j = torch.arange(c, device=dev, dtype=m.dtype).unsqueeze(0)
    mass = torch.clamp(torch.minimum(m.expand(-1, c), t_r.unsqueeze(1) - j * m), min=0.0)
    beyond = torch.clamp(t_r - c * m.squeeze(1), min=0.0)
    tail_hi = (_xlogx(mass) - mass * s).sum(dim=-1) + beyond * (log_m.squeeze(1) - s[:, -1])
    upper = head + torch.maximum(tail_hi, lumped)
    # the sample's figure, held inside the two bounds (the lumped tail from below)
    estimate = torch.minimum(torch.maximum(head + sampled, head + lumped), upper)
    return estimate, upper


@torch.no_grad()
def stats(ref: Compact, logits_cand: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """`metrics.tokens.token_stats` with the reference given compactly: the same keys and, for
    every key but "kld", the same numbers as from the full reference logits; plus "kld_upper"
    (the bound above). (`token_stats` adds "kld_exact" when the full reference logits are at hand.)"""
    _check_logits(logits_cand, "logits_cand")
    if tuple(ref.shape) != tuple(logits_cand.shape) or ref.best.dim() != 1:
        raise ValueError(f"logits shapes differ: ref {tuple(ref.shape)} vs cand {tuple(logits_cand.shape)}")
    n, vocab = logits_cand.shape
    dev = logits_cand.device
    targets = targets.to(dev)
    _check_targets(targets, n, vocab)
    nxt = ref.next_token.to(dev)
    if n and not bool((nxt == targets).all()):
        raise ValueError("a compact reference holds the log-probability of the input's next token only; "
                         "these targets differ from it")
    lp_cand, finite_cand = _log_probs(logits_cand)
    finite_ref = ref.finite.to(dev)
    both = finite_ref & finite_cand
    tgt_ref = ref.next_logp.to(dev)
    tgt_cand = lp_cand.gather(1, targets.long().unsqueeze(1)).squeeze(1)
    top1 = (ref.best.to(dev) == lp_cand.argmax(dim=-1)) & both
    kld, upper = kld_terms(ref, lp_cand)
    exact = None
    if ref.source is not None:  # the reference's full logits were computed in this run: the audit's exact KLD
        lp_ref, _ = _log_probs(ref.source.reshape(n, vocab).to(dev))
        exact = kld_rows(lp_ref, lp_cand)  # `metrics.tokens.token_stats`' KLD, bit for bit (consumes lp_cand)
        del lp_ref
    del lp_cand
    out = {**position_stats(kld, top1, tgt_ref, tgt_cand, finite_ref, finite_cand),
           "kld_upper": _to_cpu64(_nan_where_not(upper, both))}
    if exact is not None:
        out["kld_exact"] = _to_cpu64(_nan_where_not(exact, both))
    return out


def nll(ref: Compact, targets: Tensor) -> Tensor:
    """−log p(target) per row (float64, CPU; NaN for a non-finite row), from a compact reference
    whose targets are the input's next tokens."""
    t = targets.reshape(-1).cpu().long()
    if t.numel() and not bool((ref.next_token.cpu() == t).all()):
        raise ValueError("a compact reference scores only the input's next tokens; these targets differ from it")
    out = (-ref.next_logp.cpu()).to(torch.float64)
    return torch.where(ref.finite.cpu(), out, torch.full_like(out, float("nan")))
