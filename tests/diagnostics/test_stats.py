"""Per-quantizer figures against hand-worked tensors, ModelOpt's own quantizer, and numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qval.diagnostics.stats import (
    AbsStats,
    amax_per_element,
    clip_fraction,
    flush_fraction,
    outlier_ratio,
    quantile_abs,
    range_utilization,
    sqnr_db,
    tensor_sqnr_db,
)


def int_quantizer(bits: int, amax, block: int | None = None):
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    cfg = QuantizerAttributeConfig(num_bits=bits, axis=None, block_sizes={-1: block} if block else None)
    q = TensorQuantizer(cfg)
    q.amax = torch.as_tensor(amax, dtype=torch.float32)
    return q


def test_sqnr_hand_worked():
    # ‖x‖² = 25, ‖x − q‖² = 1  →  10·log10(25) dB
    assert tensor_sqnr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0])) == pytest.approx(13.979400, abs=1e-6)
    assert sqnr_db(1.0, 0.0) == math.inf and math.isnan(sqnr_db(0.0, 1.0))


def test_sqnr_of_modelopt_int8_matches_hand_rounding():
    """INT8, amax 1: q = round(127·x)/127. x = [1, 0.5, −0.3] → codes [127, 64 (half to even), −38]:
    noise = (0.5² + 0.1²)/127², signal = 1.34, SQNR = 10·log10(1.34·127²/0.26) = 49.1971 dB."""
    x = torch.tensor([1.0, 0.5, -0.3])
    q = int_quantizer(8, 1.0)(x)
    assert (q * 127).tolist() == pytest.approx([127.0, 64.0, -38.0], abs=1e-4)
    assert tensor_sqnr_db(x, q) == pytest.approx(10 * math.log10(1.34 * 127**2 / 0.26), abs=1e-3)
    assert tensor_sqnr_db(x, q) == pytest.approx(49.1971, abs=1e-3)


def test_clip_fraction_per_tensor_channel_and_block():
    assert clip_fraction(torch.tensor([0.5, -2.0, 1.0, 3.0]), torch.tensor(1.0)) == 0.5  # |x| == amax is not clipped
    x = torch.tensor([[0.5, 2.0], [3.0, 0.1]])
    assert clip_fraction(x, torch.tensor([[1.0], [4.0]])) == 0.25  # only 2.0 > 1
    xb = torch.tensor([[0.5, 2.0, 0.0, 0.0, 11.0, 0.0, 0.0, 0.3]])
    assert clip_fraction(xb, torch.tensor([[1.0], [10.0]])) == 0.25  # 2 > 1 in block 0, 11 > 10 in block 1


def test_amax_layouts():
    x = torch.zeros(2, 8)
    assert amax_per_element(x, torch.tensor(3.0)).unique().tolist() == [3.0]
    per_block = amax_per_element(x, torch.arange(1.0, 5.0).reshape(4, 1))
    assert per_block.tolist() == [[1.0] * 4 + [2.0] * 4, [3.0] * 4 + [4.0] * 4]
    assert amax_per_element(x, torch.ones(3)) is None  # 3 groups cannot tile 2×8


def test_flush_fraction_with_modelopt_int8():
    """amax 4 → step 4/127 ≈ 0.0315: 0.01 rounds to code 0 (flushed), 0.02 to code 1, 1.0 to 32."""
    x = torch.tensor([0.0, 0.01, 0.02, 1.0])
    q = int_quantizer(8, 4.0)(x)
    assert q[1] == 0 and q[2] != 0
    assert flush_fraction(x, q) == pytest.approx(1 / 3)


def test_block_int4_quantizer_clips_and_flushes():
    x = torch.tensor([[0.5, 2.0, 0.0, 0.0, 11.0, 0.0, 0.0, 0.3]])
    q = int_quantizer(4, [[1.0], [10.0]], block=4)(x)
    # 2 → 1 and 11 → 10 saturate; 0.3 in a block of amax 10 is 0.21 of a step → 0
    assert q[0].tolist() == pytest.approx([4 / 7, 1.0, 0, 0, 10.0, 0, 0, 0], abs=1e-5)
    assert flush_fraction(x, q) == pytest.approx(1 / 4)
    assert range_utilization(x, torch.tensor([[1.0], [10.0]])) == pytest.approx((2.0 / 1 + 11.0 / 10) / 2)


def test_outlier_ratio_hand_worked():
    x = torch.arange(1.0, 1001.0)
    # numpy's linear interpolation: position 0.999·999 = 998.001 → 999 + 0.001 = 999.001
    assert quantile_abs(x, 0.999) == pytest.approx(999.001)
    assert quantile_abs(-x, 0.999) == pytest.approx(float(np.quantile(np.arange(1.0, 1001.0), 0.999)))
    assert outlier_ratio(torch.tensor(2000.0), 999.001) == pytest.approx(2000 / 999.001)
    assert outlier_ratio(torch.tensor([1.0, 8.0]), 2.0) == 4.0  # the largest amax counts
    assert outlier_ratio(torch.tensor(1.0), 0.0) == math.inf


def test_range_use_sees_a_scale_inflated_eight_times():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    amax = w.abs().amax(dim=1, keepdim=True)
    assert range_utilization(w, amax) == pytest.approx(1.0)
    assert range_utilization(w, amax * 8) == pytest.approx(0.125)


def test_streaming_stats_agree_with_whole_tensor_functions():
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(3, 50, 64, generator=g) * s for s in (1.0, 2.5)]
    batches[1][0, 0, :4] = 0.0  # exact zeros must not count as flushed
    amax = torch.tensor(4.0)
    quant = int_quantizer(8, 4.0)
    stats = AbsStats()
    for b in batches:
        stats.add(b, quant(b), amax)
    x = torch.cat([b.reshape(-1) for b in batches])
    q = quant(x)
    s = stats.summary()
    assert s["clipped"] == pytest.approx(clip_fraction(x, amax))
    assert s["clipped"] > 0.01  # the second batch exceeds amax: a real clip count, not a zero
    assert s["flushed"] == pytest.approx(flush_fraction(x, q))
    assert s["sqnr_db"] == pytest.approx(tensor_sqnr_db(x, q), abs=1e-3)
    assert s["max_abs"] == pytest.approx(float(x.abs().max()))
    assert s["range_use"] == pytest.approx(float(x.abs().max()) / 4.0)
    exact = float(np.quantile(np.abs(x.numpy()), 0.999))
    assert s["p99_9_abs"] == pytest.approx(exact, rel=0.012)  # 64 bins per octave: ≤ 1.1 %
    assert s["outlier_ratio"] == pytest.approx(4.0 / exact, rel=0.012)


def test_sampled_histogram_stays_close():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 256, 576, generator=g)
    full, sampled = AbsStats(), AbsStats()
    full.add(x, x, None)
    sampled.add(x, x, None, sample=1 << 16)
    exact = float(np.quantile(np.abs(x.numpy()), 0.999))
    assert full.quantile(0.999) == pytest.approx(exact, rel=0.012)
    assert sampled.quantile(0.999) == pytest.approx(exact, rel=0.05)
    assert sampled.sample_n < x.numel() // 10  # it did sample
    assert math.isnan(sampled.summary()["clipped"])  # no amax (dynamic): no clip figure, not a zero


def test_quantile_counts_zeros():
    s = AbsStats()
    x = torch.tensor([0.0] * 90 + [1.0] * 10)
    s.add(x, x, torch.tensor(1.0))
    assert s.quantile(0.5) == 0.0
    assert s.quantile(0.95) == pytest.approx(1.0, rel=0.012)
    assert s.summary()["flushed"] == 0.0


def test_partial_blocks_as_modelopt_pads_them():
    """576 columns in blocks of 128 are 5 blocks, the last one of 64; here 6 columns in blocks of
    4: ModelOpt's calibrated amax has 2 values per row, and every figure must line up with it."""
    from ..quantize.quantizers import calibrated

    x = torch.tensor([[1.0, -2.0, 0.5, 0.25, 3.0, 0.1], [0.0, 0.0, 0.0, 0.0, -4.0, 2.0]])
    q = calibrated(x, num_bits=4, block_sizes={-1: 4})
    assert q.amax.numel() == 4  # 2 rows × (4 + 2 columns)
    assert q.amax.reshape(-1).tolist() == [2.0, 3.0, 0.0, 4.0]  # an all-zero block has amax 0
    # 2 blocks in 6 columns: the count alone reads 3 + 3, which is why collect() passes the block size
    assert amax_per_element(x, q.amax)[0].tolist() == [2.0, 2.0, 2.0, 3.0, 3.0, 3.0]
    from qval.diagnostics.scales import block_size
    from qval.quantize.modelopt_adapter import quantizer_state

    assert block_size(quantizer_state(q), x) == 4
    a = amax_per_element(x, q.amax, block=4)
    assert a.tolist() == [[2.0, 2.0, 2.0, 2.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0, 4.0, 4.0]]
    assert range_utilization(x, q.amax, block=4) == pytest.approx(1.0)  # the zero block is left out, not a NaN
    assert range_utilization(x, q.amax * 8, block=4) == pytest.approx(0.125)
    # half of each block's amax: 1, 1.5, 0, 2 → -2, 3 and -4 exceed it (1.0 and 2.0 sit exactly on it)
    assert clip_fraction(x, q.amax / 2, block=4) == pytest.approx(3 / 12)
    s = AbsStats()
    s.add(x, q(x), q.amax, block=4)
    assert s.summary()["range_use"] == pytest.approx(1.0) and s.summary()["clipped"] == 0.0
