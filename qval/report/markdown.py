"""report.md: the verdict first, then every check, then each gate's evidence (its package's `section.py`, read
through `qval.report.sections`)."""

from __future__ import annotations

from typing import Any

from .diagnostics_md import diagnostics_markdown
from .formatting import (CHECK_COLUMNS, TITLES, calibration_text, candidate_text, check_rows, failed_text, numerics_line,
                         reference_text, runtime_text, snapshot_text, stage_columns, stage_rows, versions_text)
from .measured_error_rates import SIZE_COLUMN, SIZE_NOTE, file_text, size_cell
from .md_parts import generic_section, table
from .numbers import fmt
from . import sections
from .. import results

#: how report.md marks a check's outcome (formatting.outcome)
MARKS = {"pass": "PASS", "fail": "**FAIL**", "uninformative": "uninformative"}
CHECK_SHOWN = ("gate", "metric", "value", "95% interval", "threshold", "outcome", SIZE_COLUMN)


def checks_table(checks: list[dict[str, Any]], rates: dict[str, Any] | None = None) -> list[str]:
    rows = [dict(zip(CHECK_COLUMNS, row), **{SIZE_COLUMN: size_cell(c, rates)}) for row, c in zip(check_rows(checks), checks)]
    return table(CHECK_SHOWN, [[fmt(r[k]) if k != "outcome" else MARKS[r[k]] for k in CHECK_SHOWN] for r in rows])


def render_markdown(r: dict[str, Any]) -> str:
    v = r["verdict"]
    cand = r["candidate"]
    out = [f"# qval: {r['name']} — {v['decision']}", ""]
    if r.get("description"):
        out += [r["description"], ""]
    model = r["model"]
    out += [f"- {reference_text(model)}",
            f"- {candidate_text(cand)}" + ("" if cand["engine"].get("executed", True) else " (NOT EXECUTED here)"),
            f"- {failed_text(v)}"
            + (f", {v['uninformative_checks']} uninformative (the data cannot show a loss there)" if v.get("uninformative_checks") else "")
            + f"; {runtime_text(r)}; created {r['created']}"]
    if snap := snapshot_text(model):
        out.append(f"- {snap}")
    for note in model.get("notes", []):
        out.append(f"- Note: {note}")
    for note in cand["engine"].get("notes", []):  # what the candidate's engine really ran (e.g. emulated GEMMs)
        out.append(f"- Engine: {note}")
    out += ["", "## Checks", "", *checks_table(v["checks"], r.get("error_rates")), ""]
    if "error_rates" in r:  # reports written before the error rates were stated have no such section
        out += [SIZE_NOTE, file_text(r["error_rates"]), ""]
    fails = [c for c in v["checks"] if c["outcome"] == "fail"]
    if fails:
        out += ["Why it was rejected:", ""] + [f"- {c['gate']}: {c['reason']}" for c in fails] + [""]
    blind = [c for c in v["checks"] if c["outcome"] == "uninformative"]
    if blind:
        out += ["Uninformative (not a pass: this data cannot show a loss):", ""] + [f"- {c['gate']}/{c['metric']}: {c['reason']}" for c in blind] + [""]
    for name, g in r["gates"].items():
        # a typed gate's section reads its finished details; an unfinished result (error, non-finite) has only
        # what the gate knew before it stopped: its measurements as they are
        ok = name not in results.TYPES or g["status"] == "ok"
        render = sections.MARKDOWN.get(name, generic_section) if ok else generic_section
        out += [f"## {TITLES.get(name, name)}", ""]
        if g["status"] != "ok":
            out += [f"**{g['status']}**: {g['error']}", ""]
        if g["measurements"]:
            out += render(g) + [""]
    out += diagnostics_markdown(r)
    cal = r.get("calibration")
    if cal:
        out += ["## Calibration", "", calibration_text(cal)]
        if (cal.get("calibration") or {}).get("shortfall"):
            out.append(f"Note: {cal['calibration']['shortfall']}.")
        out.append("")
    out += ["## Stages", "", *table(stage_columns(r["stages"]), stage_rows(r["stages"]))]
    env = r["environment"]
    out += ["", "## Environment", "", versions_text(env), f"device: {env['device']}"]
    if numerics := numerics_line(env.get("determinism")):  # GPU runs only: a CPU report reads as before
        out.append(numerics)
    out.append("")
    return "\n".join(out)

