"""The export_fidelity gate's typed details: the fidelity report of the exported checkpoint
(`qval.export.fidelity.FidelityReport.to_dict()` without its per-layer rows and its cache key) and the
notes of every check that did not pass."""

from __future__ import annotations

from ...results.base import Block, Details


class FidelityCheck(Block):
    """One fidelity check: `severity` "error" fails the gate, "warn" is reported only."""

    name: str
    ok: bool
    severity: str
    detail: str


class ChangedLayer(Block):
    """A layer the exporter changed against the calibrated model (e.g. re-smoothed), and how."""

    layer: str
    changes: list[str]


class ExportFidelityDetails(Details):
    """Whether every error-severity check passed, each check, the weight totals over the quantized layers
    (`layers`, `n`, `equal`, `ties`, `mismatches`, `bad_layers`; empty when the comparison did not run), the
    layers changed at export, and one note per check that did not pass."""

    passed: bool
    checks: list[FidelityCheck]
    totals: dict[str, int]
    changed_at_export: list[ChangedLayer]
    notes: list[str]


#: the gate's details type (`qval.results.TYPES`)
DETAILS = ExportFidelityDetails
