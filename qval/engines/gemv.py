"""A decode step's products on a GPU (1 to 16 rows): Triton kernels, the projections that read one input in one launch.

At batch 1 a decode step's products are matrix-vector products, bound by reading the weights.
cuBLAS's kernels for them read an 8B Llama's weights well below the card's copy bandwidth, and the
small K/V projections (1,024 × 4,096) are too little work for a launch of their own; the kernel here
on the projections that share an input reads them near the copy bandwidth (`benchmarks/gemv.py`: 32
layers of distinct weights replayed from a CUDA graph; its figures: benchmarks/CHANGELOG.md, §14.3).

Without concatenating anything (no second copy of the weights, no views that a checkpoint writer
would refuse): `grouped` reads up to three weights in one launch — each program a block of one
weight's output rows, the weights addressed as offsets from the first — and `gate_up_silu` reads
the gate and up rows of a block together and writes SiLU(gate)·up, the MLP's element-wise work in
the same kernel. Each program sums its rows over the whole input in float32 and rounds once to the
weight's dtype, as the products do; the order of the sum is the kernel's own (block of BK columns,
then across the block), not cuBLAS's, so a product can differ from cuBLAS's in its last bit. Block
shapes come from a fixed table (measured on the H200, `benchmarks/gemv.py`), never from timing at
run time: the same shapes give the same sums in every run.

From 2 to 16 rows (gate 3 decodes 8) the same launches run `grouped_rows` / `gate_up_rows`: each
program a block of BN output rows for all the input rows, one tensor-core product per block of BK
inputs (the rows padded to 16), float32 accumulation, block shapes from `_ROWS_TABLE` (a sweep at 8
rows on the H200). cuBLAS reads the weights as slowly at 8 rows as at one (benchmarks/CHANGELOG.md, §14.4).

Only what this module can address: CUDA tensors, 1 to 16 rows, bfloat16/float16 weights,
contiguous, no bias, an input dimension a block divides. For everything else (and without Triton)
`usable` is False and the caller keeps its own product. fused_step.py (and leanfp8.py's FP8
candidate, after its input quantizer) call this inside the static decoder's step; nothing else does.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def triton_or_why() -> tuple[Any, Any] | str:
    """(triton, triton.language), or why they cannot be imported here."""
    try:
        import triton
        import triton.language as tl
    except ImportError as err:
        return f"no Triton ({err})"
    return triton, tl


@functools.cache
def _compiled() -> dict[str, Any] | str:
    """The kernels (defined once: code, not state), or why Triton cannot be used here."""
    if isinstance(mods := triton_or_why(), str):
        return mods
    triton, tl = mods

    @triton.jit
    def grouped_kernel(w_ptr, x_ptr, y_ptr, off1, off2, n0, n1, n2, b0, b1, k,
                       BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        # which weight this program's block of rows belongs to; the weights as offsets from the first
        second = pid >= b0
        third = pid >= b1
        first_row = tl.where(third, (pid - b1) * BN, tl.where(second, (pid - b0) * BN, pid * BN))
        n = tl.where(third, n2, tl.where(second, n1, n0))
        w_off = tl.where(third, off2, tl.where(second, off1, 0)).to(tl.int64)
        y_off = tl.where(third, n0 + n1, tl.where(second, n0, 0))
        rows = first_row + tl.arange(0, BN)
        cols = tl.arange(0, BK)
        live = rows < n
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        base = w_ptr + w_off + rows.to(tl.int64)[:, None] * k
        for k0 in range(0, k, BK):
            w = tl.load(base + (k0 + cols)[None, :], mask=live[:, None], other=0.0)
            xk = tl.load(x_ptr + k0 + cols)
            acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + y_off + rows, y.to(y_ptr.dtype.element_ty), mask=live)

    @triton.jit
    def gate_up_kernel(g_ptr, up_off, x_ptr, y_ptr, n, k, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BN + tl.arange(0, BN)
        cols = tl.arange(0, BK)
        live = rows < n
        ag = tl.zeros((BN, BK), dtype=tl.float32)
        au = tl.zeros((BN, BK), dtype=tl.float32)
        base = g_ptr + rows.to(tl.int64)[:, None] * k
        for k0 in range(0, k, BK):
            xk = tl.load(x_ptr + k0 + cols).to(tl.float32)[None, :]
            g = tl.load(base + (k0 + cols)[None, :], mask=live[:, None], other=0.0)
            u = tl.load(base + up_off.to(tl.int64) + (k0 + cols)[None, :], mask=live[:, None], other=0.0)
            ag += g.to(tl.float32) * xk
            au += u.to(tl.float32) * xk
        dt = y_ptr.dtype.element_ty
        # each step rounded where eager rounds: the two products, SiLU's output, the product of both
        g = tl.sum(ag, axis=1).to(dt).to(tl.float32)
        u = tl.sum(au, axis=1).to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(y_ptr + rows, (s * u).to(dt), mask=live)

    @triton.jit
    def grouped_rows_kernel(w_ptr, x_ptr, y_ptr, off1, off2, n0, n1, n2, b0, b1, m, k,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # `m` (≤ BM) input rows: a tensor-core product per block of BK inputs, float32 accumulation
        pid = tl.program_id(0)
        second = pid >= b0
        third = pid >= b1
        first_row = tl.where(third, (pid - b1) * BN, tl.where(second, (pid - b0) * BN, pid * BN))
        n = tl.where(third, n2, tl.where(second, n1, n0))
        w_off = tl.where(third, off2, tl.where(second, off1, 0)).to(tl.int64)
        y_off = tl.where(third, n0 + n1, tl.where(second, n0, 0)) * m  # each weight's output [m, n] contiguous
        rows = first_row + tl.arange(0, BN)
        cols = tl.arange(0, BK)
        xr = tl.arange(0, BM)
        live = rows < n
        real = xr < m
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        wbase = w_ptr + w_off + rows.to(tl.int64)[None, :] * k  # read as [BK, BN]
        xbase = x_ptr + xr.to(tl.int64)[:, None] * k
        for k0 in range(0, k, BK):
            w = tl.load(wbase + (k0 + cols)[:, None], mask=live[None, :], other=0.0)
            xk = tl.load(xbase + (k0 + cols)[None, :], mask=real[:, None], other=0.0)
            acc = tl.dot(xk, w, acc)
        tl.store(y_ptr + y_off + xr[:, None] * n + rows[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=real[:, None] & live[None, :])

    @triton.jit
    def gate_up_rows_kernel(g_ptr, up_off, x_ptr, y_ptr, m, n, k,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BN + tl.arange(0, BN)
        cols = tl.arange(0, BK)
        xr = tl.arange(0, BM)
        live = rows < n
        real = xr < m
        ag = tl.zeros((BM, BN), dtype=tl.float32)
        au = tl.zeros((BM, BN), dtype=tl.float32)
        gbase = g_ptr + rows.to(tl.int64)[None, :] * k
        xbase = x_ptr + xr.to(tl.int64)[:, None] * k
        for k0 in range(0, k, BK):
            xk = tl.load(xbase + (k0 + cols)[None, :], mask=real[:, None], other=0.0)
            g = tl.load(gbase + (k0 + cols)[:, None], mask=live[None, :], other=0.0)
            u = tl.load(gbase + up_off.to(tl.int64) + (k0 + cols)[:, None], mask=live[None, :], other=0.0)
            ag = tl.dot(xk, g, ag)
            au = tl.dot(xk, u, au)
        dt = y_ptr.dtype.element_ty
        g = ag.to(dt).to(tl.float32)
        u = au.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(y_ptr + xr[:, None] * n + rows[None, :], (s * u).to(dt), mask=real[:, None] & live[None, :])

    return dict(grouped=grouped_kernel, gate_up=gate_up_kernel, grouped_rows=grouped_rows_kernel,
                gate_up_rows=gate_up_rows_kernel, cdiv=triton.cdiv)


def _load() -> bool:
    """Whether the kernels can run here (`missing` says why not)."""
    return not isinstance(_compiled(), str)


MAX_ROWS = 16  # input rows the many-row kernels take (one tensor-core tile of rows); more: the caller's product


# 2 to 16 input rows: (least output rows of the launch, BN, BKs in order of preference, warps, stages),
# the first entry whose row count the launch reaches. The best of 30 block shapes per launch at 8 rows,
# 8B layout, on the H200 (benchmarks/gemv.py; its rates: benchmarks/CHANGELOG.md, §14.4); o's 4,096 output
# rows make 128 programs of 32 rows for the H200's 132 SMs
_ROWS_TABLE = [
    (65536, 64, (128, 64, 32, 16), 4, 3),  # lm_head (128,256 × 4,096)
    (12288, 32, (64, 32, 16), 4, 3),  # gate/up (2 × 14,336 × 4,096)
    (0, 32, (256, 128, 64, 32, 16), 4, 4),  # q/k/v (6,144 × 4,096), o (4,096 × 4,096), down (4,096 × 14,336)
]


def _rows_block(rows: int) -> tuple[int, tuple[int, ...], int, int]:
    for least, bn, bks, warps, stages in _ROWS_TABLE:
        if rows >= least:
            return bn, bks, warps, stages
    raise AssertionError("the table's last entry takes every launch")


def block(rows: int, k: int, m: int = 1) -> tuple[int, int, int, int] | None:
    """(BN, BK, warps, stages) for `rows` output rows (all of a launch's weights) over `k` inputs
    and `m` input rows; None when no block divides `k`. From benchmarks/gemv.py on the H200 (the
    best of its sweep per weight shape). One row: many output rows, small blocks of many rows; few
    rows, long blocks. 2 to 16 rows: see `_ROWS_TABLE`."""
    if m > 1:
        bn, bks, warps, stages = _rows_block(rows)
    elif rows >= 12288:
        bn, bks, warps, stages = 16, (256, 128, 64), 4, 3
    elif rows >= 5120:
        bn, bks, warps, stages = 8, (512, 256, 128, 64), 4, 3
    else:
        bn, bks, warps, stages = 4, (1024, 512, 256, 128, 64), 4, 1
    bk = next((b for b in bks if k % b == 0), None)
    return None if bk is None else (bn, bk, warps, stages)


def usable(x: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Whether `x` (up to MAX_ROWS rows) times these weights can run here."""
    if not x.is_cuda or not x.is_contiguous() or x.dim() < 1:
        return False
    k = x.shape[-1]
    m = x.numel() // max(k, 1)
    if not 1 <= m <= MAX_ROWS:
        return False
    w0 = weights[0]
    if w0.dtype not in (torch.bfloat16, torch.float16) or x.dtype != w0.dtype:
        return False
    if any(w.dtype != w0.dtype or w.device != x.device or w.dim() != 2 or w.shape[1] != k
           or not w.is_contiguous() for w in weights):
        return False
    if any((w.data_ptr() - w0.data_ptr()) % w0.element_size() for w in weights):
        return False
    return block(sum(w.shape[0] for w in weights), k, m) is not None and _load()


def grouped(x: torch.Tensor, weights: list[torch.Tensor],
            config: tuple[int, int, int, int] | None = None) -> list[torch.Tensor]:
    """`x @ w.T` for each of up to three weights, one launch; outputs shaped like `F.linear`'s
    (x's leading axes, then each weight's rows), each contiguous, views of one buffer. Call
    `usable` first. `config` (BN, BK, warps, stages) overrides `block`'s (benchmarks/gemv.py's sweep)."""
    assert 1 <= len(weights) <= 3
    ws = list(weights) + [weights[0]] * (3 - len(weights))
    ns = [w.shape[0] if i < len(weights) else 0 for i, w in enumerate(ws)]
    k = weights[0].shape[1]
    m = x.numel() // k
    bn, bk, warps, stages = config or block(sum(ns), k, m)  # type: ignore[misc]
    cdiv = _compiled()["cdiv"]
    b0 = cdiv(ns[0], bn)
    b1 = b0 + cdiv(ns[1], bn)
    grid = b1 + cdiv(ns[2], bn)
    es = ws[0].element_size()
    offs = [(w.data_ptr() - ws[0].data_ptr()) // es for w in ws]
    y = torch.empty(m * sum(ns), dtype=x.dtype, device=x.device)
    if m == 1:
        _compiled()["grouped"][(grid,)](ws[0], x, y, offs[1], offs[2], ns[0], ns[1], ns[2], b0, b1, k,
                                     BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    else:
        _compiled()["grouped_rows"][(grid,)](ws[0], x, y, offs[1], offs[2], ns[0], ns[1], ns[2], b0, b1, m, k,
                                          BM=MAX_ROWS, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    lead = x.shape[:-1]
    out, start = [], 0
    for n in ns[: len(weights)]:
        out.append(y[m * start : m * (start + n)].view(*lead, n))
        start += n
    return out


def gate_up_silu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                 config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """SiLU(x @ gate.T) · (x @ up.T), one launch. Call `usable(x, [gate, up])` first (same shapes)."""
    n, k = gate.shape
    m = x.numel() // k
    bn, bk, warps, stages = config or block(2 * n, k, m)  # type: ignore[misc]
    y = torch.empty(m * n, dtype=x.dtype, device=x.device)
    off = (up.data_ptr() - gate.data_ptr()) // gate.element_size()
    grid = (_compiled()["cdiv"](n, bn),)
    if m == 1:
        _compiled()["gate_up"][grid](gate, off, x, y, n, k, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    else:
        _compiled()["gate_up_rows"][grid](gate, off, x, y, m, n, k, BM=MAX_ROWS, BN=bn, BK=bk, num_warps=warps,
                                       num_stages=stages)
    return y.view(*x.shape[:-1], n)


def missing() -> str | None:
    """Why Triton cannot be used here (None: it can)."""
    k = _compiled()
    return k if isinstance(k, str) else None
