"""Perplexity and the paired perplexity ratio of gate 2.

PPL = exp(mean NLL) over the scored positions (corpus-level, not a mean of per-text PPLs).
The candidate/reference ratio is computed from the PAIRED per-token differences nll_c − nll_r:
both models score the same tokens, so most of the token-to-token variance cancels and the
ratio's interval is far tighter than one built from two independent PPL intervals.
"""

from __future__ import annotations

import math

import numpy as np

from qval.metrics.estimate import Z95, Estimate, mean_estimate


def _exp_of_mean(m: Estimate) -> Estimate:
    """exp of a mean estimate: stderr by the delta method exp(m)·se, interval exp(m ± 1.96·se).

    The interval is built on the log scale and exponentiated, so it stays positive and is
    asymmetric around the value, as a ratio's interval should be.
    >>> e = _exp_of_mean(Estimate(0.0, 0.1, -0.196, 0.196, 10))
    >>> e.value, round(e.stderr, 6), round(e.lo, 6), round(e.hi, 6)
    (1.0, 0.1, 0.822015, 1.216523)
    """
    value = math.exp(m.value) if not math.isnan(m.value) else float("nan")
    if m.stderr is None:
        return Estimate(value, n=m.n)
    return Estimate(
        value,
        value * m.stderr,
        math.exp(m.value - Z95 * m.stderr),
        math.exp(m.value + Z95 * m.stderr),
        m.n,
    )


def perplexity(nll: np.ndarray) -> Estimate:
    """exp(mean NLL) with interval exp(mean ± 1.96·se) over the per-token NLLs (natural log).

    >>> e = perplexity(np.full(5, math.log(4.0)))
    >>> round(e.value, 9), e.stderr, e.n
    (4.0, 0.0, 5)
    """
    return _exp_of_mean(mean_estimate(np.asarray(nll, dtype=np.float64)))


def ppl_ratio(nll_cand: np.ndarray, nll_ref: np.ndarray) -> Estimate:
    """PPL_cand / PPL_ref = exp(mean(nll_c − nll_r)), uncertainty from the paired differences.

    >>> e = ppl_ratio(np.array([1.1, 2.1, 3.1]), np.array([1.0, 2.0, 3.0]))
    >>> round(e.value, 9), round(e.stderr, 9)
    (1.105170918, 0.0)
    """
    c = np.asarray(nll_cand, dtype=np.float64).reshape(-1)
    r = np.asarray(nll_ref, dtype=np.float64).reshape(-1)
    if c.shape != r.shape:
        raise ValueError(
            f"ppl_ratio needs the same scored positions for both models; got {c.size} candidate "
            f"and {r.size} reference NLLs"
        )
    return _exp_of_mean(mean_estimate(c - r))
