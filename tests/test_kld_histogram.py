"""Gate 1's KLD histogram (report.json's `kld_histogram`, the report's plot) on every shape of data a run can give:
a candidate identical to the reference, KLDs all below 1e-12 (an 8B-shaped model with random weights served on
both sides of an H100, 2026-12-06: qval stopped with an internal error), one repeated value, non-finite values."""

from __future__ import annotations

import numpy as np
import pytest

from qval.gates.agreement.judge import histogram


@pytest.mark.parametrize("kld", [
    np.full(64, 1e-15),                              # every value below the 1e-12 floor
    np.array([3e-16, 1e-15, 7e-14, 0.0]),            # spread below it, one zero
    np.full(64, 0.02),                                # one value repeated
    np.array([1e-15, 1e-3, 0.5, np.nan, np.inf]),     # across the floor, non-finite left out
    np.geomspace(1e-6, 3.0, 1000),
])
def test_every_positive_finite_kld_is_counted_once_in_increasing_bins(kld):
    h = histogram(kld)
    edges, counts = np.asarray(h["edges"]), np.asarray(h["counts"])
    assert (np.diff(edges) > 0).all() and len(counts) == len(edges) - 1 == 40
    pos = kld[np.isfinite(kld) & (kld > 0)]
    inside = pos[pos >= 1e-12] if (pos >= 1e-12).any() else pos  # the floor: below 1e-12 only when all are
    assert counts.sum() == inside.size and edges[0] <= inside.min() and inside.max() < edges[-1]
    assert h["zeros"] == int(np.sum(kld <= 0))


def test_no_positive_kld_is_an_empty_histogram_with_its_zeros():
    assert histogram(np.zeros(5)) == {"edges": [], "counts": [], "zeros": 5}
