"""The verdict is data: `decide(results, thresholds) -> Verdict`.

A check passes only when its gate ran, its figure is a finite number, and the figure is on
the right side of its threshold. A gate that did not run, failed, or produced a NaN is a
failure, never a pass: a release gate that shrugs at missing evidence approves broken models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from .errors import DataError
from .gate_metrics import Metric
from .gate_registry import TABLES
from .metrics import Estimate
from .metrics.thresholds import absolute_rates
from .results import Details, typed


@dataclass(frozen=True)
class CheckKey:
    """A check's identity: its gate, the figure it limits (a gate_metrics row's key, or a figure with no row:
    "failed_checks", "status") and the bucket that figure is measured in, if any (a context length, a depth
    range, a language, a suite). report.json names it by `name`: the bucket after the metric, joined by
    `joiner` ("drop@256", "top1@0-512", "bleu_drop_en"); `str(key)` is "gate/name".

    >>> k = CheckKey("retrieval", "drop", "256")
    >>> str(k), k.name, CheckKey("quality", "bleu_drop", "en", "_").name, str(CheckKey("agreement", "top1"))
    ('retrieval/drop@256', 'drop@256', 'bleu_drop_en', 'agreement/top1')
    """

    gate: str
    metric: str
    bucket: str | None = None
    joiner: Literal["@", "_"] = "@"

    @property
    def name(self) -> str:
        return self.metric if self.bucket is None else f"{self.metric}{self.joiner}{self.bucket}"

    def __str__(self) -> str:
        return f"{self.gate}/{self.name}"

    @classmethod
    def parse(cls, gate: str, name: str) -> "CheckKey":
        """The key of a check named `name` in stored text (report.json, the measured data): the gate's
        gate_metrics row whose key the name is, or starts with before a joiner (the longest such key), and
        the rest as the bucket; a name of no row is the metric itself. `parse(k.gate, k.name) == k` for
        every key a judge makes (tests/test_judges.py holds it)."""
        table = next((t for t in TABLES if t.gate == gate), None)
        keys = [] if table is None else [m.key for m in table.metrics]
        if name in keys:
            return cls(gate, name)
        found = [(k, j) for k in keys for j in ("@", "_") if name.startswith(k + j) and len(name) > len(k) + 1]
        if not found:
            return cls(gate, name)
        key, joiner = max(found, key=lambda f: len(f[0]))
        return cls(gate, key, name[len(key) + 1:], joiner)  # type: ignore[arg-type]


class _Keyed:
    """`gate` and `metric` of what a `CheckKey` names: a threshold, a check."""

    key: CheckKey

    @property
    def gate(self) -> str:
        return self.key.gate

    @property
    def metric(self) -> str:
        """The figure's name in the gate's measurements and in report.json (`key.name`)."""
        return self.key.name


@dataclass(frozen=True)
class Threshold(_Keyed):
    """One limit on one figure of one gate."""

    key: CheckKey  # which check: its gate, its figure (the key into GateResult.measurements: `key.name`) and bucket
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
    #: which end of the measured estimate meets the limit: "value" (the point estimate), "hi" (the
    #: upper end of its interval: for a "max" limit, a noisier candidate then passes less easily,
    #: never more) or "lo" (the lower end, for a "min" limit). Non-inferiority checks use the bound.
    on: Literal["value", "lo", "hi"] = "value"
    #: False when the check cannot show a loss on this data (the reference itself cannot do the
    #: task): the outcome is "uninformative", stated beside the verdict, never a pass
    informative: bool = True
    why_uninformative: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, CheckKey):
            raise TypeError(f"a threshold's key is a CheckKey (gate, metric, bucket), not {self.key!r}")


@dataclass
class GateResult:
    gate: str
    #: skipped: --fail-fast, an earlier gate rejected; pending: a sequential run finishes it once the reference
    #: is back (GateSpec.complete), never in a report
    status: Literal["ok", "error", "nonfinite", "skipped", "pending"]
    measurements: dict[str, Estimate] = field(default_factory=dict)
    #: the gate's typed details (qval.results) where its gate has a type and it finished, else a plain dict
    details: Details | dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    #: the gate's stage folder, where it wrote its own files (gate 1's per-position arrays): set by whoever runs
    #: the gates (the pipeline, the snapshot's fill) for a result computed or read back; later gates find the
    #: files through `GateContext.upstream`, never by a sibling folder's name. Not part of report.json.
    folder: Path | None = None

    def file(self, name: str) -> Path:
        """One of the files this gate wrote, or a DataError naming what is missing."""
        path = self.folder / name if self.folder is not None else None
        if path is None or not path.is_file():
            raise DataError(f"gate {self.gate}: its {name} is missing{f' from {self.folder}' if self.folder else ''}; "
                            "run the gate again (delete its stage folder).")
        return path

    def record_snapshot_use(self, use: dict[str, Any]) -> None:
        """This gate's use of the snapshot reference (calls computed / read back), in its details."""
        if isinstance(self.details, Details):
            self.details.snapshot = use
        else:
            self.details["snapshot"] = use

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "measurements": {k: v.to_dict() for k, v in self.measurements.items()},
            "details": self.details.to_dict() if isinstance(self.details, Details) else self.details,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GateResult":
        return cls(
            gate=d["gate"],
            status=d["status"],
            measurements={k: Estimate.from_dict(v) for k, v in d["measurements"].items()},
            details=typed(d["gate"], d["status"], d.get("details", {})),
            error=d.get("error"),
            seconds=d.get("seconds", 0.0),
        )


