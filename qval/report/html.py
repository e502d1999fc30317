"""report.html: the sign-off as one self-contained page (no scripts, no network, images inlined).

The verdict comes first, then every check in one table, then each gate's evidence with its
plots (KLD histogram, gate 3's per-window drift), the per-layer scale diagnostics (SQNR, scale,
clip rate, outlier ratio by layer; flagged quantizers and the written outlier rules), the
sensitivity ranking and the fallback search. Charts are SVG (see charts.py) embedded as
data-URI <img>, so the file can be mailed or archived and still shows everything. Every part
tolerates missing data: a report of a run that stopped early still renders.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from pydantic import TypeAdapter

from . import charts
from . import formatting
from .diagnostics_html import diagnostics_section, fallback_section
from .formatting import (CHECK_COLUMNS, DROP_COLUMNS, FLIP_COLUMNS, LMEVAL_COLUMNS, LMEVAL_NOTE, answer_text, calibration_text, candidate_text,
                         check_rows, failed_text, interval, lmeval_rows, reference_text, right, runtime_text, snapshot_text,
                         stage_columns, stage_rows, versions_text)
from .error_rates import SIZE_COLUMN, SIZE_NOTE, file_text, size_cell
from .html_parts import badge, figure, num, table
from .numbers import fmt
from ..results import AgreementDetails, DepthDetails, RetrievalDetails, parse
from ..results.retrieval import NonInferiority
from ..results.tasks import ScoreDrop, TasksDetails
from ..results.longgen import LonggenWindow

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


def agreement_plots(g: dict[str, Any]) -> str:
    h = parse(AgreementDetails, g["details"], "report.json's gate agreement").kld_histogram if g.get("status") == "ok" else None
    if h is None or not h.edges:
        return '<p class="note">No KLD histogram (no positive KLD values).</p>'
    svg = charts.histogram_chart(h.edges, h.counts, "Per-position KLD(ref‖cand)", "KLD, nats (log scale)")
    return figure(svg, "KLD histogram", f"{sum(h.counts)} positions with KLD > 0; {h.zeros} at exactly 0 are not shown.")


def _family(key: str) -> str:
    return re.sub(r"^(ref_|cand_)?(judge_)?", "", key)


_WINDOWS = TypeAdapter(list[LonggenWindow])


def longgen_plots(g: dict[str, Any]) -> str:
    """Gate 3's per-window series: one chart per figure, the reference and candidate overlaid. It reads
    the windows alone (report.md reads the rest of the gate's type), each window through its type."""
    raw = (g.get("details") or {}).get("windows")
    if not raw:
        return '<p class="note">No per-window series in this gate\'s details.</p>'
    windows = parse(_WINDOWS, raw, "report.json's gate longgen (its windows)")
    xs, xlabel = [float(w.start) for w in windows], "window start (generated token)"
    families: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for key in (k for k in LonggenWindow.model_fields if k not in ("start", "end")):
        pts = [(x, float(y)) for x, y in zip(xs, (getattr(w, key) for w in windows)) if y is not None]
        families.setdefault(_family(key), {})[key] = pts
    return "".join(figure(charts.line_chart(series, f"Per-window {fam}", xlabel, fam), f"per-window {fam}")
                   for fam, series in families.items())


def depth_plots(g: dict[str, Any]) -> str:
    """Gate 1 at depth: mean KLD and top-1 per window of depth, and the per-bucket table."""
    d = parse(DepthDetails, g["details"], "report.json's gate depth") if g.get("status") == "ok" else None
    if d is None or not d.divergence.series:
        return '<p class="note">No per-depth series in this gate\'s details.</p>'
    series = d.divergence.series
    xs = [float(w.start) for w in series]
    out = [figure(charts.line_chart({"mean KLD": [(x, num(w.kld)) for x, w in zip(xs, series)]},
                                    "Mean KLD(ref‖cand) by depth", "position in the context (window start)", "KLD, nats"), "KLD by depth"),
           figure(charts.line_chart({"top-1": [(x, num(w.top1)) for x, w in zip(xs, series)]},
                                    "Top-1 agreement by depth", "position in the context (window start)", "top-1", include_zero=False),
                  "top-1 by depth")]
    rows = [[b.label, b.positions, b.top1.get("value"), b.kld.mean.get("value"), b.kld.p99, b.delta_p.mean.get("value")]
            for b in d.buckets]
    out.append(table(["depth", "positions", "top-1", "mean KLD", "p99 KLD", "Δp mean"], rows, [1, 2, 3, 4, 5]))
    return "".join(out)


def retrieval_plots(g: dict[str, Any]) -> str:
    """The retrieval matrix as three heatmaps (length × depth): reference, candidate, difference."""
    d = parse(RetrievalDetails, g["details"], "report.json's gate retrieval") if g.get("status") == "ok" else None
    if d is None or not d.cells:
        return '<p class="note">No retrieval cells in this gate\'s details.</p>'
    at = {(c.length, c.depth): c for c in d.cells}

    def grid(side: str) -> list[list[float | None]]:
        return [[getattr(at[(L, x)], side) / at[(L, x)].n if (L, x) in at and at[(L, x)].n else None for x in d.depths]
                for L in d.lengths]

    ref, cand = grid("ref_right"), grid("cand_right")
    diff = [[(c - r) if r is not None and c is not None else None for r, c in zip(rr, cc)] for rr, cc in zip(ref, cand)]
    rows, cols = [str(L) for L in d.lengths], [f"{x:.0%}" for x in d.depths]
    out = [figure(charts.heatmap(rows, cols, ref, "Reference accuracy", "needle depth", "context tokens"), "reference accuracy"),
           figure(charts.heatmap(rows, cols, cand, "Candidate accuracy", "needle depth", "context tokens"), "candidate accuracy"),
           figure(charts.heatmap(rows, cols, diff, "Candidate − reference", "needle depth", "context tokens", -1.0, 1.0,
                                 diverging=True), "accuracy difference", "red: the candidate loses trials the reference solves")]
    if d.flipped:
        out.append(table(["length", "depth", "key", "reference answer", "candidate answer", "right"],
                         ([f.length, f"{f.depth:.0%}", f.key, answer_text(f.ref_answer), answer_text(f.cand_answer), right(f.ref_right)]
                          for f in d.flipped)))
    return "".join(out)


def tasks_plots(g: dict[str, Any]) -> str:
    """Gate 4: both accuracies per right/wrong suite with their Wilson intervals, the suites scored
    per document, lm-eval's own figures beside qval's, the flipped items and the largest drops."""
    d = parse(TasksDetails, g["details"], "report.json's gate tasks") if g.get("status") == "ok" else None
    if d is None or not d.suites:
        return '<p class="note">No task suites in this gate\'s details.</p>'
    binary, scores = d.split()
    out = []
    if binary:
        drops = [s.drop for s in binary]
        assert all(isinstance(dr, NonInferiority) for dr in drops)  # a right/wrong suite's figures (Suite's validator)
        bars = []
        for s, dr in zip(binary, drops):
            for who, acc, (lo, hi) in (("reference", dr.ref_accuracy, dr.ref_interval[:2]),
                                       ("candidate", dr.cand_accuracy, dr.cand_interval[:2])):
                bars.append((f"{s.suite} · {who}", num(acc), num(lo), num(hi)))
        out.append(figure(charts.interval_bars([b for b in bars if b[1] is not None], "Accuracy per suite", "accuracy (Wilson 95% interval)"),
                          "accuracy per suite", f"gate 4 took {fmt(num(g.get('seconds')))} s; chance per suite: "
                          + ", ".join(f"{s.suite} {fmt(num(s.chance))}" for s in binary)))
        out.append(table(["suite", "source", "items", "reference", "candidate", "drop", "upper bound", "detects ≥", "flips (right→wrong)",
                          "McNemar p", "seconds"],
                         ([s.suite, s.source, s.n, dr.ref_accuracy, dr.cand_accuracy, dr.drop, dr.hi, dr.detectable_drop,
                           f"{s.counts.ref_only + s.counts.cand_only} ({s.counts.ref_only})" if s.counts else "–",
                           dr.mcnemar_p, s.seconds] for s, dr in zip(binary, drops) if isinstance(dr, NonInferiority)),
                         [2, 3, 4, 5, 6, 7, 9, 10]))
    if scores:
        out.append('<p class="note">Suites scored per document: the drop is in the unit named.</p>')
        out.append(table(["suite", "source", "documents", "metric", "reference", "candidate", "drop", "upper bound", "unit", "detects ≥", "seconds"],
                         ([s.suite, s.source, s.n, s.lmeval.key if s.lmeval else "–", sd.ref_value, sd.cand_value, sd.drop, sd.hi, sd.unit,
                           sd.detectable_drop, s.seconds] for s in scores if isinstance(sd := s.drop, ScoreDrop)), [2, 4, 5, 6, 7, 9, 10]))
    lm = lmeval_rows(d.suites)
    if lm:
        out.append(f'<p class="note">{LMEVAL_NOTE}.</p>')
        out.append(table(LMEVAL_COLUMNS, lm, [2, 3, 4, 5, 6]))
    flips = [f for s in d.suites for f in s.flipped]
    if flips:
        out.append(table(FLIP_COLUMNS, ([f.suite, f.id, f.excerpt or "", f.expected or "", answer_text(f.ref_answer),
                                        answer_text(f.cand_answer), right(bool(f.ref_right))] for f in flips)))
    largest = [f for s in scores for f in s.largest_drops or []]
    if largest:
        out.append(table(DROP_COLUMNS, ([f.suite, f.id, f.excerpt or "", f.expected or "", answer_text(f.ref_answer),
                           answer_text(f.cand_answer), f.item_drop] for f in largest), [6]))
    return "".join(out)


PLOTS = {"agreement": agreement_plots, "longgen": longgen_plots, "depth": depth_plots, "retrieval": retrieval_plots,
         "tasks": tasks_plots}
#: report.html has always headed gate 2 without "/chrF"; kept so that the page stays byte-identical
TITLES = {**formatting.TITLES, "quality": "Gate 2 — perplexity and BLEU"}


def gates_section(r: dict[str, Any]) -> str:
    out = []
    for name, g in (r.get("gates") or {}).items():
        out.append(f"<h2>{escape(TITLES.get(name, name))}</h2>")
        if g.get("status") != "ok":
            out.append(f'<p class="fail">{escape(str(g.get("status")))}: {escape(str(g.get("error")))}</p>')
        out.append(_measurements(g))
        if name in PLOTS:
            out.append(PLOTS[name](g))
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
