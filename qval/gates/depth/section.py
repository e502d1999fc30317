"""Gate 1 at depth: report.md's per-bucket table and per-window series, report.html's KLD and top-1 by
depth; both read `DepthDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report import charts
from ...report.formatting import estimate, kld_bound_text
from ...report.html_parts import figure, num, table
from ...report.numbers import fmt
from ...results import parse
from .result import DepthDetails


def markdown(g: dict[str, Any]) -> list[str]:
    d = parse(DepthDetails, g["details"], "report.json's gate depth")
    div, first = d.divergence, d.divergence.first_difference
    lines = [f"Scored {d.scored_positions} positions: {d.chunks} chunks of {d.ctx} tokens of "
             f"{d.dataset}, every position, both models filling their KV caches {d.piece} tokens at a time.",
             "", "The candidate " + ("reproduces the reference at every depth." if first is None
                                     else f"first departs from the reference (KLD > 1e-6) at depth {first}.")]
    if d.shortfall:
        lines.append(f"Note: {d.shortfall}.")
    lines += ["", "| depth | positions | top-1 | mean KLD | p99 KLD | Δp mean | NLL ref / cand |", "|---|---|---|---|---|---|---|"]
    for b in d.buckets:
        lines.append(f"| {b.label} | {b.positions} | {estimate(b.top1)} | {estimate(b.kld.mean)} | {fmt(b.kld.p99)} | "
                     f"{estimate(b.delta_p.mean)} | {fmt(b.nll_ref)} / {fmt(b.nll_cand)} |")
    if div.series:
        lines += ["", f"Per window of {div.window} positions (mean over chunks):", "", "| depth | mean KLD | top-1 |", "|---|---|---|"]
        lines += [f"| {w.start}–{w.end} | {fmt(w.kld)} | {fmt(w.top1)} |" for w in div.series]
    if bound := kld_bound_text(d):
        lines += ["", bound]
    return lines


def html(g: dict[str, Any]) -> str:
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
