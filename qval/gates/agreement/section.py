"""Gate 1 — logits agreement: report.md's table of top-1, KLD and Δp figures (and the KLD bound of a
compact reference), report.html's KLD histogram; both read `AgreementDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report.formatting import estimate, kld_bound_text
from ...report.html_parts import figure
from ...report import charts
from ...report.numbers import fmt
from ...results import parse
from .result import AgreementDetails


def markdown(g: dict[str, Any]) -> list[str]:
    d, m = parse(AgreementDetails, g["details"], "report.json's gate agreement"), g["measurements"]
    lines = [f"Scored {d.scored_positions} positions: {d.chunks} chunks of {d.ctx} tokens, "
             f"second half of each ({d.dataset})."]
    if d.shortfall:
        lines.append(f"Note: {d.shortfall}.")
    kld, dp = d.kld, d.delta_p
    lines += ["", "| figure | value |", "|---|---|",
              f"| top-1 agreement | {estimate(m.get('top1'))} |",
              f"| KLD mean | {estimate(kld.mean)} |"]
    for k, x in (("median", kld.median), ("p90", kld.p90), ("p99", kld.p99), ("p99.9", kld.p99_9), ("max", kld.max)):
        lines.append(f"| KLD {k} | {fmt(x)} |")
    lines += [f"| Δp mean | {estimate(dp.mean)} |", f"| Δp RMS | {fmt(dp.rms)} |",
              f"| Δp p1 / p99 | {fmt(dp.p1)} / {fmt(dp.p99)} |"]
    if bound := kld_bound_text(d):
        lines += ["", bound]
    return lines


def html(g: dict[str, Any]) -> str:
    h = parse(AgreementDetails, g["details"], "report.json's gate agreement").kld_histogram if g.get("status") == "ok" else None
    if h is None or not h.edges:
        return '<p class="note">No KLD histogram (no positive KLD values).</p>'
    svg = charts.histogram_chart(h.edges, h.counts, "Per-position KLD(ref‖cand)", "KLD, nats (log scale)")
    return figure(svg, "KLD histogram", f"{sum(h.counts)} positions with KLD > 0; {h.zeros} at exactly 0 are not shown.")
