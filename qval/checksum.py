"""Exact checksums of tensors' bits, computed where the tensors live (no copy to the host).

A sequential run calibrates the reference's own weights in place (qval/pipeline.py), so the
weights calibration changed (SmoothQuant and AWQ fold scales into them) are found by comparing
each tensor's checksum before and after, not against a second copy of the model.
"""

from __future__ import annotations

import torch

_CHUNK = 1 << 24  # elements per step: the int64 temporaries stay at 128 MiB
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def checksum(t: torch.Tensor) -> tuple[str, tuple[int, ...], int]:
    """(dtype, shape, a position-weighted sum of the raw bits): equal for bit-identical tensors;
    any changed element changes it (barring an exact cancellation no real update produces).

    >>> a = torch.arange(6.0)
    >>> checksum(a) == checksum(a.clone()), checksum(a) == checksum(a + 1e-6 * (a == 3))
    (True, False)
    """
    flat = t.detach().contiguous().reshape(-1)
    bits = flat.view(_INT[flat.element_size()]) if flat.is_floating_point() or flat.dtype not in _INT.values() else flat
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for s in range(0, bits.numel(), _CHUNK):
        part = bits[s : s + _CHUNK].to(torch.int64)
        w = torch.arange(s, s + part.numel(), device=flat.device, dtype=torch.int64) % 65521 + 1
        total += (part * w).sum()
    return str(t.dtype), tuple(t.shape), int(total)


def checksums(state: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], int]]:
    return {k: checksum(v) for k, v in state.items()}