@dataclass(frozen=True)
class Check(_Keyed):
    key: CheckKey
    description: str
    value: float | None
    lo: float | None
    hi: float | None
    op: str
    limit: float
    source: str
    min_detectable_effect: float | None
    outcome: Literal["pass", "fail", "uninformative"]
    reason: str
    detectable: float | None = None
    on: str = "value"
    #: the probability that a candidate at the reference's level fails this check: α for a sized check,
    #: the normal model of `metrics.thresholds.absolute_rates` for an absolute one; None where not stated
    size: float | None = None
    size_basis: str | None = None
    #: a sized check's centre where its config states one (`Sized.healthy`): the figure a healthy candidate shows
    healthy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """report.json's check: "gate" and "metric" (the key's name), then every other field in order."""
        d = {"gate": self.gate, "metric": self.metric, **{f.name: getattr(self, f.name) for f in fields(self)[1:]}}
        if d["healthy"] is None:  # only where a check states one: a report without it reads the same as before
            del d["healthy"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Check":
        """A check read back from report.json (its key parsed from "gate" and "metric": `CheckKey.parse`)."""
        rest = {k: v for k, v in d.items() if k not in ("gate", "metric")}
        return cls(CheckKey.parse(d["gate"], d["metric"]), **rest)


@dataclass(frozen=True)
class Verdict:
    approved: bool
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "fail"]

    @property
    def uninformative(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "uninformative"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "decision": "APPROVE" if self.approved else "REJECT",
            "failed_checks": len(self.failures),
            "uninformative_checks": len(self.uninformative),
            "checks": [c.to_dict() for c in self.checks],
        }


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def row_of(key: CheckKey) -> Metric | None:
    """The gate_metrics row a check's figure comes from (that of `drop` for `drop@256`), None for a figure
    with no row."""
    table = next((t for t in TABLES if t.gate == key.gate), None)
    return next((m for m in table.metrics if m.key == key.metric), None) if table is not None else None


def reference_level(row: Metric) -> float:
    """The figure's value for a candidate at the reference's own level: the best value a limit may
    take (a top-1 of 1, a PPL ratio of 1, a KLD, drop, drift or excess of 0)."""
    return row.hi if row.op == "min" and row.hi is not None else row.lo


def stated_rates(t: Threshold, est: Estimate | None) -> tuple[float | None, float | None, str | None]:
    """(size, detectable, basis) the check states: a sized check its α and the detectable effect it
    was sized for; an absolute one `absolute_rates` at this candidate's noise."""
    if t.source == "sized":
        alpha, healthy = t.detail.get("alpha"), t.detail.get("healthy")
        basis = None if alpha is None else f"sized from the reference's spread at α = {alpha:g}" + (
            "" if healthy is None else f", around the healthy figure {healthy:g} its config states (α there; less at the reference's level)")
        return alpha, t.detectable, basis
    row = row_of(t.key)
    if est is None or row is None or not math.isfinite(est.value) or not math.isfinite(t.limit):
        return None, t.detectable, None
    bound = est.hi if t.on == "hi" else est.lo if t.on == "lo" else None
    se = est.stderr
    if se is None and est.lo is not None and est.hi is not None:
        se = (est.hi - est.lo) / (2 * 1.959963984540054)  # an interval without a standard error: as if normal, 95 %
    r = absolute_rates(t.op, t.limit, t.on, reference_level(row), est.value, bound, se)
    basis = r.basis if est.stderr is not None else r.basis + " (read from an interval without one, as if 95 % normal: approximate)"
    return r.size, t.detectable if t.detectable is not None else r.detectable, basis


