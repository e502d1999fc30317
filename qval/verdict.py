"""The verdict is data: `decide(results, thresholds) -> Verdict`.

A check passes only when its gate ran, its figure is a finite number, and the figure is on
the right side of its threshold. A gate that did not run, failed, or produced a NaN is a
failure, never a pass: a release gate that shrugs at missing evidence approves broken models.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .metrics import Estimate


@dataclass(frozen=True)
class Threshold:
    """One limit on one figure of one gate."""

    gate: str
    metric: str  # key into GateResult.measurements
    op: Literal["max", "min"]  # "max": the figure must be <= limit; "min": >= limit
    limit: float
    description: str  # what the figure means, in words
    source: str = "absolute"  # "absolute" (from the config) or "sized" (from the data)
    #: for sized thresholds: the smallest effect the gate can detect (α, β as configured), in the
    #: effect's own unit (a drop, an excess, a relative PPL increase)
    min_detectable_effect: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    #: the figure's value at that effect: a candidate at or beyond it is rejected with power 1 − β
    #: ("max": values >= it, "min": values <= it)
    detectable: float | None = None


@dataclass
class GateResult:
    gate: str
    status: Literal["ok", "error", "nonfinite", "skipped"]  # skipped: --fail-fast, an earlier gate rejected
    measurements: dict[str, Estimate] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "measurements": {k: v.to_dict() for k, v in self.measurements.items()},
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GateResult":
        return cls(
            gate=d["gate"],
            status=d["status"],
            measurements={k: Estimate.from_dict(v) for k, v in d["measurements"].items()},
            details=d.get("details", {}),
            error=d.get("error"),
            seconds=d.get("seconds", 0.0),
        )


@dataclass(frozen=True)
class Check:
    gate: str
    metric: str
    description: str
    value: float | None
    lo: float | None
    hi: float | None
    op: str
    limit: float
    source: str
    min_detectable_effect: float | None
    outcome: Literal["pass", "fail"]
    reason: str
    detectable: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    approved: bool
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "decision": "APPROVE" if self.approved else "REJECT",
            "failed_checks": len(self.failures),
            "checks": [c.to_dict() for c in self.checks],
        }


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _check(t: Threshold, result: GateResult | None) -> Check:
    def make(value: float | None, lo: float | None, hi: float | None, outcome: str, reason: str) -> Check:
        return Check(t.gate, t.metric, t.description, value, lo, hi, t.op, t.limit, t.source,
                     t.min_detectable_effect, outcome, reason, t.detectable)  # type: ignore[arg-type]

    if result is None:
        return make(None, None, None, "fail", f"gate {t.gate} did not run, so {t.metric} was never measured")
    if result.status != "ok":
        return make(None, None, None, "fail", f"gate {t.gate} {result.status}: {result.error}")
    est = result.measurements.get(t.metric)
    if est is None:
        return make(None, None, None, "fail", f"gate {t.gate} produced no {t.metric}")
    v = est.value
    if v is None or not math.isfinite(v):
        return make(v, est.lo, est.hi, "fail", f"{t.metric} is {v}: not a finite number")
    ok = v <= t.limit if t.op == "max" else v >= t.limit
    sign = "<=" if t.op == "max" else ">="
    words = "within" if ok else "outside"
    reason = f"{t.metric} = {_fmt(v)} {'' if ok else 'not '}{sign} {_fmt(t.limit)} ({words} the {t.source} threshold)"
    return make(v, est.lo, est.hi, "pass" if ok else "fail", reason)


def decide(results: dict[str, GateResult], thresholds: list[Threshold]) -> Verdict:
    """Every threshold becomes a check; the candidate is approved only if every check passes.

    An empty threshold list rejects: approving on no evidence is never right.
    """
    checks = [_check(t, results.get(t.gate)) for t in thresholds]
    # a gate that ran into trouble fails even if no threshold names its figures
    for name, r in results.items():
        if r.status != "ok" and not any(t.gate == name for t in thresholds):
            checks.append(Check(name, "status", "gate ran to completion", None, None, None, "min", 1.0,
                                "absolute", None, "fail", f"gate {name} {r.status}: {r.error}"))
    if not checks:
        checks.append(Check("-", "-", "at least one check", None, None, None, "min", 1.0, "absolute", None,
                            "fail", "no gate produced a check: nothing supports an approval"))
    return Verdict(approved=all(c.outcome == "pass" for c in checks), checks=checks)
