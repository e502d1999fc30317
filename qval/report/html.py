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
from typing import Any, Iterable, Sequence

from . import charts
from .markdown import interval, lmeval_rows, reference_text, runtime_text, threshold_text
from .numbers import fmt

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


class Raw(str):
    """Markup qval made itself (a PASS/FAIL badge), put into a cell unescaped."""


def _num(x: Any) -> float | None:
    """A report number (JSON writes NaN/Inf as strings) as a float, or None."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return None


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            raw = v if isinstance(v, Raw) else escape(fmt(v) if not isinstance(v, str) else v)
            cells.append(f'<td class="num">{raw}</td>' if i in numeric else f"<td>{raw}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def figure(svg: str, alt: str, caption: str = "") -> str:
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{charts.data_uri(svg)}" alt="{escape(alt)}" width="{charts.W}">{cap}</figure>'


def _outcome(ok: bool | str) -> Raw:
    if ok == "uninformative":
        return Raw('<span class="note">UNINFORMATIVE</span>')
    return Raw('<span class="pass">PASS</span>' if ok is True or ok == "pass" else '<span class="fail">FAIL</span>')


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
        out.append(f'<div class="verdict {cls}">{escape(v["decision"])} — {v["failed_checks"]} of {len(v["checks"])} checks failed{extra}</div>')
    fb = r.get("fallback")
    if fb:
        cls = "approve" if fb["approved"] else "reject"
        out.append(f'<div class="verdict {cls}" style="font-size:18px">fallback: {escape(fb["explanation"])}</div>')
    model, cand = r.get("model") or {}, r.get("candidate") or {}
    items = [reference_text(model)] if model else []
    if cand:
        items.append(f"Candidate: {cand.get('format')} weights, KV cache {cand.get('kv_cache')}, excluded "
                     f"{', '.join(cand.get('exclude') or []) or 'nothing'}; engine {(cand.get('engine') or {}).get('backend')}")
    items += [f"Note: {n}" for n in model.get("notes", [])]
    if r.get("created"):
        items.append(f"Created {r['created']}" + (f"; {runtime_text(r)}" if r.get("seconds") is not None else ""))
    return "\n".join(out) + "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def checks_section(r: dict[str, Any]) -> str:
    v = r.get("verdict")
    if not v:
        return ""
    rows = []
    for c in v["checks"]:
        rows.append([c["gate"], c["metric"], c["description"], c["value"], interval(c), threshold_text(c), _outcome(c["outcome"]), c["reason"]])
    return "<h2>Checks</h2>" + table(["gate", "metric", "what", "value", "95% interval", "threshold", "outcome", "reason"], rows, [3])


def _measurements(g: dict[str, Any]) -> str:
    rows = [[k, e.get("value"), e.get("stderr"), f"[{fmt(e.get('lo'))}, {fmt(e.get('hi'))}]" if e.get("lo") is not None else "–", e.get("n")]
            for k, e in (g.get("measurements") or {}).items()]
    return table(["figure", "value", "± stderr", "95% interval", "n"], rows, [1, 2, 4]) if rows else ""


def agreement_plots(g: dict[str, Any]) -> str:
    h = (g.get("details") or {}).get("kld_histogram") or {}
    if not h.get("edges"):
        return '<p class="note">No KLD histogram (no positive KLD values).</p>'
    svg = charts.histogram_chart(h["edges"], h["counts"], "Per-position KLD(ref‖cand)", "KLD, nats (log scale)")
    return figure(svg, "KLD histogram", f"{sum(h['counts'])} positions with KLD > 0; {h.get('zeros', 0)} at exactly 0 are not shown.")


def _window_columns(windows: Any) -> dict[str, list[float | None]]:
    if isinstance(windows, dict):
        return {k: [_num(x) for x in v] for k, v in windows.items() if isinstance(v, list)}
    if isinstance(windows, list) and windows and all(isinstance(w, dict) for w in windows):
        keys = [k for k in windows[0] if k not in ("start", "end")]
        return {k: [_num(w.get(k)) for w in windows] for k in keys}
    return {}


def _family(key: str) -> str:
    return re.sub(r"^(ref_|cand_)?(judge_)?", "", key)


def longgen_plots(g: dict[str, Any]) -> str:
    """Gate 3's per-window series: one chart per figure, the reference and candidate overlaid."""
    windows = (g.get("details") or {}).get("windows")
    cols = _window_columns(windows)
    if not cols:
        return '<p class="note">No per-window series in this gate\'s details.</p>'
    if isinstance(windows, list):
        xs = [(_num(w.get("start")) or 0.0) if "start" in w else float(i) for i, w in enumerate(windows)]
        xlabel = "window start (generated token)"
    else:
        xs, xlabel = [float(i) for i in range(max(len(v) for v in cols.values()))], "window"
    families: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for key, values in cols.items():
        pts = [(x, y) for x, y in zip(xs, values) if y is not None]
        families.setdefault(_family(key), {})[key] = pts
    return "".join(figure(charts.line_chart(series, f"Per-window {fam}", xlabel, fam), f"per-window {fam}")
                   for fam, series in families.items())


