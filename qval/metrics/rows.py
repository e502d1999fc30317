"""Row-wise helpers of the per-position statistics (`tokens.py`, `compact.py`): input
checks, float32 log-softmax with each row's finiteness, NaN where a row was not finite."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _check_logits(logits: Tensor, name: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"{name} must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got {logits.dtype}")


def _check_targets(targets: Tensor, n: int, vocab: int) -> None:
    if targets.dim() != 1 or targets.shape[0] != n:
        raise ValueError(f"targets must be [N]={n}, got shape {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got {targets.dtype}")
    if n and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        # Checked here because an out-of-range gather on CUDA is an opaque device assert.
        raise ValueError(f"targets must lie in [0, {vocab}), got [{int(targets.min())}, {int(targets.max())}]")


def _log_probs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """float32 log-softmax of each row and whether the row was all finite.

    >>> lp, ok = _log_probs(torch.tensor([[0.0, 0.0], [float("nan"), 1.0]]))
    >>> lp[0].exp().tolist(), ok.tolist()
    ([0.5, 0.5], [True, False])
    """
    finite = torch.isfinite(logits).all(dim=-1)
    return F.log_softmax(logits.float(), dim=-1), finite


def _to_cpu64(x: Tensor) -> Tensor:
    return x.to(device="cpu", dtype=torch.float64)


def _nan_where_not(x: Tensor, finite: Tensor) -> Tensor:
    return torch.where(finite, x, torch.full_like(x, float("nan")))


def kld_rows(lp_ref: Tensor, lp_cand: Tensor) -> Tensor:
    """KL(ref‖cand) per row, Σ p_ref·(lp_ref − lp_cand), from two [N, V] float32 log-softmax outputs.
    Reuses lp_cand's buffer (it is consumed) so the peak stays at ~3 chunk-sized float32 tensors.
    Not clamped: tiny negatives are rounding, shown as is."""
    diff = lp_cand.neg_().add_(lp_ref)
    return diff.mul_(lp_ref.exp()).sum(dim=-1)


def position_stats(kld: Tensor, top1: Tensor, tgt_ref: Tensor, tgt_cand: Tensor, finite_ref: Tensor,
                   finite_cand: Tensor) -> dict[str, Tensor]:
    """`token_stats`' per-position result on the CPU: KLD NaN unless both rows were finite, each
    model's target probability and NLL NaN unless its own row was."""
    both = finite_ref & finite_cand
    return {
        "kld": _to_cpu64(_nan_where_not(kld, both)),
        "top1": top1.cpu(),
        "p_ref": _to_cpu64(_nan_where_not(tgt_ref.exp(), finite_ref)),
        "p_cand": _to_cpu64(_nan_where_not(tgt_cand.exp(), finite_cand)),
        "nll_ref": _to_cpu64(_nan_where_not(-tgt_ref, finite_ref)),
        "nll_cand": _to_cpu64(_nan_where_not(-tgt_cand, finite_cand)),
        "finite_ref": finite_ref.cpu(),
        "finite_cand": finite_cand.cpu(),
    }
