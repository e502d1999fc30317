"""The diagnostics part of report.html: the per-layer scale charts and tables, the flagged
quantizers with the written outlier rules, the sensitivity ranking and the fallback search."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from . import charts
from .formatting import decision
from .html_parts import badge, figure, num, table
from .numbers import fmt


def _layer_index(unit: str) -> float | None:
    m = re.search(r"(\d+)$", unit)
    return float(m.group(1)) if m else None


def by_layer(rows: list[dict[str, Any]], kinds: set[str], column: str, scale: float = 1.0) -> dict[str, list[tuple[float, float]]]:
    """{part: [(layer index, value)]} for rows of the given kinds."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        x, y = _layer_index(row["unit"]), num(row.get(column))
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
           f"{fmt(num(w.get('effective_bits')))}. Full table: <code>{escape(str(d.get('layers_csv', 'layers.csv')))}</code>.</p>"]
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
    n = num(v)
    return n if n is not None else v


def sensitivity_section(s: dict[str, Any] | None) -> str:
    if not s:
        return ('<h2>Sensitivity</h2><p class="note">Not ranked for this run: diagnostics.sensitivity is "never", or '
                '"auto" and the candidate passed. <code>qval gate --fallback auto</code> always ranks; <code>qval diagnose</code> ranks unless it is "never".</p>')
    base = s.get("base_kld") or {}
    out = ["<h2>Sensitivity ranking</h2>",
           f"<p>Mean KLD on the slice ({s.get('chunks')} chunk(s) of {s.get('ctx')} tokens, {s.get('positions')} scored positions): "
           f"{fmt(num(base.get('value')))} ± {fmt(num(base.get('stderr')))}. Each bar: the KLD removed when that part is kept in "
           "high precision (its quantizers off), with a 95 % interval from the paired per-position differences.</p>"]
    for key, title in (("layers", "per decoder layer"), ("parts", "per projection type (all layers)")):
        entries = s.get(key) or []
        items = [(e["name"], num((e.get("delta_kld") or {}).get("value")), num((e.get("delta_kld") or {}).get("stderr")))
                 for e in entries]
        items = [(n, v, e) for n, v, e in items if v is not None]
        if items:
            out.append(figure(charts.ranked_bars(items, f"KLD removed, {title}", "Δ mean KLD, nats"), f"sensitivity {title}"))
        out.append(table(["rank", "part", "quantizers", "Δ KLD", "± stderr", "KLD restored", "recovered", "exclude glob"],
                         ([i + 1, e["name"], e["quantizers"], num((e.get("delta_kld") or {}).get("value")),
                           num((e.get("delta_kld") or {}).get("stderr")), num(e.get("kld_restored")),
                           num(e.get("recovered")), e.get("exclude")] for i, e in enumerate(entries[:12])), [0, 2, 3, 4, 5, 6]))
    return "\n".join(out)


def fallback_section(r: dict[str, Any]) -> str:
    fb = r.get("fallback")
    if not fb:
        return ""
    out = ["<h2>Fallback search</h2>", f"<p><b>{decision(fb['approved'])}</b>: {escape(fb['explanation'])}</p>",
           f"<p>Budget: at most {fb['budget']['max_excluded']} part(s) kept in high precision; "
           + (f"effective weight bits ≤ {fmt(fb['budget']['max_effective_bits'])}"
              if fb["budget"].get("max_effective_bits") is not None else "no limit on effective weight bits")
           + f". Config written: <code>{escape(str(fb.get('config_file')))}</code></p>"]
    if fb.get("alphas") and len(fb["alphas"]) > 1:
        out.append(table(["alpha", "candidate", "outcome", "failed checks", "mean KLD"],
                         ([a["alpha"], a["name"], badge(a["approved"]), a["failed_checks"], num(a["mean_kld"])] for a in fb["alphas"]), [0, 3, 4]))
    if fb.get("steps"):
        out.append(table(["step", "kept in high precision", "Δ KLD (slice)", "effective bits", "outcome", "failing checks"],
                         ([s["step"], s["added"], num((s.get("delta_kld") or {}).get("value")), s["cost"]["effective_bits"],
                           badge(s["approved"]), "; ".join(s["failed"]) or "–"] for s in fb["steps"]), [0, 2, 3]))
    return "\n".join(out)


