"""What every config section is built from: `Strict` (the base of every section), the limits a gate
section takes (`Limit`, `CountLimit`, `Sized`) and the checks a gate section runs on them: `check_limit`
(one limit by its row of the gate's table: bounds, whole numbers, whether it may be sized) and
`sets_a_threshold` (an enabled section must set one of its table's limits). Each gate's section is its
package's `config.py` (`qval/gates/<name>/config.py`); `GatesConfig` (`qval.config_gates`) holds them.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .gate_metrics import GateMetrics, Metric


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class Sized(Strict):
    """A threshold sized from the reference's own noise: ref ± Φ⁻¹(α)·sqrt(2σ²/n), or, where `healthy`
    is given, healthy ± the same margin (a ratio: healthy × the margin's factor)."""

    sized: Literal[True] = True  # marks the limit as sized from the reference's own spread
    alpha: float = Field(0.05, gt=0, lt=0.5)  # one-sided level: how often a candidate at the reference's level (at `healthy`, where given) fails
    beta: float = Field(0.2, gt=0, lt=0.5)  # 1 − power at the smallest detectable effect printed beside the check
    #: the figure a healthy candidate of this format is expected to show, measured over healthy variants (a
    #: quantized model's greedy text is never the reference's mode, so its judge NLL excess is above 0): the
    #: limit is sized around it, so α is the false-reject rate there. Absent: the reference's own level.
    #: A number in the config, never from the candidate: a worse candidate cannot widen the limit
    healthy: float | None = None

    @field_validator("healthy", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number (the figure a healthy candidate is expected to show), not a boolean")
        return v


Limit = Union[float, Sized, None]


def sets_a_threshold(section: Any, table: GateMetrics) -> Any:
    """The section, unless it is enabled and sets none of its table's limits (it could never fail)."""
    if section.enabled and all(getattr(section, f) is None for f in table.fields):
        *first, last = table.fields
        raise ValueError("gate is enabled but sets no threshold, so it could never fail; "
                         f"set {', '.join(first)} or {last}, or enabled: false")
    return section


# Thresholds of gates 2 and 3: an absolute limit (a number in the figure's own unit) or
# `{sized: true, alpha, beta, healthy}`, sized from the data the way DESIGN.md describes. They are checked
# by `check_limit` before the union sees them, so a bad value gets one plain message, not one per branch.
CountLimit = Union[int, Sized, None]


def check_limit(v: Any, m: Metric) -> Any:
    """Validate one threshold of row `m`: None, a number in [lo, hi] (whole for counts), or a
    sized spec where the row allows one."""
    if "sized" not in m.kinds and isinstance(v, (dict, Sized)):
        raise ValueError("cannot be sized: the only spread it could be sized from is the candidate's own, so a "
                         "worse (noisier) candidate would get a looser limit; give an absolute limit (the check "
                         "meets it with the figure's 95% interval bound, so noise makes it stricter, never looser)")
    if v is None:
        return v
    if isinstance(v, dict):
        unknown = sorted(set(v) - set(Sized.model_fields))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)} in a sized threshold; allowed: sized, alpha, beta, healthy")
        try:
            v = Sized.model_validate(v)
        except ValidationError as err:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())) from None
    if isinstance(v, Sized):
        h = v.healthy  # a boolean: Sized refuses it
        if h is not None and (not math.isfinite(h) or not _within(h, m)):
            raise ValueError(f"healthy must be a number in {_bounds(m)} (the figure a healthy candidate is expected to "
                             f"show; {m.lo:g} is the reference's own level), got {h!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("must be a number, or {sized: true} (optionally with alpha, beta and healthy)")
    if m.integer and v != int(v):
        raise ValueError("must be a whole number (it counts prompts)")
    if not _within(v, m):
        raise ValueError(f"must lie in {_bounds(m)}")
    return int(v) if m.integer else float(v)


def _within(v: float, m: Metric) -> bool:
    return v >= m.lo and (m.hi is None or v <= m.hi)


def _bounds(m: Metric) -> str:
    return f"[{m.lo:g}, {'∞' if m.hi is None else f'{m.hi:g}'}]"