def depth_plots(g: dict[str, Any]) -> str:
    """Gate 1 at depth: mean KLD and top-1 per window of depth, and the per-bucket table."""
    d = g.get("details") or {}
    series = (d.get("divergence") or {}).get("series") or []
    if not series:
        return '<p class="note">No per-depth series in this gate\'s details.</p>'
    xs = [_num(w.get("start")) or 0.0 for w in series]
    out = [figure(charts.line_chart({"mean KLD": [(x, _num(w.get("kld"))) for x, w in zip(xs, series)]},
                                    "Mean KLD(ref‖cand) by depth", "position in the context (window start)", "KLD, nats"), "KLD by depth"),
           figure(charts.line_chart({"top-1": [(x, _num(w.get("top1"))) for x, w in zip(xs, series)]},
                                    "Top-1 agreement by depth", "position in the context (window start)", "top-1", include_zero=False),
                  "top-1 by depth")]
    rows = [[b["label"], b["positions"], (b.get("top1") or {}).get("value"), ((b.get("kld") or {}).get("mean") or {}).get("value"),
             (b.get("kld") or {}).get("p99"), ((b.get("delta_p") or {}).get("mean") or {}).get("value")] for b in d.get("buckets", [])]
    out.append(table(["depth", "positions", "top-1", "mean KLD", "p99 KLD", "Δp mean"], rows, [1, 2, 3, 4, 5]))
    return "".join(out)


def retrieval_plots(g: dict[str, Any]) -> str:
    """The retrieval matrix as three heatmaps (length × depth): reference, candidate, difference."""
    d = g.get("details") or {}
    cells, lengths, depths = d.get("cells") or [], d.get("lengths") or [], d.get("depths") or []
    if not cells:
        return '<p class="note">No retrieval cells in this gate\'s details.</p>'

    def grid(key: str) -> list[list[float | None]]:
        at = {(c["length"], c["depth"]): c for c in cells}
        return [[(at[(L, x)][key] / at[(L, x)]["n"]) if at.get((L, x), {}).get("n") else None for x in depths] for L in lengths]

    ref, cand = grid("ref_right"), grid("cand_right")
    diff = [[(c - r) if r is not None and c is not None else None for r, c in zip(rr, cc)] for rr, cc in zip(ref, cand)]
    rows, cols = [str(L) for L in lengths], [f"{x:.0%}" for x in depths]
    out = [figure(charts.heatmap(rows, cols, ref, "Reference accuracy", "needle depth", "context tokens"), "reference accuracy"),
           figure(charts.heatmap(rows, cols, cand, "Candidate accuracy", "needle depth", "context tokens"), "candidate accuracy"),
           figure(charts.heatmap(rows, cols, diff, "Candidate − reference", "needle depth", "context tokens", -1.0, 1.0,
                                 diverging=True), "accuracy difference", "red: the candidate loses trials the reference solves")]
    flips = d.get("flipped") or []
    if flips:
        out.append(table(["length", "depth", "key", "reference answer", "candidate answer", "right"],
                         ([f["length"], f"{f['depth']:.0%}", f["key"], f.get("ref_answer", "–"), f.get("cand_answer", "–"),
                           "reference" if f["ref_right"] else "candidate"] for f in flips)))
    return "".join(out)


