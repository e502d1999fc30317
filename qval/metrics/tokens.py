"""Per-position statistics of two models' next-token distributions (gate 1 and gate 3).

The caller feeds one chunk of logits at a time ([N, V], on the GPU when scoring there); this
module works in float32 on that device, holds only a few chunk-sized temporaries, and returns
N-length float64 vectors on the CPU. Aggregation lives in `agreement.py` / `perplexity.py`.

A row with any NaN/Inf logit gets NaN KLD/NLL/probability instead of a number: the gate must
see the failure (`first_nonfinite` names the position), never an average that skipped it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..logits import Logits
from .rows import _check_logits, _check_targets, _log_probs, _nan_where_not, _to_cpu64, kld_rows, position_stats  # noqa: F401  (re-exported)


@torch.no_grad()
def token_stats(logits_ref: Logits, logits_cand: Logits, targets: Tensor) -> dict[str, Tensor]:
    """Per-position KLD(ref‖cand), top-1 agreement, target probabilities and NLLs.

    Returns CPU tensors of length N: "kld", "p_ref", "p_cand", "nll_ref", "nll_cand" (float64),
    "top1", "finite_ref", "finite_cand" (bool). Non-finite rows: NaN floats, top1 False.
    >>> s = token_stats(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([1]))
    >>> s["kld"].tolist(), s["top1"].tolist(), s["p_cand"].tolist()
    ([0.0], [True], [0.5])

    The reference may be given compactly (`qval.logits.Compact`, from the snapshot):
    the same figures, KLD from its top k plus the sampled tail, "kld_upper" beside it, and
    "kld_exact" (this function's KLD) when its full logits were computed in this run (the audit).
    The candidate may be given by its top K (a served engine, `qval.metrics.topk`): KLD is then an
    estimate with "kld_lower" (a strict lower bound) and "unseen_mass" beside it. So may the reference
    (a served reference: `qval.metrics.topk.topk_reference_stats`), against either form of candidate.
    """
    if not isinstance(logits_cand, torch.Tensor):  # a candidate given by its top K (a served engine)
        from .topk import topk_stats

        return topk_stats(logits_ref, logits_cand, targets)
    if not isinstance(logits_ref, torch.Tensor):
        from .topk import is_topk_reference, topk_reference_stats

        if is_topk_reference(logits_ref):  # a reference given by its top K (a served reference)
            return topk_reference_stats(logits_ref, logits_cand, targets)
        from .compact import stats

        return stats(logits_ref, logits_cand, targets)
    _check_logits(logits_ref, "logits_ref")
    _check_logits(logits_cand, "logits_cand")
    if logits_ref.shape != logits_cand.shape:
        raise ValueError(f"logits shapes differ: ref {tuple(logits_ref.shape)} vs cand {tuple(logits_cand.shape)}")
    if logits_ref.device != logits_cand.device:
        raise ValueError(f"logits on different devices: ref {logits_ref.device} vs cand {logits_cand.device}")
    n, vocab = logits_ref.shape
    targets = targets.to(logits_ref.device)
    _check_targets(targets, n, vocab)
    idx = targets.long().unsqueeze(1)

    lp_ref, finite_ref = _log_probs(logits_ref)
    lp_cand, finite_cand = _log_probs(logits_cand)
    both = finite_ref & finite_cand
    tgt_ref = lp_ref.gather(1, idx).squeeze(1)
    tgt_cand = lp_cand.gather(1, idx).squeeze(1)
    top1 = (lp_ref.argmax(dim=-1) == lp_cand.argmax(dim=-1)) & both

    # KL = Σ p_ref·(lp_ref − lp_cand). Reuse lp_cand's buffer (a fresh log_softmax output) so the
    # peak stays at ~3 chunk-sized float32 tensors. Not clamped: tiny negatives are rounding, shown as is.
    kld = kld_rows(lp_ref, lp_cand)  # consumes lp_cand
    del lp_ref, lp_cand

    return position_stats(kld, top1, tgt_ref, tgt_cand, finite_ref, finite_cand)


@torch.no_grad()
def nll_of_targets(logits: Tensor, targets: Tensor) -> Tensor:
    """−log p(target) per row, float64 on CPU; NaN for rows with a non-finite logit.

    Single-model scoring: judge PPL of a generation, or perplexity without a second model.
    >>> nll_of_targets(torch.tensor([[0.0, 0.0], [float("inf"), 0.0]]), torch.tensor([0, 1])).tolist()
    [0.6931471824645996, nan]
    """
    if not isinstance(logits, torch.Tensor):  # a compact reference (the snapshot): its stored target NLLs
        from .compact import nll

        return nll(logits, targets)
    _check_logits(logits, "logits")
    n, vocab = logits.shape
    targets = targets.to(logits.device)
    _check_targets(targets, n, vocab)
    lp, finite = _log_probs(logits)
    nll = -lp.gather(1, targets.long().unsqueeze(1)).squeeze(1)
    return _to_cpu64(_nan_where_not(nll, finite))


def first_nonfinite(finite: Tensor) -> int | None:
    """Index of the first False in a per-row finiteness mask, or None when all rows are finite.

    >>> first_nonfinite(torch.tensor([True, True, False, False])), first_nonfinite(torch.tensor([True]))
    (2, None)
    """
    bad = torch.nonzero(~finite.reshape(-1).bool())
    return int(bad[0, 0]) if bad.numel() else None
