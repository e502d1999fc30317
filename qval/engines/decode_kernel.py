"""The static decoder's attention on a GPU: one Triton split-KV kernel over the filled slots, the same sums every run.

decode_attention.py gives sdpa a one-token query over the filled slots with a boolean mask (the
left-padded prompt's hidden slots). With a mask, sdpa cannot take the flash kernel; outside
deterministic mode it takes cuDNN's, and in deterministic mode (the gate's: qval.determinism) torch
keeps cuDNN's attention off, so it runs the memory-efficient CUTLASS kernel, whose time grows
faster than the bytes it reads: several times the time reading the K/V takes at batch 8 and 2,048
slots, where this kernel comes close to it (benchmarks/CHANGELOG.md, §14.4).

This kernel reads each K/V head once for its whole query group (GQA: the group's query heads are
the rows of one tensor-core product), in `splits` pieces of the slots so that a batch of few rows
still fills the GPU (flash-decoding): each piece keeps its running maximum, sum and weighted values
in float32; a second kernel adds the pieces in a fixed order. The pieces are fixed by the step's
shape (rows, K/V heads, attended length), never by timing or by the moment, so a step gives the
same sums every run, in or out of deterministic mode. Scores are masked to exactly zero weight
(a piece with every slot hidden contributes nothing); the probabilities are rounded to the
values' dtype before their product with V, as flash attention does. The order of the sums is this
kernel's, not sdpa's: a step can differ from sdpa's in the last bit, which
`benchmarks/h200_issue15.py` checks through the greedy tokens and the logits.

Only what it can address: CUDA, bfloat16/float16, a head dimension of 16 to 256 that is a power of
two, a query group of at most 16 heads, the last axis contiguous, a boolean mask. `usable` says so;
decode_attention.py keeps sdpa otherwise.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import gemv

# (slots per inner step of a piece, warps, stages): the best of 19 on the H200 at batch 8 × 2,048 slots and
# batch 1 × 256 (benchmarks/decode_kernel.py, RESULTS §14.4; within 4 % of each case's best but batch 1 × 2,048)
CONFIG = (128, 4, 2)
GROUP_ROWS = 16  # a query group padded to one tensor-core tile of rows
TARGET_PROGRAMS = 264  # pieces × rows × K/V heads aimed at: two per SM of the H200 (132)


@functools.cache
def _compiled() -> dict[str, Any] | str:
    """The kernels (defined once: code, not state), or why Triton cannot be used here."""
    if isinstance(mods := gemv.triton_or_why(), str):
        return mods
    triton, tl = mods

    @triton.jit
    def attn_piece_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, ml_ptr, length, chunk, scale, hkv, splits,
                          sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sm_b,
                          G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        bh = tl.program_id(0)
        s = tl.program_id(1)
        b = bh // hkv
        h = bh % hkv
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        real = g < G
        q = tl.load(q_ptr + b.to(tl.int64) * sq_b + (h * G + g)[:, None] * sq_h + d[None, :], mask=real[:, None], other=0.0)
        kb = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
        vb = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h
        start = s * chunk
        end = tl.minimum(start + chunk, length)
        m_i = tl.full((GP,), -1.0e30, dtype=tl.float32)
        l_i = tl.zeros((GP,), dtype=tl.float32)
        acc = tl.zeros((GP, D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK):
            n = n0 + tl.arange(0, BLOCK)
            inside = n < end
            seen = tl.load(mask_ptr + b.to(tl.int64) * sm_b + n, mask=inside, other=0) != 0
            k = tl.load(kb + n.to(tl.int64)[:, None] * sk_l + d[None, :], mask=inside[:, None], other=0.0)
            sc = tl.dot(q, tl.trans(k)) * scale
            sc = tl.where(seen[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(vb + n.to(tl.int64)[:, None] * sv_l + d[None, :], mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        at = (bh * splits + s).to(tl.int64)
        tl.store(o_ptr + at * GP * D + g[:, None] * D + d[None, :], acc)
        tl.store(ml_ptr + at * 2 * GP + g, m_i)
        tl.store(ml_ptr + at * 2 * GP + GP + g, l_i)

    @triton.jit
    def attn_combine_kernel(o_ptr, ml_ptr, out_ptr, splits, hkv, so_b, so_h,
                            G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr):
        bh = tl.program_id(0)
        b = bh // hkv
        h = bh % hkv
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        base = bh.to(tl.int64) * splits
        m = tl.full((GP,), -1.0e30, dtype=tl.float32)
        for s in range(0, splits):
            m = tl.maximum(m, tl.load(ml_ptr + (base + s) * 2 * GP + g))
        num = tl.zeros((GP, D), dtype=tl.float32)
        den = tl.zeros((GP,), dtype=tl.float32)
        for s in range(0, splits):  # in order: the same sum every run
            w = tl.exp(tl.load(ml_ptr + (base + s) * 2 * GP + g) - m)
            den += w * tl.load(ml_ptr + (base + s) * 2 * GP + GP + g)
            num += w[:, None] * tl.load(o_ptr + (base + s) * GP * D + g[:, None] * D + d[None, :])
        res = num / den[:, None]
        tl.store(out_ptr + b.to(tl.int64) * so_b + (h * G + g)[:, None] * so_h + d[None, :],
                 res.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])

    return dict(piece=attn_piece_kernel, combine=attn_combine_kernel, cdiv=triton.cdiv)


def _load() -> bool:
    """Whether the kernels can run here (`missing` says why not)."""
    return not isinstance(_compiled(), str)


def splits(rows: int, kv_heads: int, length: int, block: int) -> int:
    """How many pieces the slots are cut into: enough programs for the GPU, each piece at least
    one inner step; a function of the step's shape only."""
    want = max(1, -(-TARGET_PROGRAMS // max(rows * kv_heads, 1)))
    return max(1, min(want, -(-length // block)))


def usable(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether `attend` can take this one-token step (query [B, Hq, 1, D], key [B, Hkv, L, D])."""
    if not query.is_cuda or query.dtype not in (torch.bfloat16, torch.float16) or key.dtype != query.dtype:
        return False
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    if q_len != 1 or hq % hkv or hq // hkv > GROUP_ROWS or d < 16 or d > 256 or d & (d - 1):
        return False
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        return False
    if mask is None or mask.dtype != torch.bool or mask.shape[0] != b or mask.stride(-1) != 1 or mask.numel() != b * mask.shape[-1]:
        return False
    return _load()


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, length: int,
           scale: float, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ·scale, the hidden slots excluded)·V over the first `length` slots, shaped
    [B, 1, Hq, D] (the layout transformers' attention functions return). `mask` [B, 1, 1, ≥ length],
    True where a slot is seen. Call `usable` first. `config` (slots per inner step, warps, stages)
    overrides `CONFIG` (benchmarks/decode_kernel.py's sweep)."""
    block, warps, stages = config or CONFIG
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    cdiv = _compiled()["cdiv"]
    chunk = cdiv(cdiv(length, splits(b, hkv, length, block)), block) * block  # slots per piece, whole inner steps
    n = cdiv(length, chunk)
    parts = torch.empty(b * hkv * n * GROUP_ROWS * d, dtype=torch.float32, device=query.device)
    ml = torch.empty(b * hkv * n * 2 * GROUP_ROWS, dtype=torch.float32, device=query.device)
    out = torch.empty(b, 1, hq, d, dtype=query.dtype, device=query.device)
    m8 = mask.view(torch.uint8)
    _compiled()["piece"][(b * hkv, n)](query, key, value, m8, parts, ml, length, chunk, float(scale), hkv, n,
                                    query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
                                    value.stride(0), value.stride(1), value.stride(2), m8.stride(0),
                                    G=g, GP=GROUP_ROWS, D=d, BLOCK=block, num_warps=warps, num_stages=stages)
    _compiled()["combine"][(b * hkv,)](parts, ml, out, n, hkv, out.stride(0), out.stride(2),
                                    G=g, GP=GROUP_ROWS, D=d, num_warps=4)
    return out


def missing() -> str | None:
    """Why Triton cannot be used here (None: it can)."""
    k = _compiled()
    return k if isinstance(k, str) else None