def tasks_plots(g: dict[str, Any]) -> str:
    """Gate 4: both accuracies per right/wrong suite with their Wilson intervals, the suites scored
    per document, lm-eval's own figures beside qval's, the flipped items and the largest drops."""
    suites = (g.get("details") or {}).get("suites") or []
    if not suites:
        return '<p class="note">No task suites in this gate\'s details.</p>'
    scores = [s for s in suites if s.get("kind") in ("mean", "loglik")]
    binary = [s for s in suites if s not in scores]
    out = []
    if binary:
        bars = []
        for s in binary:
            dr = s.get("drop") or {}
            for who, key in (("reference", "ref"), ("candidate", "cand")):
                lo, hi = (dr.get(f"{key}_interval") or [None, None])[:2]
                bars.append((f"{s['suite']} · {who}", _num(dr.get(f"{key}_accuracy")), _num(lo), _num(hi)))
        out.append(figure(charts.interval_bars([b for b in bars if b[1] is not None], "Accuracy per suite", "accuracy (Wilson 95% interval)"),
                          "accuracy per suite", f"gate 4 took {fmt(_num(g.get('seconds')))} s; chance per suite: "
                          + ", ".join(f"{s['suite']} {fmt(_num(s.get('chance')))}" for s in binary)))
        out.append(table(["suite", "source", "items", "reference", "candidate", "drop", "upper bound", "detects ≥", "flips (right→wrong)",
                          "McNemar p", "seconds"],
                         ([s["suite"], str(s.get("source", "")), s.get("n"), (s.get("drop") or {}).get("ref_accuracy"),
                           (s.get("drop") or {}).get("cand_accuracy"), (s.get("drop") or {}).get("drop"), (s.get("drop") or {}).get("hi"),
                           (s.get("drop") or {}).get("detectable_drop"),
                           f"{s['counts']['ref_only'] + s['counts']['cand_only']} ({s['counts']['ref_only']})",
                           (s.get("drop") or {}).get("mcnemar_p"), s.get("seconds")] for s in binary), [2, 3, 4, 5, 6, 7, 9, 10]))
    if scores:
        out.append('<p class="note">Suites scored per document: the drop is in the unit named.</p>')
        out.append(table(["suite", "source", "documents", "metric", "reference", "candidate", "drop", "upper bound", "unit", "detects ≥", "seconds"],
                         ([s["suite"], str(s.get("source", "")), s.get("n"), str((s.get("lmeval") or {}).get("key", "–")),
                           (s.get("drop") or {}).get("ref_value"), (s.get("drop") or {}).get("cand_value"), (s.get("drop") or {}).get("drop"),
                           (s.get("drop") or {}).get("hi"), str((s.get("drop") or {}).get("unit", "")),
                           (s.get("drop") or {}).get("detectable_drop"), s.get("seconds")] for s in scores), [2, 4, 5, 6, 7, 9, 10]))
    lm = lmeval_rows(suites)
    if lm:
        out.append('<p class="note">lm-evaluation-harness suites: lm-eval\'s own figure for each model (its results table) '
                   "beside qval's from the paired documents.</p>")
        out.append(table(["suite", "task (output, metric,filter, shots)", "documents", "lm-eval: reference", "qval: reference",
                          "lm-eval: candidate", "qval: candidate", "lm-eval"], lm, [2, 3, 4, 5, 6]))
    flips = [f for s in suites for f in s.get("flipped") or []]
    if flips:
        out.append(table(["suite", "item", "prompt (end)", "expected", "reference answered", "candidate answered", "right"],
                         ([f["suite"], f["id"], str(f.get("excerpt", "")), str(f.get("expected", "")), str(f.get("ref_answer", "–")),
                           str(f.get("cand_answer", "–")), "reference" if f["ref_right"] else "candidate"] for f in flips)))
    drops = [f for s in scores for f in s.get("largest_drops") or []]
    if drops:
        out.append(table(["suite", "item", "text (end)", "expected", "reference", "candidate", "drop"],
                         ([f["suite"], f["id"], str(f.get("excerpt", "")), str(f.get("expected", "")), str(f.get("ref_answer", "–")),
                           str(f.get("cand_answer", "–")), f.get("item_drop")] for f in drops), [6]))
    return "".join(out)


PLOTS = {"agreement": agreement_plots, "longgen": longgen_plots, "depth": depth_plots, "retrieval": retrieval_plots,
         "tasks": tasks_plots}
TITLES = {"agreement": "Gate 1 — logits agreement", "quality": "Gate 2 — perplexity and BLEU",
          "longgen": "Gate 3 — long-generation stability", "depth": "Gate 1 at depth — long context",
          "retrieval": "Retrieval matrix — context length × needle depth", "tasks": "Gate 4 — answers, item by item"}


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


