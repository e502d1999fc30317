"""qval.metrics.topk: a candidate known by its top K only (a served engine).

Known values worked by hand, and the built-in model against a damaged copy of itself: the exact
figures (top-1, NLL, p) equal `token_stats` on the full logits, and the lower bound holds at every
position against the full-vocabulary KLD, with a full reference, with the snapshot's compact one, and with the
reference served (its top K) against either form of candidate.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from qval.logits import Compact, from_topk
from qval.metrics.tokens import token_stats
from qval.metrics.compact import compress


def served(logits: torch.Tensor, targets: torch.Tensor, k: int) -> Compact:
    """What a server returns for these logits: top K log-probabilities and the actual token's."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top = lp.topk(k, dim=-1)
    return from_topk(lp.shape[-1], top.indices, top.values, targets, lp.gather(1, targets.unsqueeze(1)).squeeze(1),
                     torch.isfinite(logits).all(dim=-1))


def test_hand_worked_three_tokens():
    # vocabulary of 3; the candidate shows its top 1 (token 0) and the actual token (2)
    pr = torch.tensor([[0.5, 0.3, 0.2]])
    pc = torch.tensor([[0.6, 0.1, 0.3]])
    cand = from_topk(3, torch.tensor([[0]]), pc[:, :1].log(), torch.tensor([2]), pc[:, 2].log(), torch.tensor([True]))
    s = token_stats(pr.log(), cand, torch.tensor([2]))
    seen = 0.5 * math.log(0.5 / 0.6) + 0.2 * math.log(0.2 / 0.3)
    lower = seen + 0.3 * math.log(0.3 / 0.1)  # token 1 unseen: R = 0.3, C = 0.1, one token so the bound is exact
    assert s["kld_lower"].item() == pytest.approx(lower, abs=1e-6)
    exact = sum(p * math.log(p / q) for p, q in zip(pr[0].tolist(), pc[0].tolist()))
    assert s["kld_lower"].item() == pytest.approx(exact, abs=1e-6)
    assert s["unseen_mass"].item() == pytest.approx(0.3, abs=1e-6)
    # conditional KL on the seen {0, 2}: p_r|A = (5/7, 2/7), p_c|A = (2/3, 1/3); the estimate adds R × it
    cond = 5 / 7 * math.log((5 / 7) / (2 / 3)) + 2 / 7 * math.log((2 / 7) / (1 / 3))
    estimate = lower + 0.3 * cond
    assert s["kld_estimate"].item() == pytest.approx(estimate, abs=1e-6)
    # from the top K/2 = 0 alone: only the actual token seen (R = 0.8, C = 0.7; one seen token, no shape)
    half = 0.2 * math.log(0.2 / 0.3) + 0.8 * math.log(0.8 / 0.7)
    assert s["kld"].item() == pytest.approx(estimate + max(0.0, estimate - half), abs=1e-6)
    assert s["top1"].tolist() == [True]
    assert s["p_cand"].item() == pytest.approx(0.3, abs=1e-6) and s["p_ref"].item() == pytest.approx(0.2, abs=1e-6)


def test_identical_distributions_give_zero_and_nonfinite_rows_nan():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    t = torch.randint(0, 50, (6,), generator=g)
    cand = served(logits, t, 5)
    s = token_stats(logits, cand, t)
    assert s["kld"].abs().max().item() < 1e-6 and s["kld_lower"].abs().max().item() < 1e-6
    assert s["top1"].all()
    bad = logits.clone()
    bad[2, 3] = float("nan")
    s = token_stats(logits, served(bad, t, 5), t)
    assert math.isnan(s["kld"][2].item()) and not s["top1"][2] and not s["finite_cand"][2]


