"""qval.metrics.tokens: a KLD worked on paper, a float64 numpy loop, NaN rows, chunking."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qval.metrics.tokens import first_nonfinite, nll_of_targets, token_stats


def _np_log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


def _np_reference(ref: np.ndarray, cand: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """Independent float64 implementation, one position at a time."""
    out: dict[str, list[float]] = {k: [] for k in ("kld", "nll_ref", "nll_cand", "top1")}
    for r, c, t in zip(ref, cand, targets):
        lr, lc = _np_log_softmax(r), _np_log_softmax(c)
        out["kld"].append(sum(math.exp(lr[v]) * (lr[v] - lc[v]) for v in range(len(lr))))
        out["nll_ref"].append(-lr[t])
        out["nll_cand"].append(-lc[t])
        out["top1"].append(float(np.argmax(r) == np.argmax(c)))
    return {k: np.array(v) for k, v in out.items()}


def test_kld_worked_on_paper() -> None:
    # p_ref = (1/2, 1/4, 1/4), p_cand = (1/4, 1/2, 1/4):
    # KL = 1/2·ln(2) + 1/4·ln(1/2) + 1/4·ln(1) = (1/2 − 1/4)·ln 2 = 0.25·0.693147 = 0.173287.
    # Target 2: p = 1/4 in both, NLL = ln 4 = 1.386294. argmax 0 vs 1: no top-1 agreement.
    ref = torch.tensor([[0.5, 0.25, 0.25]]).log()
    cand = torch.tensor([[0.25, 0.5, 0.25]]).log()
    s = token_stats(ref, cand, torch.tensor([2]))
    assert s["kld"].item() == pytest.approx(0.25 * math.log(2), abs=1e-6)
    assert s["kld"].item() == pytest.approx(0.173287, abs=1e-6)
    assert s["p_ref"].item() == pytest.approx(0.25, abs=1e-7)
    assert s["p_cand"].item() == pytest.approx(0.25, abs=1e-7)
    assert s["nll_cand"].item() == pytest.approx(math.log(4), abs=1e-6)
    assert s["top1"].tolist() == [False]
    # That pair gives 0.25·ln 2 in both directions, so also check a lopsided one, p=(0.9,0.1), q=(0.5,0.5):
    # KL = 0.9·ln(1.8) + 0.1·ln(0.2) = 0.529007 − 0.160944 = 0.368064.
    s2 = token_stats(torch.tensor([[0.9, 0.1]]).log(), torch.tensor([[0.5, 0.5]]).log(), torch.tensor([0]))
    assert s2["kld"].item() == pytest.approx(0.368064, abs=1e-6)


def test_agrees_with_float64_numpy_loop() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 50, generator=g) * 3
    cand = ref + 0.5 * torch.randn(64, 50, generator=g)
    targets = torch.randint(0, 50, (64,), generator=g)
    s = token_stats(ref, cand, targets)
    want = _np_reference(ref.numpy(), cand.numpy(), targets.numpy())
    np.testing.assert_allclose(s["kld"].numpy(), want["kld"], rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(s["nll_ref"].numpy(), want["nll_ref"], rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(s["nll_cand"].numpy(), want["nll_cand"], rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(s["p_ref"].numpy(), np.exp(-want["nll_ref"]), rtol=1e-5)
    np.testing.assert_array_equal(s["top1"].numpy(), want["top1"].astype(bool))
    assert 0 < s["top1"].sum() < 64  # the example really exercises both outcomes


def test_small_kld_survives_float32() -> None:
    # FP16-vs-BF16-sized differences (mean KLD ~1e-5) over a realistic vocabulary and logit
    # scale. float32 log-softmax leaves ~1e-6 of unbiased rounding per position (the log-sum-exp
    # of values ~10-20 is rounded to float32): visible on one row, negligible in the mean.
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(64, 32000, generator=g) * 4 + 10
    cand = ref + 0.005 * torch.randn(64, 32000, generator=g)
    got = token_stats(ref, cand, torch.zeros(64, dtype=torch.long))["kld"].numpy()
    lr = torch.log_softmax(ref.double(), -1)
    lc = torch.log_softmax(cand.double(), -1)
    want = (lr.exp() * (lr - lc)).sum(-1).numpy()
    assert 5e-6 < want.mean() < 5e-5
    assert np.abs(got - want).max() < 2e-6
    assert got.mean() == pytest.approx(want.mean(), rel=0.01)


def test_output_types_and_half_precision_inputs() -> None:
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(5, 11, generator=g)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        s = token_stats(ref.to(dtype), ref.to(dtype), torch.arange(5))
        for key in ("kld", "p_ref", "p_cand", "nll_ref", "nll_cand"):
            assert s[key].dtype == torch.float64 and s[key].shape == (5,) and s[key].device.type == "cpu"
        for key in ("top1", "finite_ref", "finite_cand"):
            assert s[key].dtype == torch.bool and s[key].shape == (5,)
        assert s["kld"].abs().max().item() < 1e-6  # identical inputs
        assert bool(s["top1"].all())


def test_inputs_are_not_modified() -> None:
    ref = torch.randn(4, 9)
    cand = torch.randn(4, 9)
    ref0, cand0 = ref.clone(), cand.clone()
    token_stats(ref, cand, torch.arange(4))
    assert torch.equal(ref, ref0) and torch.equal(cand, cand0)


def test_nonfinite_rows_give_nan_and_are_named() -> None:
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(8, 6, generator=g)
    cand = ref + 0.1 * torch.randn(8, 6, generator=g)
    clean = token_stats(ref, cand, torch.arange(8) % 6)
    cand[3, 2] = float("nan")
    ref[5, 0] = float("inf")
    s = token_stats(ref, cand, torch.arange(8) % 6)
    assert torch.isnan(s["kld"][[3, 5]]).all()
    assert torch.isnan(s["nll_cand"][3]) and not torch.isnan(s["nll_cand"][5])
    assert torch.isnan(s["nll_ref"][5]) and not torch.isnan(s["nll_ref"][3])
    assert not bool(s["top1"][3]) and not bool(s["top1"][5])
    assert s["finite_cand"].tolist() == [True, True, True, False, True, True, True, True]
    assert s["finite_ref"].tolist() == [True] * 5 + [False] + [True] * 2
    keep = [0, 1, 2, 4, 6, 7]  # the other rows are untouched by the bad ones
    torch.testing.assert_close(s["kld"][keep], clean["kld"][keep])
    assert first_nonfinite(s["finite_cand"]) == 3
    assert first_nonfinite(s["finite_ref"]) == 5
    assert first_nonfinite(s["finite_ref"] & s["finite_cand"]) == 3
    assert first_nonfinite(clean["finite_ref"]) is None


def test_chunks_concatenate_to_the_whole() -> None:
    g = torch.Generator().manual_seed(4)
    ref, cand = torch.randn(30, 17, generator=g), torch.randn(30, 17, generator=g)
    t = torch.randint(0, 17, (30,), generator=g)
    whole = token_stats(ref, cand, t)
    parts = [token_stats(ref[a:b], cand[a:b], t[a:b]) for a, b in [(0, 7), (7, 30)]]
    for key in whole:
        torch.testing.assert_close(torch.cat([p[key] for p in parts]), whole[key])


def test_nll_of_targets_matches_cross_entropy() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(40, 100, generator=g) * 2
    t = torch.randint(0, 100, (40,), generator=g)
    got = nll_of_targets(logits, t)
    assert got.dtype == torch.float64 and got.device.type == "cpu"
    want = F.cross_entropy(logits.double(), t, reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(got, token_stats(logits, logits, t)["nll_ref"])
    logits[7, 1] = float("-inf")
    bad = nll_of_targets(logits, t)
    assert torch.isnan(bad[7]) and torch.isfinite(bad[torch.arange(40) != 7]).all()


def test_bad_shapes_and_targets_raise() -> None:
    a = torch.zeros(3, 5)
    with pytest.raises(ValueError, match="shapes differ"):
        token_stats(a, torch.zeros(3, 6), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must lie"):
        token_stats(a, a, torch.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match="targets must be"):
        token_stats(a, a, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        nll_of_targets(torch.zeros(5), torch.zeros(5, dtype=torch.long))


@pytest.mark.gpu
def test_runs_on_cuda_and_returns_cpu() -> None:
    g = torch.Generator().manual_seed(6)
    ref, cand = torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)
    t = torch.randint(0, 64, (16,), generator=g)
    cpu = token_stats(ref, cand, t)
    gpu = token_stats(ref.cuda(), cand.cuda(), t.cuda())
    for key in cpu:
        assert gpu[key].device.type == "cpu"
        torch.testing.assert_close(gpu[key], cpu[key], rtol=1e-5, atol=1e-6)
