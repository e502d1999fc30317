"""Each gate's result details as a type (pydantic, torch-free): the gate's judge builds it, report.json
is its `to_dict()`, and report.md / report.html read its fields, so a renamed or missing key is an
error where it happens rather than a "None" in a report. A stored result is read back through its
gate's type (`typed`).
"""

from __future__ import annotations

from typing import Any

from ..gate_registry import covered
from .agreement import AgreementDetails
from .base import Block, Details, parse
from .depth import DepthDetails
from .export_fidelity import ExportFidelityDetails
from .longgen import LonggenDetails
from .quality import QualityDetails
from .retrieval import RetrievalDetails
from .tasks import TasksDetails

#: each gate's details type, by gate name (every gate qval.gate_registry declares)
TYPES: dict[str, type[Details]] = dict(covered("result type", {
    "agreement": AgreementDetails, "depth": DepthDetails, "quality": QualityDetails, "longgen": LonggenDetails,
    "retrieval": RetrievalDetails, "tasks": TasksDetails, "export_fidelity": ExportFidelityDetails},
    "qval/results/__init__.py"))


def typed(gate: str, status: str, details: Any) -> Any:
    """A result's details as its gate's type when the gate has one and finished ("ok": an error or
    non-finite result carries only what the gate knew before it stopped); else as given."""
    cls = TYPES.get(gate)
    if cls is None or status != "ok":
        return details
    return parse(cls, details, f"gate {gate}'s result")


__all__ = ["AgreementDetails", "Block", "DepthDetails", "Details", "ExportFidelityDetails", "LonggenDetails", "QualityDetails", "RetrievalDetails", "TYPES", "TasksDetails", "parse", "typed"]
