"""Pure per-quantizer figures: tensors in, numbers out (DESIGN.md, "Per-layer scale diagnostics").

`x` is what the quantizer sees (its input, after any SmoothQuant/AWQ `pre_quant_scale`), `q` is
what it returns (quantize-dequantize), `amax` is its calibrated range, broadcast to `x` by
`amax_per_element` (one value, one per channel, or one per block of the last axis).

- SQNR dB          = 10·log10(‖x‖² / ‖x − q‖²)          (inf when q == x exactly)
- clipped          = fraction of elements with |x| > amax
- flushed          = fraction of the NON-ZERO elements that q sends to exactly 0
- range use        = mean over scale groups of max|x| / amax   (1: the grid is filled;
                     0.125: seven eighths of it are never used)
- outlier ratio    = max(amax) / p99.9(|x|) over the whole tensor: how far the range is
                     stretched beyond the bulk of the values

`AbsStats` accumulates the same figures over many activation batches without keeping them:
counts and sums are exact, p99.9 comes from a log2 histogram (64 bins per octave, so the
quantile is within 1.1 % of the exact one).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# log2 histogram of |x|: 2^-48 … 2^48 covers every finite float16/bfloat16/float32 activation
# that matters; smaller non-zeros land in the first bin, larger in the last.
_LOG2_LO, _LOG2_HI, _PER_OCTAVE = -48.0, 48.0, 64
_BINS = int((_LOG2_HI - _LOG2_LO) * _PER_OCTAVE)


def _blocks(x: Tensor, amax: Tensor, block: int | None = None) -> tuple[int, int, int] | None:
    """(rows, blocks per row, block) when amax holds one value per block of x's last axis. The
    last block of a row may be partial (ModelOpt pads: 576 columns in blocks of 128 are 5
    blocks), so the count alone is ambiguous: give `block` (the quantizer's block size), else
    only an exact split of the row is assumed."""
    if x.dim() == 0 or x.numel() == 0:
        return None
    last = x.shape[-1]
    rows = x.numel() // last
    if amax.numel() % rows:
        return None
    per_row = amax.numel() // rows
    if block is None:
        block = last // per_row if last % per_row == 0 else None
    return (rows, per_row, block) if block and -(-last // block) == per_row else None


def amax_per_element(x: Tensor, amax: Tensor, block: int | None = None) -> Tensor | None:
    """`amax` expanded to x's shape, or None when its layout is not one qval understands.

    Per-tensor (1 value), per-channel (broadcastable, e.g. [out, 1] for a weight) and static
    blocks of `block` along the last axis ([rows · blocks per row, 1], a row's last block maybe partial).
    >>> amax_per_element(torch.ones(2, 4), torch.tensor([[1.0], [2.0]])).tolist()
    [[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]]
    >>> amax_per_element(torch.ones(2, 4), torch.tensor([[1.0], [2.0], [3.0], [4.0]])).tolist()
    [[1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0]]
    >>> amax_per_element(torch.ones(1, 5), torch.tensor([[1.0], [2.0]]), block=3).tolist()  # 3 + 2 columns
    [[1.0, 1.0, 1.0, 2.0, 2.0]]
    """
    amax = amax.to(device=x.device, dtype=torch.float32)
    if amax.numel() == 1:
        return amax.reshape(()).expand(x.shape)
    if not _block_layout(x, amax):
        return torch.broadcast_to(amax, x.shape)
    shape = _blocks(x, amax, block)
    if shape is None:
        return None
    rows, per_row, size = shape
    return amax.reshape(rows, per_row).repeat_interleave(size, dim=1)[:, : x.shape[-1]].reshape(x.shape)


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(signal/noise); inf when there is no noise, nan when there is no signal.

    >>> round(sqnr_db(100.0, 1.0), 6)
    20.0
    """
    if signal_power == 0:
        return math.nan
    if noise_power == 0:
        return math.inf
    return 10.0 * math.log10(signal_power / noise_power)


def tensor_sqnr_db(x: Tensor, q: Tensor) -> float:
    """SQNR of one quantize-dequantize, in dB.

    >>> round(tensor_sqnr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0])), 4)  # 25 / 1
    13.9794
    """
    x64, q64 = x.double(), q.double()
    return sqnr_db(float((x64 * x64).sum()), float(((x64 - q64) ** 2).sum()))


def clip_fraction(x: Tensor, amax: Tensor, block: int | None = None) -> float:
    """Fraction of elements outside ±amax (they saturate at the edge of the grid).

    >>> clip_fraction(torch.tensor([0.5, -2.0, 1.0, 3.0]), torch.tensor(1.0))
    0.5
    """
    a = amax_per_element(x, amax, block)
    if a is None or x.numel() == 0:
        return math.nan
    return float((x.abs().float() > a).sum()) / x.numel()


def flush_fraction(x: Tensor, q: Tensor) -> float:
    """Fraction of non-zero inputs that the quantizer turned into exactly zero.

    >>> flush_fraction(torch.tensor([0.0, 0.01, 0.02, 1.0]), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    0.6666666666666666
    """
    nonzero = x != 0
    n = int(nonzero.sum())
    return math.nan if n == 0 else float((nonzero & (q == 0)).sum()) / n


def range_utilization(x: Tensor, amax: Tensor, block: int | None = None) -> float:
    """Mean over scale groups (tensor, channel or block) of max|x| in the group / its amax;
    groups with amax 0 (all-zero blocks) are left out.

    >>> range_utilization(torch.tensor([[0.5, -1.0], [0.25, 0.1]]), torch.tensor([[1.0], [1.0]]))
    0.625
    """
    if amax_per_element(x, amax, block) is None:
        return math.nan
    return _mean_ratio(_group_max(x.detach().abs().float(), amax, block), amax)


def _block_layout(x: Tensor, amax: Tensor) -> bool:
    """True when amax is one value per block of the last axis (not a broadcastable layout)."""
    try:
        return torch.broadcast_shapes(amax.shape, x.shape) != x.shape
    except RuntimeError:
        return True


def quantile_abs(x: Tensor, q: float) -> float:
    """Exact q-quantile of |x| (linear interpolation, numpy's default).

    >>> quantile_abs(torch.tensor([-4.0, 1.0, 2.0, 3.0]), 0.5)
    2.5
    """
    flat = x.detach().abs().double().reshape(-1).sort().values
    if flat.numel() == 0:
        return math.nan
    pos = q * (flat.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, flat.numel() - 1)
    return float(flat[lo] + (flat[hi] - flat[lo]) * (pos - lo))


def outlier_ratio(amax: Tensor, p999_abs: float) -> float:
    """max(amax) / p99.9|x|: 1 means the range fits the bulk; 100 means 99.9 % of the values
    live in the bottom 1 % of the grid.

    >>> outlier_ratio(torch.tensor([2.0, 8.0]), 0.5)
    16.0
    """
    if not p999_abs > 0:
        return math.inf if float(amax.max()) > 0 else math.nan
    return float(amax.max()) / p999_abs


class AbsStats:
    """Streaming totals for one quantizer over many batches: exact counts and powers, a log2
    histogram of |x| for the p99.9, and the running max|x| per scale group."""

    def __init__(self) -> None:
        self.n = 0
        self.zeros = 0
        self.nonzero = 0
        self.clipped = 0
        self.flushed = 0
        self.signal = 0.0
        self.noise = 0.0
        self.hist = torch.zeros(_BINS, dtype=torch.float64)
        self.group_max: Tensor | None = None  # max|x| per amax group, across batches
        self.amax: Tensor | None = None
        self.max_abs = 0.0
        self.sample_n = self.sample_zeros = self.sample_nonzero = 0  # what the histogram has seen

    @torch.no_grad()
    def add(self, x: Tensor, q: Tensor, amax: Tensor | None, sample: int | None = None, block: int | None = None) -> None:
        """One batch: x as the quantizer saw it, q its output, amax its range (None: dynamic).

        Counts and powers use every element. The |x| histogram (for p99.9) uses every element,
        or with `sample` a strided sample of about that many, the stride coprime with the last
        axis so every channel is visited: activation batches are large and the histogram is the
        costly part. Relies on q(0) == 0, true of ModelOpt's symmetric quantizers."""
        x = x.detach().float()
        q = q.detach().float()
        numel = x.numel()
        if numel == 0:
            return
        ax = x.abs()
        zeros = numel - int(torch.count_nonzero(x))
        self.n += numel
        self.zeros += zeros
        self.nonzero += numel - zeros
        self.flushed += (numel - int(torch.count_nonzero(q))) - zeros
        self.signal += float(torch.linalg.vector_norm(x)) ** 2
        self.noise += float(torch.linalg.vector_norm(x - q)) ** 2
        self.max_abs = max(self.max_abs, float(ax.max()))
        picked = ax.reshape(-1)[:: _stride(numel, x.shape[-1] if x.dim() else 1, sample)]
        self.sample_n += picked.numel()
        picked = picked[picked > 0]
        self.sample_zeros += self.sample_n - self.sample_nonzero - picked.numel()
        self.sample_nonzero += picked.numel()
        self.hist += torch.histc(picked.log2().clamp_(_LOG2_LO, _LOG2_HI - 1e-6), bins=_BINS, min=_LOG2_LO, max=_LOG2_HI).double().cpu()
        if amax is None:
            return
        a = amax_per_element(x, amax, block)
        if a is None:
            return
        self.amax = amax.detach().float().cpu()
        self.clipped += int(torch.count_nonzero(ax > a))
        gmax = _group_max(ax, amax, block)
        self.group_max = gmax if self.group_max is None else torch.maximum(self.group_max, gmax)

    def quantile(self, q: float) -> float:
        """q-quantile of |x| from the histogram (zeros counted), interpolated geometrically."""
        if self.sample_n == 0:
            return math.nan
        rank = q * self.sample_n
        if rank <= self.sample_zeros:
            return 0.0
        cum = torch.cumsum(self.hist, 0)
        need = rank - self.sample_zeros
        i = int(torch.searchsorted(cum, torch.tensor(need, dtype=torch.float64)).clamp(max=_BINS - 1))
        before = float(cum[i - 1]) if i > 0 else 0.0
        frac = (need - before) / max(float(self.hist[i]), 1.0)
        return 2.0 ** (_LOG2_LO + (i + min(max(frac, 0.0), 1.0)) / _PER_OCTAVE)

    def summary(self) -> dict[str, float]:
        p999 = self.quantile(0.999)
        out = {
            "sqnr_db": sqnr_db(self.signal, self.noise),
            "flushed": self.flushed / self.nonzero if self.nonzero else math.nan,
            "p99_9_abs": p999,
            "max_abs": self.max_abs,
            "clipped": math.nan, "range_use": math.nan, "outlier_ratio": math.nan,
        }
        if self.amax is not None and self.group_max is not None:
            out["clipped"] = self.clipped / self.n
            out["range_use"] = _mean_ratio(self.group_max, self.amax)
            out["outlier_ratio"] = outlier_ratio(self.amax, p999)
        return out


def _stride(numel: int, last: int, sample: int | None) -> int:
    """A step that picks about `sample` of `numel` elements and is coprime with the last axis.

    >>> _stride(1000, 10, 100), _stride(1000, 10, None)
    (11, 1)
    """
    if sample is None or numel <= sample:
        return 1
    step = max(1, numel // sample)
    while math.gcd(step, last) != 1:
        step += 1
    return step


def _group_max(ax: Tensor, amax: Tensor, block: int | None = None) -> Tensor:
    """max|x| per amax group, shaped like amax.reshape(-1) (CPU float32)."""
    groups = amax.numel()
    if groups == 1:
        return ax.max().reshape(1).cpu()
    if _block_layout(ax, amax):
        rows, per_row, size = _blocks(ax, amax, block)  # type: ignore[misc]  (callers checked the layout)
        flat = ax.reshape(rows, ax.shape[-1])
        pad = per_row * size - ax.shape[-1]
        if pad:  # |x| >= 0, so zero padding leaves every block's max alone
            flat = torch.nn.functional.pad(flat, (0, pad))
        return flat.reshape(rows, per_row, size).amax(dim=2).reshape(-1).cpu()
    lead = ax.dim() - amax.dim()
    reduce = [d for d in range(ax.dim()) if d < lead or amax.shape[d - lead] == 1]
    return ax.amax(dim=reduce).reshape(-1).cpu()


def _mean_ratio(group_max: Tensor, amax: Tensor) -> float:
    """Mean of max|x| / amax over the groups whose amax is not 0 (an all-zero block has no range)."""
    a = amax.reshape(-1).float().cpu()
    live = a > 0
    return float((group_max[live] / a[live]).mean()) if live.any() else math.nan