def _check(t: Threshold, result: GateResult | None) -> Check:
    est0 = result.measurements.get(t.metric) if result is not None and result.status == "ok" else None
    size, detectable, basis = stated_rates(t, est0)

    def make(value: float | None, lo: float | None, hi: float | None, outcome: str, reason: str) -> Check:
        return Check(t.key, t.description, value, lo, hi, t.op, t.limit, t.source,
                     t.min_detectable_effect, outcome, reason, detectable, t.on, size, basis,  # type: ignore[arg-type]
                     t.detail.get("healthy") if t.source == "sized" else None)

    if result is None:
        return make(None, None, None, "fail", f"gate {t.gate} did not run, so {t.metric} was never measured")
    if result.status != "ok":
        return make(None, None, None, "fail", f"gate {t.gate} {result.status}: {result.error}")
    est = result.measurements.get(t.metric)
    if est is None:
        return make(None, None, None, "fail", f"gate {t.gate} produced no {t.metric}")
    v = est.value
    if not t.informative:
        shown = "–" if v is None or not math.isfinite(v) else _fmt(v)
        return make(v, est.lo, est.hi, "uninformative", f"{t.metric} = {shown}: uninformative, {t.why_uninformative or 'this data cannot show a loss'}")
    if v is None or not math.isfinite(v):
        return make(v, est.lo, est.hi, "fail", f"{t.metric} is {v}: not a finite number")
    compared, what = v, t.metric
    if t.on != "value":
        compared = est.hi if t.on == "hi" else est.lo
        what = f"{'upper' if t.on == 'hi' else 'lower'} bound of {t.metric}"
        if compared is None and est.n is not None and est.n < 2:
            compared, what = v, f"{t.metric} (one sample: no interval, the value itself)"
        elif compared is None or not math.isfinite(compared):
            return make(v, est.lo, est.hi, "fail", f"{t.metric} = {_fmt(v)} has no finite {what.split()[0]} bound to meet the limit")
    ok = compared <= t.limit if t.op == "max" else compared >= t.limit
    sign = "<=" if t.op == "max" else ">="
    words = "within" if ok else "outside"
    shown = _fmt(compared) if t.on == "value" or compared is v else f"{_fmt(compared)} ({t.metric} {_fmt(v)})"
    reason = f"{what} = {shown} {'' if ok else 'not '}{sign} {_fmt(t.limit)} ({words} the {t.source} threshold)"
    return make(v, est.lo, est.hi, "pass" if ok else "fail", reason)


def decide(results: dict[str, GateResult], thresholds: list[Threshold]) -> Verdict:
    """Every threshold becomes a check; the candidate is approved only if no check fails and at
    least one passes. An uninformative check (the data cannot show a loss) is neither: it is
    reported beside the verdict. No checks, or only uninformative ones, reject: approving on no
    evidence is never right.
    """
    checks = [_check(t, results.get(t.gate)) for t in thresholds]
    # a gate that ran into trouble fails even if no threshold names its figures
    for name, r in results.items():
        if r.status != "ok" and not any(t.gate == name for t in thresholds):
            checks.append(Check(CheckKey(name, "status"), "gate ran to completion", None, None, None, "min", 1.0,
                                "absolute", None, "fail", f"gate {name} {r.status}: {r.error}"))
    if not checks:
        checks.append(Check(CheckKey("-", "-"), "at least one check", None, None, None, "min", 1.0, "absolute", None,
                            "fail", "no gate produced a check: nothing supports an approval"))
    if all(c.outcome == "uninformative" for c in checks):
        checks.append(Check(CheckKey("-", "-"), "at least one informative check", None, None, None, "min", 1.0, "absolute", None,
                            "fail", "every check was uninformative: nothing supports an approval"))
    return Verdict(approved=all(c.outcome != "fail" for c in checks), checks=checks)