def _layer_index(unit: str) -> float | None:
    m = re.search(r"(\d+)$", unit)
    return float(m.group(1)) if m else None


def by_layer(rows: list[dict[str, Any]], kinds: set[str], column: str, scale: float = 1.0) -> dict[str, list[tuple[float, float]]]:
    """{part: [(layer index, value)]} for rows of the given kinds."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        x, y = _layer_index(row["unit"]), _num(row.get(column))
        if row["kind"] in kinds and x is not None and y is not None:
            series.setdefault(row["part"], []).append((x, y * scale))
    return series


#: (kinds, column, multiplier, log y, title, y label); SQNR alone is drawn without a zero baseline
LAYER_CHARTS = (
    ({"weight"}, "sqnr_db", 1.0, False, "Weight SQNR by layer", "SQNR, dB"),
    ({"weight"}, "scale_max", 1.0, True, "Weight scale (largest amax / maxbound) by layer", "scale"),
    ({"weight"}, "range_use", 1.0, False, "Weight range use (max|w| / amax, mean over channels)", "range use"),
    ({"input", "kv", "attention"}, "scale_max", 1.0, True, "Activation scale (amax / maxbound) by layer", "scale"),
    ({"input", "kv", "attention"}, "clipped", 100.0, False, "Activations clipped (|x| > amax) by layer", "% of values"),
    ({"input", "kv", "attention"}, "outlier_ratio", 1.0, True, "Activation outlier ratio (amax / p99.9|x|) by layer", "ratio"),
    ({"weight", "input", "kv", "attention"}, "flushed", 100.0, False, "Non-zero values flushed to zero by layer", "% of non-zeros"),
)


FLAGGED_SHOWN = 40


def diagnostics_section(r: dict[str, Any]) -> str:
    d = r.get("diagnostics")
    if not d:
        return ""
    rows = d.get("layers") or []
    w = d.get("weights") or {}
    out = ["<h2>Per-layer scale diagnostics</h2>",
           f"<p>{len(rows)} enabled quantizers; activations measured over {d.get('activation_batches')} calibration "
           f"batch(es), {d.get('activation_tokens')} tokens. Effective weight bits over all linear layers: "
           f"{fmt(_num(w.get('effective_bits')))}. Full table: <code>{escape(str(d.get('layers_csv', 'layers.csv')))}</code>.</p>"]
    for kinds, col, scale, log, title, ylabel in LAYER_CHARTS:
        series = by_layer(rows, kinds, col, scale)
        if series:
            svg = charts.line_chart(series, title, "decoder layer", ylabel, log_y=log, include_zero=col != "sqnr_db")
            out.append(figure(svg, title))
    out.append("<h3>Outlier rules</h3><ul>" + "".join(f"<li><b>{escape(x['id'])}</b>: {escape(x['rule'])}</li>"
                                                       for x in d.get("rules", [])) + "</ul>")
    flagged = [x for x in rows if x.get("flags")]
    cols = ["quantizer", "format", "granularity", "sqnr_db", "scale_max", "clipped", "flushed", "range_use", "outlier_ratio", "pqs_spread"]
    if flagged:
        shown = flagged[:FLAGGED_SHOWN]
        more = f", the first {FLAGGED_SHOWN} shown; all in layers.csv" if len(flagged) > FLAGGED_SHOWN else ""
        out.append(f"<h3>Flagged quantizers ({len(flagged)}{more})</h3>")
        out.append(table(cols + ["flags"], ([_cell(x.get(c)) for c in cols] + [x["flags"]] for x in shown), range(3, 10)))
    else:
        out.append("<p>No quantizer breaks an outlier rule.</p>")
    out.append(f"<details><summary>All {len(rows)} quantizers</summary>"
               + table(["unit", "part", "kind"] + cols[1:], ([x["unit"], x["part"], x["kind"]] + [_cell(x.get(c)) for c in cols[1:]] for x in rows), range(5, 12))
               + "</details>")
    out.append(sensitivity_section(d.get("sensitivity")))
    return "\n".join(out)


def _cell(v: Any) -> Any:
    n = _num(v)
    return n if n is not None else v


def sensitivity_section(s: dict[str, Any] | None) -> str:
    if not s:
        return ('<h2>Sensitivity</h2><p class="note">Not ranked for this run: diagnostics.sensitivity is "never", or '
                '"auto" and the candidate passed. <code>qval gate --fallback auto</code> always ranks; <code>qval diagnose</code> ranks unless it is "never".</p>')
    base = s.get("base_kld") or {}
    out = ["<h2>Sensitivity ranking</h2>",
           f"<p>Mean KLD on the slice ({s.get('chunks')} chunk(s) of {s.get('ctx')} tokens, {s.get('positions')} scored positions): "
           f"{fmt(_num(base.get('value')))} ± {fmt(_num(base.get('stderr')))}. Each bar: the KLD removed when that part is kept in "
           "high precision (its quantizers off), with a 95 % interval from the paired per-position differences.</p>"]
    for key, title in (("layers", "per decoder layer"), ("parts", "per projection type (all layers)")):
        entries = s.get(key) or []
        items = [(e["name"], _num((e.get("delta_kld") or {}).get("value")), _num((e.get("delta_kld") or {}).get("stderr")))
                 for e in entries]
        items = [(n, v, e) for n, v, e in items if v is not None]
        if items:
            out.append(figure(charts.ranked_bars(items, f"KLD removed, {title}", "Δ mean KLD, nats"), f"sensitivity {title}"))
        out.append(table(["rank", "part", "quantizers", "Δ KLD", "± stderr", "KLD restored", "recovered", "exclude glob"],
                         ([i + 1, e["name"], e["quantizers"], _num((e.get("delta_kld") or {}).get("value")),
                           _num((e.get("delta_kld") or {}).get("stderr")), _num(e.get("kld_restored")),
                           _num(e.get("recovered")), e.get("exclude")] for i, e in enumerate(entries[:12])), [0, 2, 3, 4, 5, 6]))
    return "\n".join(out)


def fallback_section(r: dict[str, Any]) -> str:
    fb = r.get("fallback")
    if not fb:
        return ""
    out = ["<h2>Fallback search</h2>", f"<p><b>{'APPROVE' if fb['approved'] else 'REJECT'}</b>: {escape(fb['explanation'])}</p>",
           f"<p>Budget: at most {fb['budget']['max_excluded']} part(s) kept in high precision; "
           + (f"effective weight bits ≤ {fmt(fb['budget']['max_effective_bits'])}"
              if fb["budget"].get("max_effective_bits") is not None else "no limit on effective weight bits")
           + f". Config written: <code>{escape(str(fb.get('config_file')))}</code></p>"]
    if fb.get("alphas") and len(fb["alphas"]) > 1:
        out.append(table(["alpha", "candidate", "outcome", "failed checks", "mean KLD"],
                         ([a["alpha"], a["name"], _outcome(a["approved"]), a["failed_checks"], _num(a["mean_kld"])] for a in fb["alphas"]), [0, 3, 4]))
    if fb.get("steps"):
        out.append(table(["step", "kept in high precision", "Δ KLD (slice)", "effective bits", "outcome", "failing checks"],
                         ([s["step"], s["added"], _num((s.get("delta_kld") or {}).get("value")), s["cost"]["effective_bits"],
                           _outcome(s["approved"]), "; ".join(s["failed"]) or "–"] for s in fb["steps"]), [0, 2, 3]))
    return "\n".join(out)


def tail_section(r: dict[str, Any]) -> str:
    out = []
    cal = r.get("calibration")
    if cal:
        c = cal.get("calibration", {})
        out.append(f"<h2>Calibration</h2><p>{c.get('samples_used')} samples × {c.get('seq_len')} tokens from "
                   f"{escape(str(c.get('dataset')))}, {cal.get('quantizers_enabled')} quantizers enabled, {cal.get('calibration_seconds')} s.</p>")
    if r.get("stages"):
        out.append("<h2>Stages</h2>" + table(["stage", "cached", "seconds"],
                                             ([k, "yes" if s.get("cached") else "no", s.get("seconds")] for k, s in r["stages"].items()), [2]))
    env = r.get("environment")
    if env:
        device = env.get("device")
        where = ", ".join(f"{k} {v}" for k, v in device.items()) if isinstance(device, dict) else str(device)
        out.append("<h2>Environment</h2><p>" + escape(", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v))
                   + f"; device: {escape(where)}</p>")
    return "\n".join(out)


def render_html(r: dict[str, Any]) -> str:
    title = f"qval: {r.get('name', '?')} — {(r.get('verdict') or {}).get('decision', 'diagnostics')}"
    body = [header(r), checks_section(r), fallback_section(r), gates_section(r), diagnostics_section(r), tail_section(r)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")
