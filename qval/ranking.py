"""The one rule for "the best candidate": named policies over a candidate's standing.

Every place that picks a winner — `qval sweep`'s recommendation, `qval gate`'s SmoothQuant-alpha
sweep, the fallback's choice of alpha and of its starting point — orders candidates with
`rank_key(standing, policy)`:

- ``smallest``: `qval sweep`, candidates of different formats. Approved first; among rejected
  ones fewer failed checks; then the smaller deployment footprint; at equal size fewer answers
  lost (gate 4's worst suite drop), then the smaller logit error (gate 1's mean KLD).
- ``closest``: candidates of one format and size (the alphas of one config). Approved first;
  fewer failed checks; then the smaller mean KLD; then the smaller worst drop.

A figure a run does not have (a gate switched off, an error) ranks last on that figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .gates.tasks import judge as tasks

POLICIES = ("smallest", "closest")
_STATUS = {"APPROVE": 0, "REJECT": 1, "ERROR": 2}


@dataclass(frozen=True)
class Standing:
    """What ranking reads of one candidate."""

    status: str  # APPROVE, REJECT or ERROR
    failures: int = 0  # failed checks (0 unless REJECT)
    size: float | None = None  # deployment bytes (weights + KV cache), when known
    worst_drop: float | None = None  # gate 4: the largest suite drop (reference − candidate)
    mean_kld: float | None = None  # gate 1


def or_inf(x: float | None) -> float:
    """A figure, or inf where a run has none (it ranks last on that figure)."""
    return x if x is not None and math.isfinite(x) else math.inf


def rank_key(s: Standing, policy: str) -> tuple[Any, ...]:
    """Sort key: smaller is better.

    >>> a = Standing("APPROVE", size=10, worst_drop=0.1, mean_kld=0.02)
    >>> b = Standing("APPROVE", size=10, worst_drop=0.0, mean_kld=0.05)
    >>> c = Standing("REJECT", failures=1, size=5, mean_kld=0.01)
    >>> [x.mean_kld for x in sorted([a, b, c], key=lambda x: rank_key(x, "smallest"))]
    [0.05, 0.02, 0.01]
    >>> [x.mean_kld for x in sorted([a, b, c], key=lambda x: rank_key(x, "closest"))]
    [0.02, 0.05, 0.01]
    """
    head = (_STATUS[s.status], s.failures if s.status == "REJECT" else 0)
    if policy == "smallest":
        return (*head, or_inf(s.size), or_inf(s.worst_drop), or_inf(s.mean_kld))
    if policy == "closest":
        return (*head, or_inf(s.mean_kld), or_inf(s.worst_drop))
    raise ValueError(f"unknown ranking policy {policy!r}; one of {', '.join(POLICIES)}")


def worst_drop(report: dict[str, Any]) -> float | None:
    """Gate 4's summary figure: the largest paired drop over its suites (None without gate 4)."""
    return tasks.worst_drop(report.get("gates", {}).get("tasks") or {})


def mean_kld(report: dict[str, Any]) -> float | None:
    e = report.get("gates", {}).get("agreement", {}).get("measurements", {}).get("mean_kld")
    return e.get("value") if e else None


def standing(run: Any, size: float | None = None) -> Standing:
    """The standing of a finished run (`pipeline.RunResult`); `run` None: an error."""
    if run is None:
        return Standing("ERROR", size=size)
    approved = run.verdict.approved
    return Standing("APPROVE" if approved else "REJECT", 0 if approved else len(run.verdict.failures), size,
                    worst_drop(run.report), mean_kld(run.report))


def best(runs: list[Any], policy: str, sizes: list[float | None] | None = None) -> int:
    """Index of the best of `runs` under `policy` (the first of equals)."""
    sizes = sizes or [None] * len(runs)
    keys = [rank_key(standing(r, z), policy) for r, z in zip(runs, sizes)]
    return min(range(len(runs)), key=lambda i: keys[i])
