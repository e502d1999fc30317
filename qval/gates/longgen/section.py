"""Gate 3 — long generation: report.md's figures, per-window and per-prompt tables, report.html's
per-window series; both read `LonggenDetails` (report.html its windows alone).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter

from ...report import charts
from ...report.formatting import estimate, interval
from ...report.html_parts import figure
from ...report.numbers import fmt
from ...results import parse
from .result import LonggenDetails, LonggenWindow


def markdown(g: dict[str, Any]) -> list[str]:
    d, m = parse(LonggenDetails, g["details"], "report.json's gate longgen"), g["measurements"]
    lines = [f"{d.prompts} prompts ({d.rendering}), {d.new_tokens} new tokens each, greedy, EOS "
             f"{'suppressed' if d.suppress_eos else 'allowed'}; windows of {d.window}, early = first "
             f"{d.edge}, late = last {d.edge} positions. The candidate scored the reference's continuation "
             f"through its KV cache ({d.piece} tokens per piece). Reference generations "
             f"{'from the shared cache' if d.reference_generation.get('cached') else 'generated in this run and cached'}.", "",
             "| figure | value | 95% interval |", "|---|---|---|"]
    for key, label in (("early_top1", "top-1, early"), ("late_top1", "top-1, late"), ("top1_drift", "top-1 drift (early − late)"),
                       ("early_kld", "mean KLD, early"), ("late_kld", "mean KLD, late"), ("late_drift", "KLD drift (late − early)"),
                       ("seq_rep4_excess", "late seq-rep-4, cand − ref"), ("judge_nll_excess", "late judge NLL, cand − ref"),
                       ("loops_excess", "prompts ending in a loop, cand − ref"), ("premature_eos_excess", "early EOS stops, cand − ref"),
                       ("tf_late_seq_rep4", "late seq-rep-4 of the teacher-forced text (the reference's own)")):
        if key in m:
            lines.append(f"| {label} | {estimate(m[key])} | {interval(m[key])} |")
    lines += ["", f"Loops (period ≤ {d.loop_max_period} through the last {d.loop_span} tokens): reference "
              f"{d.ref_loops}, candidate {d.cand_loops} of {d.prompts} prompts.", "",
              "| window | top-1 | KLD | seq-rep-4 ref / cand | distinct-2 ref / cand | NLL ref / judge cand | loops ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for w in d.windows:
        lines.append(f"| {w.start}–{w.end} | {fmt(w.top1)} | {fmt(w.kld)} | {fmt(w.ref_seq_rep4)} / {fmt(w.cand_seq_rep4)} | "
                     f"{fmt(w.ref_distinct2)} / {fmt(w.cand_distinct2)} | {fmt(w.ref_nll)} / {fmt(w.cand_judge_nll)} | "
                     f"{w.ref_loops} / {w.cand_loops} |")
    lines += ["", "| prompt | lang | kind | first divergence | late KLD | late seq-rep-4 ref / cand | loop period ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for p in d.per_prompt:
        lines.append(f"| {p.id} | {p.lang or '–'} | {p.kind or '–'} | {fmt(p.first_divergence)} | {fmt(p.late_kld)} | "
                     f"{fmt(p.ref_late_seq_rep4)} / {fmt(p.cand_late_seq_rep4)} | {fmt(p.ref_loop_period)} / {fmt(p.cand_loop_period)} |")
    return lines


def _family(key: str) -> str:
    return re.sub(r"^(ref_|cand_)?(judge_)?", "", key)


_WINDOWS = TypeAdapter(list[LonggenWindow])


def html(g: dict[str, Any]) -> str:
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
