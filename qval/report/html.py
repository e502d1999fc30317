"""report.html: the sign-off as one self-contained page (no scripts, no network, images inlined).

The verdict comes first, then every check in one table, then each gate's evidence with its
plots (each gate's own: its package's `section.py`; the KLD histogram, gate 3's per-window drift, …), the per-layer scale diagnostics (SQNR, scale,
clip rate, outlier ratio by layer; flagged quantizers and the written outlier rules), the
sensitivity ranking and the fallback search. Charts are SVG (see charts.py) embedded as
data-URI <img>, so the file can be mailed or archived and still shows everything. Every part
tolerates missing data: a report of a run that stopped early still renders.
"""

from __future__ import annotations

from html import escape
from typing import Any

from ..gate_registry import DECLARED
from .diagnostics_html import diagnostics_section, fallback_section
from .formatting import (CHECK_COLUMNS, calibration_text, candidate_text, check_rows, failed_text, interval, reference_text,
                         runtime_text, snapshot_text, stage_columns, stage_rows, versions_text)
from .measured_error_rates import SIZE_COLUMN, SIZE_NOTE, file_text, size_cell
from .html_parts import badge, table
from . import sections

CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#222;line-height:1.4}
h1{margin-bottom:4px} h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.verdict{font-size:28px;font-weight:bold;padding:14px 18px;border-radius:6px;color:#fff;margin:12px 0}
.approve{background:#2e7d32} .reject{background:#c62828} .info{background:#546e7a}
table{border-collapse:collapse;margin:8px 0;font-size:13px} th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#2e7d32;font-weight:bold} .fail{color:#c62828;font-weight:bold}
figure{margin:12px 0} figcaption{font-size:12px;color:#555}
.note{color:#555;font-size:13px} code{background:#f4f4f4;padding:0 3px}
"""


def header(r: dict[str, Any]) -> str:
    v = r.get("verdict")
    out = [f"<h1>qval: {escape(str(r.get('name', '?')))}</h1>"]
    if r.get("description"):
        out.append(f"<p>{escape(r['description'])}</p>")
    if v is None:
        out.append('<div class="verdict info">DIAGNOSTICS ONLY — no gate ran; this page is not a sign-off</div>')
    else:
        cls = "approve" if v["approved"] else "reject"
        extra = f'; {v["uninformative_checks"]} uninformative' if v.get("uninformative_checks") else ""
        out.append(f'<div class="verdict {cls}">{escape(v["decision"])} — {failed_text(v)}{extra}</div>')
    fb = r.get("fallback")
    if fb:
        cls = "approve" if fb["approved"] else "reject"
        out.append(f'<div class="verdict {cls}" style="font-size:18px">fallback: {escape(fb["explanation"])}</div>')
    model, cand = r.get("model") or {}, r.get("candidate") or {}
    items = [reference_text(model)] if model else []
    if model and (snap := snapshot_text(model)):
        items.append(snap)
    if cand:
        items.append(candidate_text(cand))
    items += [f"Note: {n}" for n in model.get("notes", [])]
    if r.get("created"):
        items.append(f"Created {r['created']}" + (f"; {runtime_text(r)}" if r.get("seconds") is not None else ""))
    return "\n".join(out) + "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def checks_section(r: dict[str, Any]) -> str:
    v = r.get("verdict")
    if not v:
        return ""
    rates = r.get("error_rates")
    rows = [row[:6] + [badge(row[6])] + row[7:] + [size_cell(c, rates)] for row, c in zip(check_rows(v["checks"]), v["checks"])]
    out = "<h2>Checks</h2>" + table((*CHECK_COLUMNS, SIZE_COLUMN), rows, [CHECK_COLUMNS.index("value")])
    if rates is not None:  # reports written before the error rates were stated have none
        out += f'<p class="note">{escape(SIZE_NOTE)} {escape(file_text(rates))}</p>'
    return out


def _measurements(g: dict[str, Any]) -> str:
    rows = [[k, e.get("value"), e.get("stderr"), interval(e), e.get("n")]
            for k, e in (g.get("measurements") or {}).items()]
    return table(["figure", "value", "± stderr", "95% interval", "n"], rows, [1, 2, 4]) if rows else ""


#: each gate's heading in report.html (qval.gate_registry: report.md's, or its `html_title`)
TITLES = {d.name: d.html_title or d.title for d in DECLARED.ordered()}


def gates_section(r: dict[str, Any]) -> str:
    out = []
    for name, g in (r.get("gates") or {}).items():
        out.append(f"<h2>{escape(TITLES.get(name, name))}</h2>")
        if g.get("status") != "ok":
            out.append(f'<p class="fail">{escape(str(g.get("status")))}: {escape(str(g.get("error")))}</p>')
        out.append(_measurements(g))
        if name in sections.HTML:
            out.append(sections.HTML[name](g))
    return "\n".join(out)


def tail_section(r: dict[str, Any]) -> str:
    out = []
    cal = r.get("calibration")
    if cal:
        out.append(f"<h2>Calibration</h2><p>{escape(calibration_text(cal))}</p>")
    if r.get("stages"):
        out.append("<h2>Stages</h2>" + table(stage_columns(r["stages"]), stage_rows(r["stages"]), [2]))
    env = r.get("environment")
    if env:
        device = env.get("device")
        where = ", ".join(f"{k} {v}" for k, v in device.items()) if isinstance(device, dict) else str(device)
        out.append("<h2>Environment</h2><p>" + escape(versions_text(env))
                   + f"; device: {escape(where)}</p>")
    return "\n".join(out)


def render_html(r: dict[str, Any]) -> str:
    title = f"qval: {r.get('name', '?')} — {(r.get('verdict') or {}).get('decision', 'diagnostics')}"
    body = [header(r), checks_section(r), fallback_section(r), gates_section(r), diagnostics_section(r), tail_section(r)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")