@pytest.fixture(scope="module")
def pair(default_model):
    """The built-in model and a copy with FP8-rounded weights, on four 256-token chunks of held-out text."""
    from qval.data import load_dataset, token_stream
    from tests.conftest import ROOT

    ref = default_model.model
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        for name, p in cand.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                s = p.abs().max() / 448
                p.copy_((p / s).to(torch.float8_e4m3fn).float() * s)
    ds = load_dataset("heldout_eval", ROOT / "calib_data/heldout_eval.jsonl")
    ids = token_stream(ds.texts(), default_model.tokenizer, default_model.tokenizer.eos_token_id)[: 4 * 256]
    x = torch.tensor(ids).view(4, 256)
    with torch.no_grad():
        lr = ref(x).logits[:, 128:-1].reshape(-1, ref.config.vocab_size)
        lc = cand(x).logits[:, 128:-1].reshape(-1, ref.config.vocab_size)
    return lr.float(), lc.float(), x[:, 129:].reshape(-1)


@pytest.mark.parametrize("k", [20, 64, 128])
def test_exact_figures_and_the_lower_bound_against_the_full_kld(pair, k):
    """Either side served (its top K and the actual token), or both: top-1, NLLs and p exact; the lower bound
    under the exact KLD at every position."""
    lr, lc, t = pair
    full = token_stats(lr, lc, t)
    got = {
        "served candidate, full reference": token_stats(lr, served(lc, t, k), t),
        "served candidate, snapshot reference": token_stats(compress(lr, t, 128), served(lc, t, k), t),
        "served reference, full candidate": token_stats(served(lr, t, k), lc, t),
        "both served": token_stats(served(lr, t, k), served(lc, t, k), t),
    }
    for case, s in got.items():
        assert torch.equal(s["top1"], full["top1"]), case
        assert torch.allclose(s["nll_cand"], full["nll_cand"], atol=1e-6), case
        assert torch.allclose(s["nll_ref"], full["nll_ref"], atol=1e-6), case
        # the bound holds at every position (to the float32 rounding of the log-probabilities)
        gap = (s["kld_lower"] - full["kld"]).max().item()
        assert gap <= 1e-5, f"k={k}, {case}: the lower bound exceeds the exact KLD by {gap}"
        assert (s["kld"] >= s["kld_lower"] - 1e-12).all(), case
        assert ((s["unseen_mass"] >= 0) & (s["unseen_mass"] <= 1)).all(), case
        assert (s["kld"] >= s["kld_estimate"]).all(), case  # the shorter lists' gains never lower the estimate
    # with one side full, the plain estimate's mean is near the exact mean; both served, it runs under it
    for case in ("served candidate, full reference", "served reference, full candidate"):
        assert abs(got[case]["kld_estimate"].mean().item() / full["kld"].mean().item() - 1) < 0.15, case
    # the gated figure (the estimate plus its last doubling's gain, both served its last two) is above the exact
    # mean and p99 in every case
    # (the measured margins are in RESULTS.md §13)
    for case, s in got.items():
        assert s["kld"].mean().item() >= full["kld"].mean().item(), f"k={k}, {case}: mean under the exact"
        assert s["kld"].quantile(0.99).item() >= full["kld"].quantile(0.99).item(), f"k={k}, {case}: p99 under the exact"


def test_hand_worked_reference_known_by_its_top_k():
    # the reference shows its top 1 (token 0) and the actual token (2); the candidate is known everywhere
    pr = torch.tensor([[0.5, 0.3, 0.2]])
    pc = torch.tensor([[0.6, 0.1, 0.3]])
    ref = from_topk(3, torch.tensor([[0]]), pr[:, :1].log(), torch.tensor([2]), pr[:, 2].log(), torch.tensor([True]))
    s = token_stats(ref, pc.log(), torch.tensor([2]))
    exact = sum(p * math.log(p / q) for p, q in zip(pr[0].tolist(), pc[0].tolist()))
    assert s["kld_lower"].item() == pytest.approx(exact, abs=1e-6)  # one unseen token: the bound is exact
    assert s["unseen_mass"].item() == pytest.approx(0.3, abs=1e-6)
    assert s["p_ref"].item() == pytest.approx(0.2, abs=1e-6) and s["p_cand"].item() == pytest.approx(0.3, abs=1e-6)
    assert s["top1"].tolist() == [True]
    # a wrong target is refused, not scored against another token's log-probability
    with pytest.raises(ValueError, match="next token only"):
        token_stats(ref, pc.log(), torch.tensor([1]))
