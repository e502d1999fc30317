"""Each gate's result details as a type (pydantic, torch-free): the gate's judge builds it, report.json
is its `to_dict()`, and report.md / report.html read its fields, so a renamed or missing key is an
error where it happens rather than a "None" in a report. A stored result is read back through its
gate's type (`typed`).

Each gate's type is its package's `result.py` (`DETAILS`); `TYPES` maps every gate `qval.gate_registry`
declares to it, read on first use (a gate's result module imports `qval.results.base`, so this package
loads none of them when it is imported).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ..registry import read_on_first_use
from .base import Block, Details, parse


@cache
def _types() -> dict[str, type[Details]]:
    """Each gate's details type, by gate name, in run order."""
    from ..gate_registry import parts

    return {d.name: m.DETAILS for d, m in parts("result")}


__getattr__ = read_on_first_use(__name__, TYPES=_types)


def typed(gate: str, status: str, details: Any) -> Any:
    """A result's details as its gate's type when the gate has one and finished ("ok": an error or
    non-finite result carries only what the gate knew before it stopped); else as given."""
    cls = _types().get(gate)
    if cls is None or status != "ok":
        return details
    return parse(cls, details, f"gate {gate}'s result")


__all__ = ["Block", "Details", "TYPES", "parse", "typed"]
