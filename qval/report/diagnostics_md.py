"""The diagnostics part of report.md: flagged quantizers with the rules they break, the most
sensitive layers, and the fallback outcome. The full table is layers.csv; the plots are in
report.html."""

from __future__ import annotations

from typing import Any

from .formatting import decision
from .numbers import fmt, number

TOP = 8


def diagnostics_markdown(r: dict[str, Any]) -> list[str]:
    d = r.get("diagnostics")
    out: list[str] = []
    if d:
        rows = d.get("layers") or []
        flagged = [x for x in rows if x.get("flags")]
        out += ["## Per-layer scale diagnostics", "",
                f"{len(rows)} enabled quantizers, activations over {d.get('activation_batches')} calibration batch(es) "
                f"({d.get('activation_tokens')} tokens); effective weight bits {fmt(number((d.get('weights') or {}).get('effective_bits')))}. "
                f"Every figure per quantizer: `{d.get('layers_csv', 'layers.csv')}`; plots: report.html.", "", "Outlier rules:", ""]
        out += [f"- `{x['id']}`: {x['rule']}" for x in d.get("rules", [])]
        out.append("")
        if flagged:
            out += [f"{len(flagged)} quantizer(s) break a rule" + (f" (first {TOP} shown)" if len(flagged) > TOP else "") + ":", "",
                    "| quantizer | format | SQNR dB | clipped | flushed | range use | outlier ratio | rules |", "|---|---|---|---|---|---|---|---|"]
            out += [f"| {x['quantizer']} | {x['format']} | {fmt(number(x['sqnr_db']))} | {fmt(number(x['clipped']))} | {fmt(number(x['flushed']))} | "
                    f"{fmt(number(x['range_use']))} | {fmt(number(x['outlier_ratio']))} | {x['flags']} |" for x in flagged[:TOP]]
        else:
            out.append("No quantizer breaks an outlier rule.")
        out.append("")
        s = d.get("sensitivity")
        if s:
            base = s.get("base_kld") or {}
            out += ["## Sensitivity", "",
                    f"Mean KLD on the slice ({s.get('positions')} positions): {fmt(number(base.get('value')))}. "
                    "KLD removed when one decoder layer is kept in high precision, largest first:", "",
                    "| rank | layer | Δ KLD | ± stderr | recovered | exclude glob |", "|---|---|---|---|---|---|"]
            for i, e in enumerate(s.get("layers", [])[:TOP]):
                dk = e.get("delta_kld") or {}
                out.append(f"| {i + 1} | {e['name']} | {fmt(number(dk.get('value')))} | {fmt(number(dk.get('stderr')))} | "
                           f"{fmt(number(e.get('recovered')))} | `{e['exclude']}` |")
            out.append("")
    fb = r.get("fallback")
    if fb:
        out += ["## Fallback", "", f"**{decision(fb['approved'])}**: {fb['explanation']}", ""]
        for st in fb.get("steps", []):
            out.append(f"- step {st['step']}: keep {st['added']} in high precision → {decision(st['approved'])} "
                       f"(effective weight bits {fmt(st['cost']['effective_bits'])}; run {st.get('run_dir', '?')})")
        if fb.get("config_file"):
            out += ["", f"Config: `{fb['config_file']}`"]
        out.append("")
    return out
